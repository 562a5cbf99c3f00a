// Ctrl-C during a run. The first SIGINT, SIGTERM or SIGHUP sets a flag that
// the run's loops read: they stop their children (each in a process group
// of its own, so the terminal's signal reached only kvcheck), write the
// results so far marked incomplete, and exit 128 + the signal. A second one
// ends kvcheck at once (the children die with it). A signal that was
// ignored when kvcheck started (nohup, a background job) stays ignored.
#pragma once

#include "signal_name.h"

#include <string>

namespace kvcheck::cli {

void install_interrupt_handlers();
// The signal that interrupted the run, or 0.
int interrupted_by();

using posix::signal_name;

}  // namespace kvcheck::cli
