// The property suites' use of the one search path (kvcheck/search.h): run a
// trace on a bundled adapter, find a failure by seeded search and shrink it,
// and name the command that replays it.
#pragma once

#include "bundled.h"
#include "kvcheck/search.h"

#include <optional>
#include <string>

namespace kvcheck::props {

// Runs `trace` on a fresh engine of `adapter`.
RunResult run_on(const Adapter& adapter, const Trace& trace, PropertySet properties = PropertySet::all());

// Searches up to traces_max traces of `seed` (kvcheck::trace_seed(seed, 0,
// i), as kvcheck run --seed searches its first property) for a failing
// trace on `adapter`, then shrinks it. A declared `model` is searched
// instead of the one the engine declares (kvcheck run --model).
std::optional<Finding> find_and_shrink(const Adapter& adapter, std::uint64_t seed, std::size_t traces_max,
                                       const WorkloadOptions& options, PropertySet properties = PropertySet::all(),
                                       const ModelDomain& model = {});

// The command that replays a failure of `adapter`. The trace is written to
// the build tree's kvcheck-traces/ (KVCHECK_TRACE_DIR), named after its
// content, where it stays for whoever reads the test's output.
std::string reproduce_command(const Adapter& adapter, const Trace& trace);

}  // namespace kvcheck::props
