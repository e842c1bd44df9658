#!/bin/sh
# Test helper: stands in for ssh as OpenMPI's plm_rsh_agent, so a hostfile of
# two made-up host names exercises mpirun's remote-launch path on this one
# machine. Called as "agent HOST COMMAND..."; records HOST, runs COMMAND here.
[ -n "$ZR_AGENT_LOG" ] && echo "$1" >>"$ZR_AGENT_LOG"
shift
exec sh -c "$*"
