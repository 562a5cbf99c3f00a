#include "generators.h"

#include <array>

namespace kvcheck::fuzz {
namespace {

template <typename T>
constexpr std::size_t kind() {
    return op_kind<T>();
}

}  // namespace

WorkloadOptions ops_workload() { return {}; }

Trace ops_trace(Chooser& choose, const WorkloadOptions& options) {
    const Swarm swarm = random_swarm(choose, options);
    return generate_trace(choose, swarm, options);
}

WorkloadOptions layout_workload() {
    WorkloadOptions options;
    options.trace_ops_max = 12;
    options.cache_layers_max = 4;
    options.layer_tokens_max = 6;
    return options;
}

Trace layout_trace(Chooser& choose, const WorkloadOptions& options) {
    Swarm swarm = random_swarm(choose, options);
    constexpr std::array<std::size_t, 10> layout_kinds{
        kind<op::Add>(),  kind<op::AddHandle>(), kind<op::GetCache>(), kind<op::Dump>(),     kind<op::Load>(),
        kind<op::Make>(), kind<op::Clone>(),     kind<op::Concat>(),   kind<op::ToLegacy>(), kind<op::FromLegacy>()};
    for (std::size_t k = 0; k < op_kind_count; ++k) {
        bool wanted = false;
        for (std::size_t layout_kind : layout_kinds) wanted = wanted || layout_kind == k;
        if (!wanted) swarm.weights[k] = 0;
    }
    swarm.weights[kind<op::Make>()] = static_cast<std::uint8_t>(choose.between(3, 8));
    return generate_trace(choose, swarm, options);
}

}  // namespace kvcheck::fuzz
