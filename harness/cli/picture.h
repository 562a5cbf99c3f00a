// The step-by-step picture of a failing trace (kvcheck run --report html):
// what the engine holds after each step, as the checks read it. The shrunk
// trace is replayed once per step on a fresh engine, its first k+1
// operations checked as a run checks them (every entry read after every
// step, so that the failure comes at the step reported), and then the
// engine is read: each stored entry and each live handle (its layers x
// tokens, dtype, layout, owned marker and storage identities). Boxes whose
// storages intersect share storage: the report draws them linked.
//
// The replays run in a sandboxed child like any engine code (a crash
// leaves a picture with an error, never takes kvcheck down).
//
//   std::optional<FailurePicture> picture = picture_failure(adapter, report, options);
#pragma once

#include "conformance.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck::cli {

// A stored entry or a live handle after a step.
struct BoxPicture {
    bool entry = true;       // else a handle
    std::string name;        // the entry's id, or "h2"
    std::size_t layers = 0;
    std::string tokens;      // "5", or per layer "5 3" when they differ; "0" for none
    std::string dtype;       // of the first slot holding tokens; "" when none does
    std::string layout;      // "modern" or "legacy"
    bool owned = false;      // the owned-copy marker as the engine reports it
    std::vector<std::uint64_t> storage;  // storage identities (none without the capability)
    std::string error;       // the engine could not be read ("" when it could)

    bool shares_storage_with(const BoxPicture& other) const;
};

struct StepPicture {
    std::string op;  // the operation, as a trace line
    std::vector<BoxPicture> boxes;  // entries in the store's order, then handles by name
};

struct FailurePicture {
    std::vector<StepPicture> steps;  // up to the failing step, included
    std::optional<std::size_t> failing_step;  // nullopt: the replays did not fail
    std::string message;             // the failure the replay found (its check's message)
    std::string error;               // why the picture is cut short ("" when whole)
};

// The picture of one failure of `property` (a trace, no fault); nullopt
// for one that has none (a fault, an engine-error group, no trace).
std::optional<FailurePicture> picture_failure(const Adapter& adapter, const std::string& property,
                                              const FailureReport& failure, const ConformanceOptions& options);

}  // namespace kvcheck::cli
