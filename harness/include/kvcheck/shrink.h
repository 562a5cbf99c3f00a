// The shrinker: makes a failing trace short and plain, whichever engine or
// search found it. It works on operations, not bytes: it drops chunks of
// operations, drops everything after the failing step, simplifies the
// geometry of every cache of the trace at once (a trace has one), and
// simplifies each operation (smaller caches, token counts toward a power
// of two, fewer layers, fewer ids, shorter prompts), keeping every change
// under which the same property still fails (or the failure ShrinkOptions::keeps).
//
//   auto oracle = [&](const Trace& t) { return execute(t, *make_engine()).failure; };
//   ShrinkResult small = shrink(trace, failure, oracle);
#pragma once

#include "kvcheck/executor.h"
#include "kvcheck/trace.h"

#include <functional>
#include <optional>

namespace kvcheck {

// Runs a candidate trace; returns its failure, if any.
using Oracle = std::function<std::optional<Failure>(const Trace&)>;

struct ShrinkOptions {
    std::size_t runs_max = 5000;  // oracle calls at most
    // The engine's declared model (kvcheck/domain.h): a cache of it stays
    // one when shrunk (its layers kept, their tokens shrunk together, at
    // least 1, its geometry, dtypes and layouts the model's). Undeclared:
    // anything simpler goes.
    ModelDomain model;
    // Which failures of a candidate count as the failure being shrunk;
    // unset: any failure of the same property. A search that tells
    // failures apart by their message's shape (kvcheck/search.h,
    // failure_shape) keeps that shape, so that one failure does not shrink
    // into another it already reported.
    std::function<bool(const Failure&)> keeps;
};

struct ShrinkResult {
    Trace trace;
    Failure failure;
    std::size_t runs = 0;
};

ShrinkResult shrink(const Trace& trace, const Failure& failure, const Oracle& oracle,
                    const ShrinkOptions& options = {});

}  // namespace kvcheck
