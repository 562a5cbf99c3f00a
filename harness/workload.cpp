#include "kvcheck/workload.h"

#include <iterator>
#include <map>
#include <optional>
#include <string>

namespace kvcheck {
namespace {

template <typename T>
constexpr std::size_t kind() {
    return op_kind<T>();
}

// A rough model of the trace being built: enough to aim operations at ids
// and handles that exist, with the layout they have, so that few
// operations are skipped when run. Missing ids and empty handles still
// come up, on purpose, a fraction of the time.
struct Draft {
    std::map<std::string, Layout> stored;  // ids added and not deleted, as far as the draft knows
    std::vector<std::int64_t> handles;     // handles that likely hold a cache
    std::vector<Layout> layouts;           // their layouts
    std::int64_t next_handle = 1;
};

std::string pick_id(Chooser& choose, const Draft& draft, const WorkloadOptions& options) {
    if (!draft.stored.empty() && !choose.one_in(5)) {
        auto at = draft.stored.begin();
        std::advance(at, static_cast<std::ptrdiff_t>(choose.below(draft.stored.size())));
        return at->first;
    }
    return std::string(1, static_cast<char>('a' + choose.below(static_cast<std::uint64_t>(options.id_pool))));
}

Ids pick_ids(Chooser& choose, const Draft& draft, const WorkloadOptions& options, std::int64_t low, std::int64_t high) {
    Ids ids;
    const std::int64_t count = choose.between(low, high);
    for (std::int64_t i = 0; i < count; ++i) ids.push_back(pick_id(choose, draft, options));
    return ids;
}

HandleName pick_handle(Chooser& choose, const Draft& draft) {
    if (draft.handles.empty() || choose.one_in(16)) return {0};
    return {draft.handles[choose.below(draft.handles.size())]};
}

// A handle of the given layout when the draft has one.
HandleName pick_handle_of(Chooser& choose, const Draft& draft, Layout layout) {
    std::vector<std::int64_t> matching;
    for (std::size_t i = 0; i < draft.handles.size(); ++i) {
        if (draft.layouts[i] == layout) matching.push_back(draft.handles[i]);
    }
    if (matching.empty()) return pick_handle(choose, draft);
    return {matching[choose.below(matching.size())]};
}

Layout layout_of(const Draft& draft, HandleName handle) {
    for (std::size_t i = 0; i < draft.handles.size(); ++i) {
        if (draft.handles[i] == handle.value) return draft.layouts[i];
    }
    return Layout::modern;
}

HandleName new_handle(Draft& draft, std::optional<Layout> layout) {
    const std::int64_t handle = draft.next_handle++;
    if (layout) {
        draft.handles.push_back(handle);
        draft.layouts.push_back(*layout);
    }
    return {handle};
}

// The layout get_cache gives for these ids, or nullopt when none is stored.
std::optional<Layout> merged_layout(const Draft& draft, const Ids& ids) {
    std::optional<Layout> layout;
    std::size_t found = 0;
    for (const std::string& id : ids) {
        const auto at = draft.stored.find(id);
        if (at == draft.stored.end()) continue;
        ++found;
        layout = (found == 1 || layout == at->second) ? at->second : Layout::modern;
    }
    return layout;
}

Tokens pick_prompt(Chooser& choose, const WorkloadOptions& options) {
    Tokens prompt;
    const std::int64_t count = choose.between(1, options.prompt_tokens_max);
    for (std::int64_t i = 0; i < count; ++i) prompt.push_back(choose.between(1, 31));
    return prompt;
}

Layout pick_layout(Chooser& choose, const Swarm& swarm) {
    if (swarm.modern && swarm.legacy) return choose.one_in(2) ? Layout::modern : Layout::legacy;
    return swarm.legacy ? Layout::legacy : Layout::modern;
}

}  // namespace

std::uint64_t SeededChooser::below(std::uint64_t n) {
    // splitmix64: a tiny, well-mixed stream; the same seed gives the same
    // choices on every platform.
    std::uint64_t x = (state_ += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return n <= 1 ? 0 : x % n;
}

Swarm uniform_swarm(const WorkloadOptions& options) {
    Swarm swarm;
    swarm.weights.fill(2);
    swarm.legacy = options.capabilities.legacy_layout;
    const Capabilities& c = options.capabilities;
    if (!c.dump) {
        swarm.weights[kind<op::Dump>()] = 0;
        swarm.weights[kind<op::Load>()] = 0;
        swarm.weights[kind<op::Corrupt>()] = 0;
    }
    if (!c.dump || !c.dump_crash) swarm.weights[kind<op::DumpCrash>()] = 0;
    if (!c.generate_stream) swarm.weights[kind<op::GenerateStream>()] = 0;
    if (!c.conversions || !c.legacy_layout) {
        swarm.weights[kind<op::ToLegacy>()] = 0;
        swarm.weights[kind<op::FromLegacy>()] = 0;
    }
    swarm.weights[kind<op::Add>()] = 6;  // a store needs content to be interesting
    swarm.weights[kind<op::GetCache>()] = 4;
    swarm.weights[kind<op::Generate>()] = 3;
    return swarm;
}

Swarm random_swarm(Chooser& choose, const WorkloadOptions& options) {
    Swarm swarm = uniform_swarm(options);
    for (std::size_t kind_index = 0; kind_index < op_kind_count; ++kind_index) {
        std::uint8_t& weight = swarm.weights[kind_index];
        if (weight == 0) continue;  // not supported by the engine
        weight = choose.one_in(4) ? 0 : static_cast<std::uint8_t>(choose.between(1, 6));
    }
    // A trace without caches in the store exercises nothing.
    swarm.weights[kind<op::Add>()] = static_cast<std::uint8_t>(choose.between(3, 8));
    const Capabilities& c = options.capabilities;
    switch (choose.below(c.half_dtypes ? 4 : 1)) {
        case 0: case 1: swarm.dtype = Dtype::f32; break;
        case 2: swarm.dtype = Dtype::f16; break;
        default: swarm.dtype = Dtype::bf16; break;
    }
    if (c.legacy_layout) {
        const std::uint64_t layouts = choose.below(4);
        swarm.modern = layouts != 0;
        swarm.legacy = layouts != 1;
    } else {
        swarm.modern = true;
        swarm.legacy = false;
    }
    swarm.odd_layers = !choose.one_in(3);
    return swarm;
}

CacheSpec random_cache_spec(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options) {
    const Capabilities& c = options.capabilities;
    CacheSpec spec;
    spec.layout = pick_layout(choose, swarm);
    spec.dtype = swarm.dtype;
    spec.seed = choose.below(1000);
    const std::int64_t layers = choose.one_in(6) ? 0 : choose.between(1, options.cache_layers_max);
    for (std::int64_t i = 0; i < layers; ++i) {
        LayerSpec layer;
        layer.tokens = choose.one_in(6) ? 0 : choose.between(1, options.layer_tokens_max);
        if (spec.layout == Layout::modern && swarm.odd_layers && choose.one_in(2)) {
            std::uint8_t slots = 0;
            switch (choose.below(6)) {
                case 0: slots = 0b0001; break;  // keys only
                case 1: slots = 0b0010; break;  // values only
                case 2: slots = 0b1100; break;  // legacy-named slots only
                case 3: slots = 0b0000; break;  // a bare layer
                default: slots = 0b1111; break;  // both names: the layout-selection bugs need them
            }
            const bool one_sided = slots == 0b0001 || slots == 0b0010;
            if ((one_sided && !c.one_sided_layers) || ((slots & 0b1100) && !c.legacy_slot_names)) slots = 0b0011;
            layer.slots = slots;
            layer.initialized = !(c.uninitialized_layers && choose.one_in(3));
        }
        spec.layers.push_back(layer);
    }
    return spec;
}

Trace generate_trace(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options) {
    unsigned total = 0;
    for (std::uint8_t weight : swarm.weights) total += weight;
    Trace trace;
    if (total == 0) return trace;
    Draft draft;
    const std::size_t length = static_cast<std::size_t>(choose.between(1, static_cast<std::int64_t>(options.trace_ops_max)));
    // Some operations call for a follow-up, as they do in real use: a crash
    // is followed by a restart that loads, a copy by a generation from it.
    std::optional<Op> follow_up;
    while (trace.size() < length) {
        if (follow_up) {
            trace.push_back(std::move(*follow_up));
            follow_up.reset();
            continue;
        }
        std::uint64_t pick = choose.below(total);
        std::size_t kind_index = 0;
        while (pick >= swarm.weights[kind_index]) pick -= swarm.weights[kind_index++];
        // Slot 0 most of the time: dumps, crashes and loads meet on it.
        const auto slot = [&] { return choose.one_in(4) ? choose.below(static_cast<std::uint64_t>(options.dump_slots)) : 0; };
        Op op;
        switch (kind_index) {
            case kind<op::Add>(): {
                std::string id = pick_id(choose, draft, options);
                CacheSpec spec = random_cache_spec(choose, swarm, options);
                draft.stored[id] = spec.layout;
                op = op::Add{id, spec};
                break;
            }
            case kind<op::AddHandle>(): {
                std::string id = pick_id(choose, draft, options);
                HandleName handle = pick_handle(choose, draft);
                draft.stored[id] = layout_of(draft, handle);
                op = op::AddHandle{id, handle};
                break;
            }
            case kind<op::Get>(): {
                std::string id = pick_id(choose, draft, options);
                op = op::Get{new_handle(draft, merged_layout(draft, {id})), id};
                break;
            }
            case kind<op::GetByIds>(): op = op::GetByIds{pick_ids(choose, draft, options, 0, 3)}; break;
            case kind<op::GetAll>(): op = op::GetAll{}; break;
            case kind<op::GetCache>(): {
                Ids ids = pick_ids(choose, draft, options, 1, 3);
                op = op::GetCache{new_handle(draft, merged_layout(draft, ids)), ids};
                if (swarm.weights[kind<op::Generate>()] != 0 && choose.one_in(3)) {
                    follow_up = op::Generate{std::get<op::GetCache>(op).out, pick_prompt(choose, options),
                                             choose.between(1, options.new_tokens_max)};
                }
                break;
            }
            case kind<op::Generate>(): {
                HandleName source = pick_handle(choose, draft);
                Tokens prompt = pick_prompt(choose, options);
                op = op::Generate{source, prompt, choose.between(1, options.new_tokens_max)};
                break;
            }
            case kind<op::GenerateStream>(): {
                HandleName source = pick_handle(choose, draft);
                Tokens prompt = pick_prompt(choose, options);
                op = op::GenerateStream{source, prompt, choose.between(1, options.new_tokens_max)};
                break;
            }
            case kind<op::Delete>(): {
                Ids ids = pick_ids(choose, draft, options, 1, 2);
                for (const std::string& id : ids) draft.stored.erase(id);
                op = op::Delete{ids};
                break;
            }
            case kind<op::DeleteAll>(): draft.stored.clear(); op = op::DeleteAll{}; break;
            case kind<op::Dump>(): op = op::Dump{static_cast<std::int64_t>(slot())}; break;
            case kind<op::DumpCrash>(): {
                const auto at = static_cast<std::int64_t>(slot());
                // A dump of a small store is a few KiB: most crashes land inside it.
                op = op::DumpCrash{at, static_cast<std::int64_t>(choose.below(choose.one_in(4) ? 40000 : 4000))};
                if (swarm.weights[kind<op::Load>()] != 0 && choose.one_in(2)) follow_up = op::Load{at};
                break;
            }
            case kind<op::Load>(): op = op::Load{static_cast<std::int64_t>(slot())}; break;
            case kind<op::Corrupt>(): {
                const auto at = static_cast<std::int64_t>(slot());
                const auto offset = static_cast<std::int64_t>(choose.below(1 << 20));
                op = op::Corrupt{at, offset, choose.one_in(4) ? 1 : 0};
                if (swarm.weights[kind<op::Load>()] != 0 && choose.one_in(2)) follow_up = op::Load{at};
                break;
            }
            case kind<op::Make>(): {
                CacheSpec spec = random_cache_spec(choose, swarm, options);
                op = op::Make{new_handle(draft, spec.layout), spec};
                break;
            }
            case kind<op::Clone>(): {
                HandleName source = pick_handle(choose, draft);
                op = op::Clone{new_handle(draft, layout_of(draft, source)), source};
                break;
            }
            case kind<op::Concat>(): {
                HandleNames parts;
                const std::int64_t count = choose.between(2, 3);
                for (std::int64_t i = 0; i < count; ++i) parts.push_back(pick_handle(choose, draft));
                op = op::Concat{new_handle(draft, Layout::modern), parts};
                break;
            }
            case kind<op::ToLegacy>(): {
                HandleName source = pick_handle_of(choose, draft, Layout::modern);
                op = op::ToLegacy{new_handle(draft, Layout::legacy), source};
                break;
            }
            default: {
                HandleName source = pick_handle_of(choose, draft, Layout::legacy);
                op = op::FromLegacy{new_handle(draft, Layout::modern), source};
                break;
            }
        }
        trace.push_back(std::move(op));
    }
    return trace;
}

Trace trace_for_seed(std::uint64_t seed, const WorkloadOptions& options) {
    SeededChooser choose(seed);
    const Swarm swarm = random_swarm(choose, options);
    return generate_trace(choose, swarm, options);
}

}  // namespace kvcheck
