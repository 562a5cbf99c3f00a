// The workloads of the trace targets: how choices become a trace. The
// targets decode inputs with them, and kvcheck_fuzz_seeds records seeded
// runs of them as byte seeds.
#pragma once

#include "kvcheck/trace.h"
#include "kvcheck/workload.h"

namespace kvcheck::fuzz {

// fuzz_ops: a random swarm, then a trace from it (kvcheck::trace_for_seed's
// workload, driven by other choices).
WorkloadOptions ops_workload();
Trace ops_trace(Chooser& choose, const WorkloadOptions& options);

// fuzz_layout: a random swarm of the layout operations only (make, add,
// add_handle, get_cache, clone, concat, to_legacy, from_legacy, dump,
// load), some caches always made; shorter traces of larger caches.
WorkloadOptions layout_workload();
Trace layout_trace(Chooser& choose, const WorkloadOptions& options);

}  // namespace kvcheck::fuzz
