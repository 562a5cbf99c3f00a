#include "kvcheck/workload.h"

#include "kvcheck/splitmix.h"

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

// A splitmix64 stream: the same seed gives the same choices on every platform.
std::uint64_t SeededChooser::below(std::uint64_t n) {
    const std::uint64_t x = splitmix64(state_);
    state_ += splitmix64_increment;
    return n <= 1 ? 0 : x % n;
}

Swarm uniform_swarm(const WorkloadOptions& options) {
    Swarm swarm;
    swarm.weights.fill(2);
    swarm.legacy = options.capabilities.legacy_layout;
    swarm.weights[kind<op::Add>()] = 6;  // a store needs content to be interesting
    swarm.weights[kind<op::DumpKill>()] = 1;  // three processes each: a few per trace find what they find
    swarm.weights[kind<op::GetCache>()] = 4;
    swarm.weights[kind<op::Generate>()] = 3;
    // An operation the engine cannot run is never generated.
    for (std::size_t kind_index = 0; kind_index < op_kind_count; ++kind_index) {
        if (!engine_supports(options.capabilities, op_needs(kind_index))) swarm.weights[kind_index] = 0;
    }
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
    // Three processes each (a complete dump, a killed one, the loads), and
    // the bugs it finds show at most kill points: a quarter of the swarms
    // draw it, at the lowest weight (no extra choice: the draw above decides).
    std::uint8_t& kill = swarm.weights[kind<op::DumpKill>()];
    kill = (kill == 1 || kill == 2) ? 1 : 0;
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

namespace {

// What drawing one operation sees: the choices, the draft of the trace so
// far, and what the operation may ask to come right after it.
struct Drawing {
    Chooser& choose;
    Draft& draft;
    const Swarm& swarm;
    const WorkloadOptions& options;
    std::optional<Op>& follow_up;

    bool enabled(std::size_t kind_index) const { return swarm.weights[kind_index] != 0; }
    // Slot 0 most of the time: dumps, crashes and loads meet on it.
    std::int64_t slot() { return choose.one_in(4) ? static_cast<std::int64_t>(choose.below(static_cast<std::uint64_t>(options.dump_slots))) : 0; }
    std::string id() { return pick_id(choose, draft, options); }
};

// One draw per operation type, chosen by overload: an operation added to
// the variant without one does not compile (draw_kind below).
op::Add draw(Drawing& d, op::Add*) {
    std::string id = d.id();
    CacheSpec spec = random_cache_spec(d.choose, d.swarm, d.options);
    d.draft.stored[id] = spec.layout;
    return {id, spec};
}

op::AddHandle draw(Drawing& d, op::AddHandle*) {
    std::string id = d.id();
    HandleName handle = pick_handle(d.choose, d.draft);
    d.draft.stored[id] = layout_of(d.draft, handle);
    return {id, handle};
}

op::Get draw(Drawing& d, op::Get*) {
    std::string id = d.id();
    return {new_handle(d.draft, merged_layout(d.draft, {id})), id};
}

op::GetByIds draw(Drawing& d, op::GetByIds*) { return {pick_ids(d.choose, d.draft, d.options, 0, 3)}; }

op::GetAll draw(Drawing&, op::GetAll*) { return {}; }

op::GetCache draw(Drawing& d, op::GetCache*) {
    Ids ids = pick_ids(d.choose, d.draft, d.options, 1, 3);
    op::GetCache get{new_handle(d.draft, merged_layout(d.draft, ids)), ids};
    // A copy is followed by a generation from it, as in real use.
    if (d.enabled(kind<op::Generate>()) && d.choose.one_in(3)) {
        d.follow_up = op::Generate{get.out, pick_prompt(d.choose, d.options), d.choose.between(1, d.options.new_tokens_max)};
    }
    return get;
}

template <typename G>
G draw_generation(Drawing& d) {
    HandleName source = pick_handle(d.choose, d.draft);
    Tokens prompt = pick_prompt(d.choose, d.options);
    return G{source, prompt, d.choose.between(1, d.options.new_tokens_max)};
}

op::Generate draw(Drawing& d, op::Generate*) { return draw_generation<op::Generate>(d); }

op::GenerateStream draw(Drawing& d, op::GenerateStream*) { return draw_generation<op::GenerateStream>(d); }

op::Delete draw(Drawing& d, op::Delete*) {
    Ids ids = pick_ids(d.choose, d.draft, d.options, 1, 2);
    for (const std::string& id : ids) d.draft.stored.erase(id);
    return {ids};
}

op::DeleteAll draw(Drawing& d, op::DeleteAll*) {
    d.draft.stored.clear();
    return {};
}

op::Dump draw(Drawing& d, op::Dump*) { return {d.slot()}; }

op::DumpCrash draw(Drawing& d, op::DumpCrash*) {
    const std::int64_t at = d.slot();
    // A dump of a small store is a few KiB: most crashes land inside it.
    op::DumpCrash crash{at, static_cast<std::int64_t>(d.choose.below(d.choose.one_in(4) ? 40000 : 4000))};
    // A crash is followed by a restart that loads.
    if (d.enabled(kind<op::Load>()) && d.choose.one_in(2)) d.follow_up = op::Load{at};
    return crash;
}

op::Load draw(Drawing& d, op::Load*) { return {d.slot()}; }

op::DumpKill draw(Drawing& d, op::DumpKill*) {
    // The point is taken modulo the dump's counted calls: any value reaches each.
    op::DumpKill kill{d.slot(), static_cast<std::int64_t>(d.choose.below(1 << 16))};
    // What the kill left is loaded in a fresh process; a load here reads it in this one.
    if (d.enabled(kind<op::Load>()) && d.choose.one_in(2)) d.follow_up = op::Load{kill.slot};
    return kill;
}

op::Corrupt draw(Drawing& d, op::Corrupt*) {
    const std::int64_t at = d.slot();
    const auto offset = static_cast<std::int64_t>(d.choose.below(1 << 20));
    op::Corrupt corrupt{at, offset, d.choose.one_in(4) ? 1 : 0};
    if (d.enabled(kind<op::Load>()) && d.choose.one_in(2)) d.follow_up = op::Load{at};
    return corrupt;
}

op::Make draw(Drawing& d, op::Make*) {
    CacheSpec spec = random_cache_spec(d.choose, d.swarm, d.options);
    return {new_handle(d.draft, spec.layout), spec};
}

op::Clone draw(Drawing& d, op::Clone*) {
    HandleName source = pick_handle(d.choose, d.draft);
    return {new_handle(d.draft, layout_of(d.draft, source)), source};
}

op::Concat draw(Drawing& d, op::Concat*) {
    HandleNames parts;
    const std::int64_t count = d.choose.between(2, 3);
    for (std::int64_t i = 0; i < count; ++i) parts.push_back(pick_handle(d.choose, d.draft));
    return {new_handle(d.draft, Layout::modern), parts};
}

op::ToLegacy draw(Drawing& d, op::ToLegacy*) {
    HandleName source = pick_handle_of(d.choose, d.draft, Layout::modern);
    return {new_handle(d.draft, Layout::legacy), source};
}

op::FromLegacy draw(Drawing& d, op::FromLegacy*) {
    HandleName source = pick_handle_of(d.choose, d.draft, Layout::legacy);
    return {new_handle(d.draft, Layout::modern), source};
}

template <std::size_t K>
Op draw_kind(Drawing& d) {
    using T = std::variant_alternative_t<K, Op>;
    return Op(std::in_place_index<K>, draw(d, static_cast<T*>(nullptr)));
}

template <std::size_t... K>
constexpr std::array<Op (*)(Drawing&), op_kind_count> draw_table(std::index_sequence<K...>) {
    return {&draw_kind<K>...};
}

constexpr std::array<Op (*)(Drawing&), op_kind_count> draws = draw_table(std::make_index_sequence<op_kind_count>{});

}  // namespace

Trace generate_trace(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options) {
    unsigned total = 0;
    for (std::uint8_t weight : swarm.weights) total += weight;
    Trace trace;
    if (total == 0) return trace;
    Draft draft;
    const std::size_t length = static_cast<std::size_t>(choose.between(1, static_cast<std::int64_t>(options.trace_ops_max)));
    std::optional<Op> follow_up;
    Drawing drawing{choose, draft, swarm, options, follow_up};
    while (trace.size() < length) {
        if (follow_up) {
            trace.push_back(std::move(*follow_up));
            follow_up.reset();
            continue;
        }
        std::uint64_t pick = choose.below(total);
        std::size_t kind_index = 0;
        while (pick >= swarm.weights[kind_index]) pick -= swarm.weights[kind_index++];
        trace.push_back(draws[kind_index](drawing));
    }
    return trace;
}

Trace trace_for_seed(std::uint64_t seed, const WorkloadOptions& options) {
    SeededChooser choose(seed);
    const Swarm swarm = random_swarm(choose, options);
    return generate_trace(choose, swarm, options);
}

}  // namespace kvcheck
