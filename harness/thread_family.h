// The thread level's cache families (harness/threads.cpp), shared with the
// free-running stress driver (harness/stress.cpp): each family's calls, as
// a lane makes them, and what is judged at a quiescent point and at the
// end. One home for the calls and the checks: the stress run is judged by
// these, not by a copy.
#pragma once

#include "kvcheck/threads.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace kvcheck::threads_detail {

class Scheduler;  // threads.cpp's token passing; none in a stress run
struct Shared;

// The calls of one cache family as the lanes make them, and what is judged
// at each quiescent point. Lane-private state is kept per lane (a lane
// only ever touches its own); what the lanes share is guarded by the
// family itself, so that lanes may also call with no schedule control (a
// stress run): call and responded may run on several threads at once,
// quiescent and ended on one thread with no call running.
class Family {
  public:
    virtual ~Family() = default;
    // Runs one call of `lane` (its invocation is history line `invoked`):
    // its answer, or nothing when it was not applicable. May throw.
    virtual std::optional<std::string> call(std::size_t lane, const Op& operation, std::size_t invoked) = 0;
    // May the engine refuse this call (throw without it being an error)?
    virtual bool may_refuse(const Op& operation) const = 0;
    // `lane`'s call returned; its answer is history line `responded`.
    virtual void responded(std::size_t /*lane*/, std::size_t /*responded*/) {}
    // No lane is inside a call: judge the engine's state (no lane runs meanwhile).
    virtual void quiescent(Shared& shared, const std::string& after) = 0;
    // Every lane has ended (the hooks unset): what is judged last.
    virtual void ended(Shared& /*shared*/) {}
};

// What the lane threads share. Only the thread holding the token touches
// it; the scheduler's mutex orders one holder's writes before the next's reads.
struct Shared {
    Engine& engine;
    Family& family;
    Scheduler* scheduler = nullptr;
    std::int64_t in_call = 0;
    bool checking = false;  // a quiescent check reads the engine: no lane runs meanwhile
    ThreadRunResult result;
};

// The family the plan calls (any paged request: the paged family; else the
// store's). std::invalid_argument when the engine cannot run it at the
// thread level (not thread_safe, not of the family, a bounded store).
std::unique_ptr<Family> family_for(Engine& engine, const LanePlan& plan);

// One call through the family: its answer ("refused: ..." when the engine
// may refuse it and threw), or `error` when the engine threw otherwise.
// std::invalid_argument (a request the family does not run) goes through.
struct CallOutcome {
    std::optional<std::string> answer;
    std::optional<std::string> error;
};
CallOutcome call_family(Family& family, std::size_t lane, const Op& operation, std::size_t invoked);

}  // namespace kvcheck::threads_detail
