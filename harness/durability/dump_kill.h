// dump-safe tested from outside the engine. The dump runs in a child
// process forked from this one (for an engine in an adapter process, a copy
// of that process: DumpInCopy), so the child holds the engine exactly as it
// is, with the dump shim (dumpshim.h) armed on the dump directory:
//   1. once to its end, recorded: every power cut right after it returned
//      must leave the new dump (durable when dump returns);
//   2. once more from the same directory, killed with SIGKILL just before
//      counted call `point mod N` (N: the counted calls of the first run):
//      the directory as the kill left it, and every state a power cut at
//      that moment may leave, must hold the previous dump or the new one.
// Each state is written to a scratch directory and loaded by a fresh
// engine (made by the factory) in another child process; a failed load is
// repeated on a fresh engine that first loaded the complete dump, whose
// store must then be unchanged; and a temporary file of the dump (a name
// it created that a complete dump does not leave) must be gone once the
// load has run. Nothing depends on timing: the kill points are counted
// calls, and the only clock is a generous limit on a silent child.
//
//   KillTest test{engine, fresh_engine, slots.dir(0), 5, slot, temporaries, audit.snapshot()};
//   KillOutcome outcome = run_kill_test(test);   // outcome.fact goes to dump-safe
#pragma once

#include "auditor/auditor.h"
#include "checkers/checker.h"
#include "kvcheck/engine.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvcheck::durability {

struct KillOptions {
    double child_seconds_max = 600;  // a child silent and still this long (process/stillness.h) is killed and reported hung
    std::size_t prefixes_max = 8;    // prefixes of the pending name changes tried (power_cut.h)
};

struct KillTest {
    Engine& engine;  // in this process: the children are forks of it
    const std::function<std::shared_ptr<Engine>()>& fresh;
    std::string dir;     // the dump directory (made when missing)
    std::int64_t point;  // the kill point, taken modulo the counted calls of a complete dump
    const DumpSlot& slot;  // what the directory may hold before the dump
    const std::vector<std::string>& temporaries;  // what killed dumps left there before
    const Snapshot& store; // the store being dumped
    KillOptions options = {};
};

struct KillOutcome {
    checkers::DumpKilled fact;
    bool killed = false;                     // the directory holds what the kill left (else: the complete dump)
    std::vector<std::string> temporaries;    // temporaries of the dump still in the directory
};

// An engine whose store lives in another process (an adapter process,
// docs/durability.md "Engines that run as programs of their own"): a fork
// of kvcheck's process would not hold it, so its dump runs in a copy of
// that process instead, with the dump shim preloaded there and armed in
// the copy. run_kill_test asks an engine for this interface
// (dynamic_cast); every other engine's dump runs in a fork of this process.
class DumpInCopy {
  public:
    struct End {
        int status = 0;     // the copy's wait status (SIGKILL: killed by the shim at its kill point)
        std::string error;  // what the dump threw (the copy then exited with status 3)
    };
    // Dumps the store into `dir` in a copy of the engine's process, the
    // shim armed on `dir`, recording to the file `log_path` and killing the
    // copy just before counted call `kill_at` (-1: none). The engine's own
    // store is untouched. Throws std::runtime_error when no copy could run.
    virtual End dump_in_copy(const std::string& dir, const std::string& log_path, std::int64_t kill_at) = 0;

  protected:
    ~DumpInCopy() = default;
};

// Throws std::runtime_error when the dump threw or crashed in its child,
// when a fresh engine crashed or hung loading a state, or when the shim
// does not see this process's calls.
KillOutcome run_kill_test(const KillTest& test);

// Whether this process's calls reach the dump shim (it must come before
// libc in the lookup scope: kvcheck_harness links it for that).
bool shim_interposes();

// The file of the dump shim this process has loaded, for LD_PRELOAD into an
// adapter process (it works from the build tree and from an installed
// kvcheck alike: wherever the loader found it). Empty, with the reason in
// `why_not`, when it cannot be preloaded.
std::string shim_library_path(std::string& why_not);

}  // namespace kvcheck::durability
