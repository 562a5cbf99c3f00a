// When an engine is hung: the rule behind every "no progress" limit (a
// sandboxed job's --timeout, an adapter's handshake), docs/semantics.md
// "Limits". Load is not a hang: the time an engine's processes spent
// waiting for a CPU that the machine gave to other processes does not
// count against it; the time they ran, or sat blocked (on a lock, a pipe,
// a sleep), does.
//
// The engine's process tree is sampled now and then (sample_processes):
// the CPU time all its threads used (utime + stime, from /proc) and whether
// any thread was waiting on the machine (runnable, state R, or in an
// uninterruptible wait, D) at that instant. Between two samples, `wall`
// seconds apart with `cpu` seconds used,
//
//   still += waiting ? min(cpu, wall) : wall
//
// so a busy loop counts all its time (its CPU, capped at the wall time so
// that several threads count no faster than the clock), a deadlock counts
// all its time (every thread blocked), and an engine starved by load
// counts only the CPU it got. A tree that stays `hang_wall_factor` times
// the limit without progress is hung however the time went: a thread stuck
// in the kernel (D) cannot wait forever.
//
//   Stillness still;
//   still.restart(sample_processes(tree, now));        // at each progress
//   still.observe(sample_processes(tree, later));      // at each poll
//   if (still.hung(30)) kill(...);
#pragma once

#include <vector>

namespace kvcheck::process {

// The wall time a job may go without progress, however its time went, as
// a multiple of its limit: the machine loaded to this many times its cores
// still leaves a correct engine its full limit of CPU.
inline constexpr double hang_wall_factor = 20;

struct ActivitySample {
    double wall_seconds = 0;  // monotonic clock
    double cpu_seconds = 0;   // CPU time of the processes sampled, every thread
    bool waiting = false;     // some thread runnable (R) or in an uninterruptible wait (D)
};

class Stillness {
  public:
    // Progress at `sample`: the count starts again from it.
    void restart(const ActivitySample& sample);
    // The processes as sampled later (samples in time order).
    void observe(const ActivitySample& sample);
    // Seconds the engine stood still since the last progress (the rule above).
    double still_seconds() const { return still_; }
    // Wall seconds since the last progress (up to the last sample).
    double silent_seconds() const { return last_.wall_seconds - since_; }
    // Stood still for `limit_seconds`, or silent for hang_wall_factor times it.
    bool hung(double limit_seconds) const;

  private:
    ActivitySample last_;
    double since_ = 0;
    double still_ = 0;
};

// The CPU time and thread states of the processes `pids` (those gone are
// left out), at monotonic time `now_seconds`.
ActivitySample sample_processes(const std::vector<int>& pids, double now_seconds);

// `pid` and every process below it (its children, theirs, ... as
// /proc/<pid>/task/<tid>/children lists them; bounded depth).
std::vector<int> process_tree(int pid);

}  // namespace kvcheck::process
