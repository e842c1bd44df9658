// Graceful stop on SIGUSR1 / SIGTERM (a scheduler's warning before preemption, e.g. SLURM's --signal=USR1@120,
// or mpirun forwarding a kill): the handler only records the signal; the trainer checks after every step, agrees
// across ranks, saves a checkpoint (with --save_dir) and exits 128 + the signal, so the job can be resumed from
// exactly there. A second signal ends the process at once (the default action), so a run stuck inside a step
// can still be killed without SIGKILL.
#pragma once

namespace zerorun {

void install_stop_handler();
// The signal received since install (0 if none).
int stop_signal();

}  // namespace zerorun
