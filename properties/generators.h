// RapidCheck generators the property suites share.
#pragma once

#include "kvcheck/workload.h"

#include <rapidcheck.h>

namespace kvcheck::props {

inline Dtype any_dtype() { return *rc::gen::element(Dtype::f32, Dtype::f16, Dtype::bf16); }

// A random cache spec of any layout and layer shape, as the workload makes
// them, in `dtype`.
inline CacheSpec any_spec(Dtype dtype) {
    SeededChooser choose(*rc::gen::arbitrary<std::uint64_t>());
    WorkloadOptions options;
    Swarm swarm = uniform_swarm(options);
    swarm.dtype = dtype;
    return random_cache_spec(choose, swarm, options);
}

inline CacheSpec any_spec() { return any_spec(any_dtype()); }

}  // namespace kvcheck::props
