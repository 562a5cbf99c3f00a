#include "kvcheck/workload.h"
#include "kvcheck/lanes.h"
#include "kvcheck/limits.h"

#include "kvcheck/splitmix.h"

#include <algorithm>
#include <iterator>
#include <deque>
#include <map>
#include <optional>
#include <stdexcept>
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
    std::vector<CacheSpec> added;          // the specs added so far: the same content is stored again at times
    std::vector<std::int64_t> handles;     // handles that likely hold a cache
    std::vector<Layout> layouts;           // their layouts
    // Handles likely holding a cache the caller owns (get_cache, clone,
    // concat, turn): what a trim may cut. Bookkeeping only: no choice.
    std::vector<std::int64_t> owned;
    std::int64_t next_handle = 1;
    // The paged family: sequences likely alive, and the token lists
    // allocated so far (new requests often share their prefixes).
    std::vector<std::int64_t> seqs;
    std::vector<Tokens> requests;
    std::int64_t next_seq = 1;
    std::map<std::int64_t, std::pair<Tokens, std::int64_t>> allocated;  // seq -> its request's tokens and salt
    // Operations to come right after the follow-up, in order (a chain).
    std::deque<Op> chained;
    std::map<std::int64_t, std::int64_t> lengths;  // seq -> its tokens, as far as the draft knows
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

// The exponent of the largest power of two not above `value` (value >= 1).
int floor_log2(std::int64_t value) {
    int exponent = 0;
    while ((std::int64_t{2} << exponent) <= value) ++exponent;
    return exponent;
}

// A power of two in [low, high] (low >= 1, high >= low), each exponent alike.
std::int64_t pick_power_of_two(Chooser& choose, std::int64_t low, std::int64_t high) {
    const int first = floor_log2(low) + ((std::int64_t{1} << floor_log2(low)) < low ? 1 : 0);
    const int last = floor_log2(high);
    if (last < first) return low;
    return std::int64_t{1} << choose.between(first, last);
}

// A layer's token count in [1, max]: uniform for small ceilings; else an
// octave (2^(k-1), 2^k] first, each alike, so counts spread over the powers
// of two, and a quarter of the time a power of two or its neighbour.
std::int64_t pick_tokens(Chooser& choose, std::int64_t max) {
    if (max <= 8) return choose.between(1, max);
    const int octave = static_cast<int>(choose.below(static_cast<std::uint64_t>(floor_log2(max)) + 1));
    const std::int64_t top = std::int64_t{1} << octave;
    if (choose.one_in(4)) return std::clamp<std::int64_t>(top + choose.between(-1, 1), 1, max);
    return choose.between(octave == 0 ? 1 : top / 2 + 1, std::min(top, max));
}

// The geometry and the cache ceilings of a trace (Scope). A declared
// model has its own geometry and layer count; its token ceiling is drawn
// as any other trace's.
void pick_size(Chooser& choose, const WorkloadOptions& options, Swarm& swarm) {
    const Scope& scope = options.scope;
    const ModelDomain& model = options.capabilities.model;
    if (model.declared) {
        swarm.heads = model.heads;
        swarm.head_dim = model.head_dim;
        swarm.layers_max = model.layers;
    }
    if (static_cast<std::int64_t>(choose.below(100)) < scope.small_percent) return;  // small: as uniform_swarm has it
    const std::int64_t layers_max = std::max<std::int64_t>(scope.cache_layers_max, 1);
    const std::int64_t layers_drawn = choose.one_in(2) ? layers_max : choose.between(1, layers_max);
    if (!model.declared) swarm.layers_max = layers_drawn;
    const std::int64_t tokens_max = std::max<std::int64_t>(scope.layer_tokens_max, 1);
    swarm.tokens_max = pick_power_of_two(choose, std::min<std::int64_t>(64, tokens_max), tokens_max);
    if (!model.declared && options.capabilities.any_geometry && choose.one_in(2)) {
        swarm.heads = pick_power_of_two(choose, 1, std::clamp<std::int64_t>(scope.heads_max, 1, cache_heads_max));
        swarm.head_dim = pick_power_of_two(choose, 2, std::clamp<std::int64_t>(scope.head_dim_max, 2, cache_head_dim_max));
    }
    const std::int64_t fitting = std::max<std::int64_t>(scope.slot_values_max / (swarm.heads * swarm.head_dim), 1);
    swarm.tokens_max = std::min(swarm.tokens_max, fitting);
}

// The layouts the engine takes: those its capabilities allow and, when it
// declares a model, that the model holds.
bool takes(const Capabilities& c, Layout layout) {
    const bool allowed = layout == Layout::modern ? c.modern_layout : c.legacy_layout;
    return allowed && (!c.model.declared || c.model.holds(layout));
}

// An odd modern layer (one-sided, legacy-named, bare or not initialized),
// as far as the engine supports it.
void make_odd(Chooser& choose, const Capabilities& c, LayerSpec& layer) {
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

// A cache of the engine's declared model: its layer count and geometry,
// one token count in every layer, no odd layer unless the model has them.
CacheSpec model_cache_spec(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options) {
    const ModelDomain& model = options.capabilities.model;
    CacheSpec spec;
    spec.layout = pick_layout(choose, swarm);
    spec.dtype = swarm.mixed_dtypes ? model.dtypes[choose.below(model.dtypes.size())] : swarm.dtype;
    spec.seed = choose.below(1000);
    spec.heads = model.heads;
    spec.head_dim = model.head_dim;
    const std::int64_t tokens = pick_tokens(choose, swarm.tokens_max);
    spec.layers.assign(static_cast<std::size_t>(model.layers), LayerSpec{0b0011, true, tokens});
    if (spec.layout != Layout::modern || !swarm.odd_layers) return spec;
    for (LayerSpec& layer : spec.layers) {
        if (choose.one_in(2)) make_odd(choose, options.capabilities, layer);
    }
    return spec;
}

}  // namespace

// A splitmix64 stream: the same seed gives the same choices on every platform.
std::uint64_t SeededChooser::below(std::uint64_t n) {
    const std::uint64_t x = splitmix64(state_);
    state_ += splitmix64_increment;
    return n <= 1 ? 0 : x % n;
}

Scope scope_named(const std::string& name) {
    Scope scope;
    if (name == "default") return scope;
    if (name == "small") {
        scope.name = "small";
        scope.small_percent = 100;
        scope.store_items_max = 0;
        return scope;
    }
    if (name == "large") {
        scope.name = "large";
        scope.small_percent = 25;
        scope.cache_layers_max = spec_layers_max;  // the most a trace file may ask for too
        scope.layer_tokens_max = spec_layer_tokens_max;
        scope.heads_max = 16;
        scope.head_dim_max = 128;
        scope.slot_values_max = 65536;
        scope.store_items_max = 1024;
        return scope;
    }
    throw std::invalid_argument("unknown scope '" + name + "' (expected small, default or large)");
}

std::string describe_scope(const Scope& scope) {
    std::string text = std::string("scope ") + scope.name + ": ";
    const std::string fills = scope.store_items_max > 0 ? ", fills of up to " + std::to_string(scope.store_items_max) + " items" : "";
    if (scope.small_percent >= 100) return text + "small caches only" + fills;
    return text + std::to_string(scope.small_percent) + "% small traces, the others up to " +
           std::to_string(scope.cache_layers_max) + " layers x " + std::to_string(scope.layer_tokens_max) +
           " tokens, heads up to " + std::to_string(scope.heads_max) + " x head_dim up to " +
           std::to_string(scope.head_dim_max) + ", at most " + std::to_string(scope.slot_values_max) + " values a slot" + fills;
}

Swarm uniform_swarm(const WorkloadOptions& options) {
    Swarm swarm;
    swarm.layers_max = options.cache_layers_max;
    swarm.tokens_max = options.layer_tokens_max;
    swarm.weights.fill(2);
    const Capabilities& c = options.capabilities;
    swarm.modern = takes(c, Layout::modern);
    swarm.legacy = takes(c, Layout::legacy);
    if (c.model.declared) {
        swarm.dtype = c.model.dtypes.front();
        swarm.odd_layers = c.model.odd_layers;
        swarm.heads = c.model.heads;
        swarm.head_dim = c.model.head_dim;
        swarm.layers_max = c.model.layers;
    }
    swarm.weights[kind<op::Add>()] = 6;  // a store needs content to be interesting
    swarm.weights[kind<op::DumpKill>()] = options.dump_kill ? 1 : 0;  // three processes each: a few per trace find what they find
    swarm.weights[kind<op::GetCache>()] = 4;
    swarm.weights[kind<op::Generate>()] = 3;
    swarm.weights[kind<op::Fill>()] = options.scope.store_items_max > 0 ? 1 : 0;
    swarm.weights[kind<op::PagedAlloc>()] = 6;  // a pool needs sequences to be interesting
    swarm.weights[kind<op::PagedStep>()] = 3;
    swarm.weights[kind<op::SwitchLane>()] = 0;  // one client: lanes are drawn by harness/lanes.cpp
    // An operation the engine cannot run is never generated.
    for (std::size_t kind_index = 0; kind_index < op_kind_count; ++kind_index) {
        if (!engine_supports(c, op_needs(kind_index))) swarm.weights[kind_index] = 0;
    }
    // A conversion needs a cache of each layout: not drawn for a model that holds one.
    if (!swarm.modern || !swarm.legacy) {
        swarm.weights[kind<op::ToLegacy>()] = 0;
        swarm.weights[kind<op::FromLegacy>()] = 0;
    }
    return swarm;
}

Swarm random_swarm(Chooser& choose, const WorkloadOptions& options) {
    const std::string fault = capabilities_fault(options.capabilities);
    if (!fault.empty()) throw std::invalid_argument("the engine's capabilities: " + fault);
    Swarm swarm = uniform_swarm(options);
    for (std::size_t kind_index = 0; kind_index < op_kind_count; ++kind_index) {
        std::uint8_t& weight = swarm.weights[kind_index];
        if (weight == 0) continue;  // not supported by the engine
        weight = choose.one_in(4) ? 0 : static_cast<std::uint8_t>(choose.between(1, 6));
    }
    // A trace without caches in the store exercises nothing.
    if (options.capabilities.store) swarm.weights[kind<op::Add>()] = static_cast<std::uint8_t>(choose.between(3, 8));
    // Three processes each (a complete dump, a killed one, the loads), and
    // the bugs it finds show at most kill points: a quarter of the swarms
    // draw it, at the lowest weight (no extra choice: the draw above decides).
    std::uint8_t& kill = swarm.weights[kind<op::DumpKill>()];
    kill = (kill == 1 || kill == 2) ? 1 : 0;
    // A fill is many adds: one now and then loads the store.
    std::uint8_t& fill = swarm.weights[kind<op::Fill>()];
    fill = std::min<std::uint8_t>(fill, 1);
    // A paged engine: allocations like adds, and half its traces only paged
    // (an engine without Capabilities::paged draws none of this).
    if (options.capabilities.paged) {
        swarm.weights[kind<op::PagedAlloc>()] = static_cast<std::uint8_t>(choose.between(3, 8));
        if (choose.one_in(2)) {
            for (std::size_t kind_index = 0; kind_index < op_kind_count; ++kind_index) {
                if ((op_needs(kind_index) & needs_paged) == 0) swarm.weights[kind_index] = 0;
            }
        }
    }
    const Capabilities& c = options.capabilities;
    const ModelDomain& model = c.model;
    if (model.declared) {
        swarm.dtype = model.dtypes[choose.below(model.dtypes.size())];
    } else {
        switch (choose.below(c.half_dtypes ? 4 : 1)) {
            case 0: case 1: swarm.dtype = Dtype::f32; break;
            case 2: swarm.dtype = Dtype::f16; break;
            default: swarm.dtype = Dtype::bf16; break;
        }
    }
    // uniform_swarm took every layout the engine takes; a swarm may keep one.
    if (swarm.modern && swarm.legacy) {
        const std::uint64_t layouts = choose.below(4);
        swarm.modern = layouts != 0;
        swarm.legacy = layouts != 1;
    }
    swarm.odd_layers = (!model.declared || model.odd_layers) && !choose.one_in(3);
    pick_size(choose, options, swarm);
    swarm.mixed_dtypes = (model.declared ? model.dtypes.size() > 1 : c.half_dtypes) && choose.one_in(2);
    // Mixed dtypes matter where caches meet, in merges: a mixed trace makes
    // caches and merges them more often.
    if (swarm.mixed_dtypes) {
        for (const std::size_t meeting : {kind<op::Add>(), kind<op::Make>(), kind<op::GetCache>(), kind<op::Concat>()}) {
            if (swarm.weights[meeting] != 0) swarm.weights[meeting] = std::max<std::uint8_t>(swarm.weights[meeting], 8);
        }
    }
    return swarm;
}

CacheSpec random_cache_spec(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options) {
    if (options.capabilities.model.declared) return model_cache_spec(choose, swarm, options);
    const Capabilities& c = options.capabilities;
    CacheSpec spec;
    spec.layout = pick_layout(choose, swarm);
    spec.dtype = swarm.mixed_dtypes ? static_cast<Dtype>(choose.below(3)) : swarm.dtype;
    spec.seed = choose.below(1000);
    spec.heads = swarm.heads;
    spec.head_dim = swarm.head_dim;
    const std::int64_t layers = choose.one_in(6) ? 0 : choose.between(1, swarm.layers_max);
    for (std::int64_t i = 0; i < layers; ++i) {
        LayerSpec layer;
        layer.tokens = choose.one_in(6) ? 0 : pick_tokens(choose, swarm.tokens_max);
        if (spec.layout == Layout::modern && swarm.odd_layers && choose.one_in(2)) make_odd(choose, c, layer);
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
// A modern layer not initialized yet that holds tokens.
bool holds_uninitialized_tokens(const CacheSpec& spec) {
    if (spec.layout != Layout::modern) return false;
    for (const LayerSpec& layer : spec.layers) {
        if (!layer.initialized && layer.slots != 0 && layer.tokens > 0) return true;
    }
    return false;
}

// The metadata an added item carries: none half the time.
MetaSeed draw_meta(Drawing& d) {
    if (!d.options.capabilities.metadata || d.choose.one_in(2)) return {};
    return {d.choose.between(1, 999)};
}

op::Add add_of(Drawing& d, std::string id) {
    // Now and then the same content again, as when one memory text is
    // cached twice: an engine that shares what it stores twice shows.
    CacheSpec spec = !d.draft.added.empty() && d.choose.one_in(8)
                         ? d.draft.added[d.choose.below(d.draft.added.size())]
                         : random_cache_spec(d.choose, d.swarm, d.options);
    d.draft.stored[id] = spec.layout;
    d.draft.added.push_back(spec);
    return {std::move(id), spec, draw_meta(d)};
}

op::Add draw(Drawing& d, op::Add*) {
    // In a trace of mixed dtypes a new cache is often merged at once with
    // one already stored: the merge promotes, or the engine refuses it.
    const bool merge_next = d.swarm.mixed_dtypes && d.enabled(kind<op::GetCache>()) && !d.draft.stored.empty() && d.choose.one_in(2);
    std::string other;
    if (merge_next) {
        auto at = d.draft.stored.begin();
        std::advance(at, static_cast<std::ptrdiff_t>(d.choose.below(d.draft.stored.size())));
        other = at->first;
    }
    op::Add add = add_of(d, d.id());
    if (merge_next) {
        const Ids ids = {other, add.id};
        d.follow_up = op::GetCache{new_handle(d.draft, merged_layout(d.draft, ids)), ids};
    } else if (holds_uninitialized_tokens(add.cache) && d.choose.one_in(2)) {
        // A copy of what an uninitialized layer holds is where copies lose it.
        d.follow_up = op::GetCache{new_handle(d.draft, add.cache.layout), {add.id}};
    }
    return add;
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

// A cut of `handle` to a prefix: keep drawn as layer token counts are, so
// that about half the cuts cut something.
op::Trim trim_of(Drawing& d, HandleName handle) {
    return {handle, pick_tokens(d.choose, std::max<std::int64_t>(1, d.swarm.tokens_max))};
}

op::GetCache draw(Drawing& d, op::GetCache*) {
    Ids ids = pick_ids(d.choose, d.draft, d.options, 1, 3);
    op::GetCache get{new_handle(d.draft, merged_layout(d.draft, ids)), ids};
    d.draft.owned.push_back(get.out.value);
    // A copy is followed by a generation from it, as in real use; or, for
    // an engine that trims, cut to a prefix first (a prompt cache reusing a
    // shorter prefix of what it holds). No choice for an engine without trim.
    if (d.enabled(kind<op::Generate>()) && d.choose.one_in(3)) {
        d.follow_up = op::Generate{get.out, pick_prompt(d.choose, d.options), d.choose.between(1, d.options.new_tokens_max)};
    } else if (d.enabled(kind<op::Trim>()) && d.choose.one_in(3)) {
        d.follow_up = trim_of(d, get.out);
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
    // Deleting an id and adding it again: a new item, at the end of the
    // order, with nothing of the old one.
    if (d.enabled(kind<op::Add>()) && d.choose.one_in(3)) d.follow_up = add_of(d, ids.front());
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
    // The load that reads the damage follows every corrupt, even in a trace
    // whose swarm draws no loads of its own (a load needs what a corrupt
    // needs: a dump): a store that loads a flipped byte of tensor data
    // silently is found on every trace that draws one
    // (docs/semantics.md#durability).
    d.follow_up = op::Load{at};
    return corrupt;
}

op::Make draw(Drawing& d, op::Make*) {
    CacheSpec spec = random_cache_spec(d.choose, d.swarm, d.options);
    const HandleName made = new_handle(d.draft, spec.layout);
    if (holds_uninitialized_tokens(spec) && d.choose.one_in(2)) {
        d.follow_up = op::Clone{new_handle(d.draft, spec.layout), made};
    }
    return {made, spec};
}

op::Clone draw(Drawing& d, op::Clone*) {
    HandleName source = pick_handle(d.choose, d.draft);
    const HandleName out = new_handle(d.draft, layout_of(d.draft, source));
    d.draft.owned.push_back(out.value);
    return {out, source};
}

op::Concat draw(Drawing& d, op::Concat*) {
    HandleNames parts;
    const std::int64_t count = d.choose.between(2, 3);
    for (std::int64_t i = 0; i < count; ++i) parts.push_back(pick_handle(d.choose, d.draft));
    const HandleName out = new_handle(d.draft, Layout::modern);
    d.draft.owned.push_back(out.value);
    return {out, parts};
}

op::ToLegacy draw(Drawing& d, op::ToLegacy*) {
    HandleName source = pick_handle_of(d.choose, d.draft, Layout::modern);
    return {new_handle(d.draft, Layout::legacy), source};
}

op::FromLegacy draw(Drawing& d, op::FromLegacy*) {
    HandleName source = pick_handle_of(d.choose, d.draft, Layout::legacy);
    return {new_handle(d.draft, Layout::modern), source};
}

op::Release draw(Drawing& d, op::Release*) {
    const HandleName handle = pick_handle(d.choose, d.draft);
    for (std::size_t i = 0; i < d.draft.handles.size(); ++i) {
        if (d.draft.handles[i] != handle.value) continue;
        d.draft.handles.erase(d.draft.handles.begin() + static_cast<std::ptrdiff_t>(i));
        d.draft.layouts.erase(d.draft.layouts.begin() + static_cast<std::ptrdiff_t>(i));
        break;
    }
    std::vector<std::int64_t>& owned = d.draft.owned;
    owned.erase(std::remove(owned.begin(), owned.end(), handle.value), owned.end());
    return {handle};
}

// A chat turn from any handle, as generate. Its cache is then often stored
// back (a memory updated by the conversation) or continued from at once
// (a second turn).
op::Turn draw(Drawing& d, op::Turn*) {
    const HandleName source = pick_handle(d.choose, d.draft);
    const Layout layout = source.value == 0 ? Layout::modern : layout_of(d.draft, source);
    op::Turn turn{new_handle(d.draft, layout), source, pick_prompt(d.choose, d.options),
                  d.choose.between(1, d.options.new_tokens_max)};
    d.draft.owned.push_back(turn.out.value);
    switch (d.choose.below(3)) {
        case 0: {
            if (!d.enabled(kind<op::AddHandle>())) break;
            std::string id = d.id();
            d.draft.stored[id] = layout;
            d.follow_up = op::AddHandle{std::move(id), turn.out};
            break;
        }
        case 1:
            d.follow_up = op::Turn{new_handle(d.draft, layout), turn.out, pick_prompt(d.choose, d.options),
                                   d.choose.between(1, d.options.new_tokens_max)};
            break;
        default: break;
    }
    return turn;
}

// A memory the model makes of a prompt; then, half the time, a generation
// that starts a new conversation (no cache): an engine that keeps the
// model's working cache around shows there.
op::Extract draw(Drawing& d, op::Extract*) {
    std::string id = d.id();
    d.draft.stored[id] = Layout::modern;
    if (d.enabled(kind<op::Generate>()) && d.choose.one_in(2)) {
        d.follow_up = op::Generate{{0}, pick_prompt(d.choose, d.options), d.choose.between(1, d.options.new_tokens_max)};
    }
    return {std::move(id), pick_prompt(d.choose, d.options)};
}

// A store under load: a fill of one of the sizes stores switch at (8, 16,
// 32, 64, 256, 1024 items, up to the scope's), a quarter of the time one
// item off; its ids start at 0 or overlap an earlier fill's. Its caches
// are small: the load is in the items.
op::Fill draw(Drawing& d, op::Fill*) {
    static constexpr std::array<std::int64_t, 6> sizes{8, 16, 32, 64, 256, 1024};
    const std::int64_t most = std::max<std::int64_t>(d.options.scope.store_items_max, 1);
    std::size_t fitting = 0;
    while (fitting < sizes.size() && sizes[fitting] <= most) ++fitting;
    std::int64_t count = fitting == 0 ? most : sizes[d.choose.below(fitting)];
    if (d.choose.one_in(4)) count = std::clamp<std::int64_t>(count + (d.choose.one_in(2) ? 1 : -1), 1, op::Fill::count_max);
    const std::int64_t first = d.choose.one_in(2) ? 0 : d.choose.between(0, count);
    Swarm small = d.swarm;
    small.tokens_max = std::min<std::int64_t>(small.tokens_max, 4);
    if (!d.options.capabilities.model.declared) small.layers_max = std::min<std::int64_t>(small.layers_max, 2);
    CacheSpec spec = random_cache_spec(d.choose, small, d.options);
    for (std::int64_t k = 0; k < count; ++k) d.draft.stored[op::fill_id(first + k)] = spec.layout;
    return {spec, first, count};
}

// ---- the paged family ----

// Tokens of a new request: a few from a small alphabet, so that requests
// share prefixes and hit; often a past request's prefix, extended.
Tokens paged_tokens(Drawing& d) {
    Tokens tokens;
    if (!d.draft.requests.empty() && !d.choose.one_in(3)) {
        const Tokens& past = d.draft.requests[d.choose.below(d.draft.requests.size())];
        tokens.assign(past.begin(), past.begin() + static_cast<std::ptrdiff_t>(d.choose.between(1, static_cast<std::int64_t>(past.size()))));
    }
    const std::int64_t more = d.choose.between(tokens.empty() ? 1 : 0, 4);
    for (std::int64_t i = 0; i < more; ++i) tokens.push_back(d.choose.between(1, 3));
    return tokens;
}

std::int64_t paged_salt(Drawing& d) { return d.choose.one_in(4) ? 1 : 0; }

// A sequence likely alive; now and then one that is not.
std::int64_t pick_seq(Drawing& d) {
    if (!d.draft.seqs.empty() && !d.choose.one_in(8)) return d.draft.seqs[d.choose.below(d.draft.seqs.size())];
    return d.choose.between(1, d.draft.next_seq);
}

std::int64_t new_seq(Drawing& d) {
    const std::int64_t seq = d.draft.next_seq++;
    d.draft.seqs.push_back(seq);
    return seq;
}

// A new request of `length` tokens drawn afresh (rarely cached): it takes
// blocks from the free queue (length / 2 of the paged reference's).
op::PagedAlloc fresh_request(Drawing& d, std::int64_t length) {
    Tokens tokens;
    for (std::int64_t i = 0; i < length; ++i) tokens.push_back(d.choose.between(1, 3));
    d.draft.requests.push_back(tokens);
    op::PagedAlloc alloc{new_seq(d), std::move(tokens), 0};
    d.draft.allocated[alloc.seq] = {alloc.tokens, alloc.salt};
    d.draft.lengths[alloc.seq] = static_cast<std::int64_t>(alloc.tokens.size());
    return alloc;
}

op::PagedAlloc draw(Drawing& d, op::PagedAlloc*) {
    Tokens tokens = paged_tokens(d);
    d.draft.requests.push_back(tokens);
    op::PagedAlloc alloc{new_seq(d), std::move(tokens), paged_salt(d)};
    d.draft.allocated[alloc.seq] = {alloc.tokens, alloc.salt};
    d.draft.lengths[alloc.seq] = static_cast<std::int64_t>(alloc.tokens.size());
    // The worker boundary after it: what it computed becomes hittable.
    if (d.enabled(kind<op::PagedStep>()) && d.choose.one_in(2)) d.follow_up = op::PagedStep{};
    return alloc;
}

// An append of `count` tokens to `seq`, as the draft counts it.
op::PagedAppend append_of(Drawing& d, std::int64_t seq, std::int64_t count) {
    const auto length = d.draft.lengths.find(seq);
    if (length != d.draft.lengths.end()) length->second += count;
    return {seq, count};
}

op::PagedAppend draw(Drawing& d, op::PagedAppend*) {
    const std::int64_t seq = pick_seq(d);
    return append_of(d, seq, d.choose.between(1, 3));
}

// A sequence whose last block is partial as far as the draft knows (an
// odd length: the paged reference's blocks hold 2 tokens), when there is one.
std::int64_t pick_partial(Drawing& d) {
    std::vector<std::int64_t> partial;
    for (const std::int64_t seq : d.draft.seqs) {
        const auto length = d.draft.lengths.find(seq);
        if (length != d.draft.lengths.end() && length->second % 2 == 1) partial.push_back(seq);
    }
    if (partial.empty()) return pick_seq(d);
    return partial[d.choose.below(partial.size())];
}

op::PagedFork draw(Drawing& d, op::PagedFork*) {
    // Half the time a parent whose last block a write then shares.
    const std::int64_t parent = d.choose.one_in(2) ? pick_partial(d) : pick_seq(d);
    op::PagedFork fork{parent, new_seq(d)};
    const auto length = d.draft.lengths.find(parent);
    if (length != d.draft.lengths.end()) d.draft.lengths[fork.child] = length->second;
    // A write into the blocks now shared: copy-on-write.
    if (d.enabled(kind<op::PagedAppend>()) && !d.choose.one_in(3)) {
        const bool parent_writes = d.choose.one_in(2);
        d.follow_up = append_of(d, parent_writes ? parent : fork.child, d.choose.between(1, 3));
        // Now and then the other holder ends before the step: the copy's
        // source is then held by the pending copy alone (never to be taken
        // while read), and free after the step (its copy must not change
        // when it is taken again).
        if (d.enabled(kind<op::PagedFree>()) && d.choose.one_in(2)) {
            const std::int64_t other = parent_writes ? fork.child : parent;
            d.draft.seqs.erase(std::remove(d.draft.seqs.begin(), d.draft.seqs.end(), other), d.draft.seqs.end());
            d.draft.chained.push_back(op::PagedFree{other});
            // Then blocks taken: before the step (the source must not be
            // among them), or after it, enough to reach the source at the
            // back of the free queue (the copy must not change then).
            if (d.enabled(kind<op::PagedAlloc>())) {
                const bool after_step = d.enabled(kind<op::PagedStep>()) && !d.choose.one_in(3);
                if (after_step) d.draft.chained.push_back(op::PagedStep{});
                d.draft.chained.push_back(fresh_request(d, 8));
                if (after_step) d.draft.chained.push_back(fresh_request(d, 4));
            }
        }
    }
    return fork;
}

op::PagedFree draw(Drawing& d, op::PagedFree*) {
    const std::int64_t seq = pick_seq(d);
    d.draft.seqs.erase(std::remove(d.draft.seqs.begin(), d.draft.seqs.end(), seq), d.draft.seqs.end());
    return {seq};
}

op::PagedLookup draw(Drawing& d, op::PagedLookup*) { return {paged_tokens(d), paged_salt(d)}; }

op::PagedEvict draw(Drawing&, op::PagedEvict*) { return {}; }

op::PagedReset draw(Drawing&, op::PagedReset*) { return {}; }

op::PagedStep draw(Drawing&, op::PagedStep*) { return {}; }

op::PagedImport draw(Drawing& d, op::PagedImport*) {
    // An activation memory of the paged reference's model: 2 layers of the
    // default geometry, float32, one length (another pool refuses it).
    CacheSpec spec;
    spec.seed = d.choose.below(1000);
    const std::int64_t tokens = d.choose.between(1, 6);
    spec.layers.assign(2, LayerSpec{0b11, true, tokens});
    op::PagedImport import{new_seq(d), spec};
    d.draft.lengths[import.seq] = tokens;
    if (d.enabled(kind<op::PagedExport>()) && d.choose.one_in(2)) d.follow_up = op::PagedExport{import.seq};
    return import;
}

op::PagedExport draw(Drawing& d, op::PagedExport*) { return {pick_seq(d)}; }

op::PagedRewind draw(Drawing& d, op::PagedRewind*) {
    op::PagedRewind rewind{pick_seq(d), d.choose.between(1, 3), d.choose.between(1, 3)};
    const auto length = d.draft.lengths.find(rewind.seq);
    // Half the time, when the draft knows the length, a cut into a block
    // with a whole block after it (2 tokens a block, as pick_partial
    // assumes): an odd number of tokens kept, at least 3 dropped. The kept
    // block loses its identity while the released one after it keeps its
    // key: the gap in a chain a lookup must stop at (PM28).
    bool gap = false;
    if (length != d.draft.lengths.end() && length->second >= 4 && d.choose.one_in(2)) {
        const std::int64_t kept = 1 + 2 * d.choose.between(0, (length->second - 4) / 2);
        rewind.count = length->second - kept;
        gap = true;
    }
    if (length != d.draft.lengths.end()) length->second = std::max<std::int64_t>(1, length->second - rewind.count);
    const auto request = d.draft.allocated.find(rewind.seq);
    // After a gap, the request again is what can stop at it.
    const std::uint64_t then = gap && d.choose.one_in(2) ? 1 : d.choose.below(3);
    if (then == 0 && d.enabled(kind<op::PagedAppend>())) {
        // Other tokens where the dropped ones were.
        d.follow_up = append_of(d, rewind.seq, d.choose.between(1, 3));
    } else if (then == 1 && request != d.draft.allocated.end()) {
        // The same request again, a token longer: its prefix may hit the
        // blocks the rewind cut (which must have lost their identity).
        Tokens again = request->second.first;
        again.push_back(d.choose.between(1, 3));
        // Half the time only looked up: the chain of hits stops at the cut
        // block, while a block after it, released, may still be indexed.
        if (d.enabled(kind<op::PagedLookup>()) && d.choose.one_in(2)) {
            d.follow_up = op::PagedLookup{std::move(again), request->second.second};
            return rewind;
        }
        d.draft.requests.push_back(again);
        op::PagedAlloc alloc{new_seq(d), std::move(again), request->second.second};
        d.draft.allocated[alloc.seq] = {alloc.tokens, alloc.salt};
        d.draft.lengths[alloc.seq] = static_cast<std::int64_t>(alloc.tokens.size());
        d.follow_up = std::move(alloc);
    }
    return rewind;
}

// A cache the caller holds cut to a prefix, as a prompt cache reuses a
// shorter prefix or speculative decoding drops rejected draft tokens; then,
// half the time, a generation from it (the continuation after the cut).
op::Trim draw(Drawing& d, op::Trim*) {
    // Mostly a cache the caller owns (the others are read-only: not run).
    const std::vector<std::int64_t>& owned = d.draft.owned;
    const HandleName handle = !owned.empty() && !d.choose.one_in(4) ? HandleName{owned[d.choose.below(owned.size())]}
                                                                     : pick_handle(d.choose, d.draft);
    const op::Trim trim = trim_of(d, handle);
    if (d.enabled(kind<op::Generate>()) && d.choose.one_in(2)) {
        d.follow_up = op::Generate{handle, pick_prompt(d.choose, d.options), d.choose.between(1, d.options.new_tokens_max)};
    }
    return trim;
}

// ---- batches (docs/semantics.md#batches) ----

// The rows of a fresh batch: one geometry, each a plain modern cache
// (every layer initialized, keys and values, a token at least), as the
// rows of a batched generation are; only the seed differs from row to row.
CacheSpec batch_row_spec(Drawing& d) {
    CacheSpec spec = random_cache_spec(d.choose, d.swarm, d.options);
    spec.layout = Layout::modern;
    for (LayerSpec& layer : spec.layers) {
        layer.slots = 0b11;
        layer.initialized = true;
        layer.tokens = std::max<std::int64_t>(1, layer.tokens);
    }
    if (spec.layers.empty()) spec.layers.push_back(LayerSpec{0b11, true, 1});
    return spec;
}

// The steps after the rows: a repeat, half the time a reorder as a beam
// step makes it (each new row one of the old, some twice, some dropped),
// the row kept; half the time a generation from it follows (the beams
// continue from the rows they took).
op::Batch batch_of(Drawing& d, HandleNames rows) {
    op::Batch batch;
    batch.rows = std::move(rows);
    batch.repeat = d.choose.between(1, 3);
    const std::int64_t width = batch.width();
    if (d.choose.one_in(2)) {
        for (std::int64_t j = 0; j < width; ++j) batch.reorder.push_back(static_cast<std::int64_t>(d.choose.below(static_cast<std::uint64_t>(width))));
    }
    batch.select = static_cast<std::int64_t>(d.choose.below(static_cast<std::uint64_t>(width)));
    batch.out = new_handle(d.draft, Layout::modern);
    d.draft.owned.push_back(batch.out.value);
    return batch;
}

// A batch the caller owns, as beam search and batched generation hold one.
// Mostly of fresh rows: items of one geometry stored, each copied out by
// get_cache (a cache the caller owns), then the batch, each in turn; else
// of a cache the caller already holds, once or twice. The first step is
// returned, the others follow it.
Op draw_batch(Drawing& d) {
    const std::vector<std::int64_t>& owned = d.draft.owned;
    const bool modern = takes(d.options.capabilities, Layout::modern);
    if (!modern || !d.enabled(kind<op::GetCache>()) || (!owned.empty() && d.choose.one_in(3))) {
        const HandleName row = !owned.empty() ? HandleName{owned[d.choose.below(owned.size())]} : pick_handle(d.choose, d.draft);
        HandleNames rows{row};
        if (d.choose.one_in(3)) rows.push_back(row);
        return batch_of(d, std::move(rows));
    }
    CacheSpec spec = batch_row_spec(d);
    const std::int64_t count = d.choose.between(1, 3);
    std::vector<Op> steps;
    HandleNames rows;
    for (std::int64_t i = 0; i < count; ++i) {
        // Now and then the same content again: two requests of one prompt.
        if (i == 0 || !d.choose.one_in(8)) spec.seed = static_cast<std::uint64_t>(d.choose.between(1, 999));
        const std::string id = d.id();
        d.draft.stored[id] = Layout::modern;
        d.draft.added.push_back(spec);
        steps.push_back(op::Add{id, spec, {}});
    }
    for (std::int64_t i = 0; i < count; ++i) {
        const op::Add& add = std::get<op::Add>(steps[static_cast<std::size_t>(i)]);
        const HandleName row = new_handle(d.draft, Layout::modern);
        d.draft.owned.push_back(row.value);
        rows.push_back(row);
        steps.push_back(op::GetCache{row, {add.id}});
    }
    const op::Batch batch = batch_of(d, std::move(rows));
    steps.push_back(batch);
    if (d.enabled(kind<op::Generate>()) && d.choose.one_in(2)) {
        steps.push_back(op::Generate{batch.out, pick_prompt(d.choose, d.options), d.choose.between(1, d.options.new_tokens_max)});
    }
    d.follow_up = std::move(steps[1]);
    for (std::size_t i = 2; i < steps.size(); ++i) d.draft.chained.push_back(std::move(steps[i]));
    return std::move(steps[0]);
}

// Never drawn here (weight 0): the lanes of a concurrent trace are laid
// out by harness/lanes.cpp.
op::SwitchLane draw(Drawing&, op::SwitchLane*) { return {}; }

// kvcheck's clock: steps around the declared TTL, so that a lease's expiry
// falls on a step often (a tick to exactly t + TTL, and one before it).
op::Tick draw(Drawing& d, op::Tick*) {
    const std::int64_t ttl = std::max<std::int64_t>(1, d.options.capabilities.lease_ttl_ms);
    if (d.choose.one_in(3)) return {std::min(ttl, op::Tick::ms_max)};
    return {std::min(d.choose.between(1, 2 * ttl), op::Tick::ms_max)};
}

// A read lease, then often what it must hold off: a delete or an overwrite
// of the leased entry, at once or, half the time, after a tick of exactly
// the TTL (the first instant the lease no longer holds: M39) or one less
// (the last it holds).
op::Lease draw(Drawing& d, op::Lease*) {
    std::string id = d.id();
    std::optional<Op> held_off;
    if (d.enabled(kind<op::Delete>()) && d.choose.one_in(3)) {
        held_off = op::Delete{{id}};
    } else if (d.enabled(kind<op::Add>()) && d.choose.one_in(3)) {
        held_off = add_of(d, id);
    }
    if (held_off && d.enabled(kind<op::Tick>()) && d.choose.one_in(2)) {
        const std::int64_t ttl = std::min(std::max<std::int64_t>(1, d.options.capabilities.lease_ttl_ms), op::Tick::ms_max);
        d.follow_up = op::Tick{ttl > 1 && d.choose.one_in(3) ? ttl - 1 : ttl};
        d.draft.chained.push_back(std::move(*held_off));
    } else {
        d.follow_up = std::move(held_off);
    }
    return {std::move(id)};
}

op::Unlease draw(Drawing& d, op::Unlease*) { return {d.id()}; }

template <std::size_t K>
Op draw_kind(Drawing& d) {
    using T = std::variant_alternative_t<K, Op>;
    if constexpr (std::is_same_v<T, op::Batch>) {
        return draw_batch(d);  // its first step may be an add of its rows
    } else {
        return Op(std::in_place_index<K>, draw(d, static_cast<T*>(nullptr)));
    }
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
            if (!draft.chained.empty()) {
                follow_up = std::move(draft.chained.front());
                draft.chained.pop_front();
            }
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
    if (options.lanes > 1) return concurrent_trace(choose, options);
    const Swarm swarm = random_swarm(choose, options);
    return generate_trace(choose, swarm, options);
}

}  // namespace kvcheck
