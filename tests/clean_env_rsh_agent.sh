#!/bin/sh
# Test helper: stands in for ssh as OpenMPI's plm_rsh_agent, as ssh does: the remote command starts with a fresh
# environment (only PATH and HOME), so a variable reaches a "remote" rank only if the launcher forwards it.
# Called as "agent [-o OPT | -p PORT]... HOST COMMAND..."; records its options and HOST in $ZR_AGENT_LOG (whose
# name it is told through its own first -o ZrLog=FILE option, since its environment is not the test's).
log=
while [ $# -gt 0 ]; do
  case "$1" in
    -o) case "$2" in ZrLog=*) log=${2#ZrLog=} ;; esac; [ -n "$log" ] && echo "opt -o $2" >>"$log"; shift 2 ;;
    -p) [ -n "$log" ] && echo "opt -p $2" >>"$log"; shift 2 ;;
    *) break ;;
  esac
done
[ -n "$log" ] && echo "host $1" >>"$log"
shift
exec env -i PATH="$PATH" HOME="$HOME" sh -c "$*"
