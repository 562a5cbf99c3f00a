#include "run/transitions.h"

#include "durability/dump_kill.h"

#include <algorithm>
#include <limits>
#include <set>

namespace kvcheck {
namespace {

using checkers::MadeBy;

// Generation needs a cache whose layers hold as many keys as values.
bool generation_compatible(const CacheContent& content) {
    for (std::size_t i = 0; i < content.layers.size(); ++i) {
        const SlotContent k = logical_slot(content, i, keys);
        const SlotContent v = logical_slot(content, i, values);
        if (k.tokens() != v.tokens()) return false;
    }
    return true;
}

// Runs a merge on the engine. A merge of parts of different dtypes may be
// refused (docs/semantics.md, mixed dtypes): the engine's error is returned
// and checked as a refusal. Any other error stays an error of the step.
template <typename Call>
std::optional<std::string> run_merge(bool mixed, Call&& call) {
    if (!mixed) {
        call();
        return std::nullopt;
    }
    try {
        call();
    } catch (const std::exception& error) {
        return std::string(error.what());
    }
    return std::nullopt;
}

// A turn's cache is followed by what a fresh copy fed the same tokens in
// one forward holds: right unless a layer holds a side only under its
// legacy name, which the first update leaves behind (it starts the modern
// slot), so that what the cache holds depends on how the tokens were
// batched (docs/semantics.md#returned-caches).
bool batching_free(const CacheContent& content) {
    if (content.layout != Layout::modern) return true;
    for (const LayerContent& layer : content.layers) {
        if (!layer.initialized) continue;
        if ((!layer.slots[keys].present && layer.slots[key_cache].present) ||
            (!layer.slots[values].present && layer.slots[value_cache].present)) {
            return false;
        }
    }
    return true;
}

checkers::Made made(MadeBy by, std::int64_t out, std::optional<ObjectId> object) {
    checkers::Made fact;
    fact.by = by;
    fact.out = out;
    fact.object = object;
    return fact;
}

}  // namespace

namespace {

// The bytes a copy of `object` holds: bytes_of, or under a window from what
// it shows to all of it (how much more than its window a cache the model
// made holds is unknown).
void size_copies(const Auditor& audit, ObjectId object, checkers::Copies& copies) {
    copies.bytes = audit.bytes_of(object);
    if (audit.window() == 0) return;
    copies.bytes_shown = audit.shown_bytes_of(object);
    if (audit.object(object).fed) copies.bytes.reset();
}

}  // namespace

void Transitions::expect_copies_of(std::string what, std::size_t count, ObjectId object) {
    expect_copies(std::move(what), count, 0);
    size_copies(audit_, object, copies_);
}

void Transitions::expect_copies(std::string what, std::size_t count, std::int64_t bytes) {
    copies_.what = std::move(what);
    copies_.min = copies_.max = count;
    copies_.bytes = bytes;
}

void Transitions::count_merge(bool mixed, bool refused) {
    if (!refused) coverage_.count(Shape::merge);
    if (mixed) coverage_.count(Shape::mixed_merge);
    ++coverage_.merges;
    coverage_.mixed_merges += mixed ? 1 : 0;
    coverage_.refused_merges += refused ? 1 : 0;
}

// A refused merge may have copied a part before it refused: that copy is
// gone with the error, and harmless.
void Transitions::refused_copies(std::string what) {
    copies_.what = std::move(what);
    copies_.min = 0;
    copies_.max = 1;
    copies_.bytes.reset();
}

// Counts traces, not uses.
void Transitions::count_reuse() {
    if (coverage_.count_of(Shape::returned_cache_reused) == 0) coverage_.count(Shape::returned_cache_reused);
}

void Transitions::count_layout(Layout layout) {
    (layout == Layout::modern ? coverage_.modern_caches : coverage_.legacy_caches) += 1;
}

void Transitions::count_content(const CacheContent& content) {
    count_layout(content.layout);
    std::int64_t longest = 0;
    for (const LayerContent& layer : content.layers) {
        for (const SlotContent& slot : layer.slots) longest = std::max(longest, slot.tokens());
    }
    if (longest >= 64) coverage_.count(Shape::slot_64_tokens);
    if (longest >= 256) coverage_.count(Shape::slot_256_tokens);
    if (content.heads != cache_heads || content.head_dim != cache_head_dim) coverage_.count(Shape::other_geometry);
}

// A copy of a modern cache with a layer that is not initialized yet holds
// tokens: what a copy does with it is where layer bugs hide.
void Transitions::count_copy_of(const CacheContent& content) {
    if (content.layout != Layout::modern) return;
    for (const LayerContent& layer : content.layers) {
        if (layer.initialized) continue;
        for (const SlotContent& slot : layer.slots) {
            if (slot.present && slot.tokens() > 0) {
                coverage_.count(Shape::copy_of_uninitialized);
                return;
            }
        }
    }
}

std::optional<ObjectId> Transitions::known_source(std::int64_t handle, bool* holds_none) const {
    *holds_none = false;
    if (handle == 0) {
        *holds_none = true;
        return std::nullopt;
    }
    if (!audit_.handle_created(handle)) return std::nullopt;
    const std::optional<ObjectId> object = audit_.handle(handle);
    if (!object) {
        *holds_none = true;
        return std::nullopt;
    }
    if (!audit_.object(*object).known) return std::nullopt;
    return object;
}

// ---- a bounded store (docs/semantics.md#declared-store-contracts) ------------------

void Transitions::use(const std::string& id) {
    const StorePolicy& policy = readings_.capabilities().policy;
    if (policy.eviction == Eviction::lru || policy.listing == ListingOrder::recency) audit_.touch(id);
}

void Transitions::begin_stores(std::string what) {
    const StorePolicy& policy = readings_.capabilities().policy;
    if (!policy.bounded()) return;
    checkers::Evicted fact;
    fact.what = std::move(what);
    fact.policy = policy;
    fact.handed_out = audit_.handed_out();
    for (const auto& [id, lease] : leases_) {
        if (lease.live(clock_ms_) && audit_.entry(id)) fact.leased.push_back(id);
    }
    evicted_ = std::move(fact);
}

// One item stored into a bounded store, followed: what the policy evicts
// for it, then the call (a store that never evicts refuses an add past its
// capacity: the engine's error is then the refusal, and nothing is
// stored; any other error stays an error of the step), then the entries
// the engine no longer lists are let go of (eviction-as-declared judges
// whether the policy let them go). Item by item, so that an entry evicted
// and stored again within one fill is followed as the new entry it is.
bool Transitions::store_item(const std::string& id, std::int64_t bytes, const std::function<void()>& call,
                             const std::function<void()>& follow) {
    if (!evicted_) {
        call();
        follow();
        return true;
    }
    const StorePolicy& policy = evicted_->policy;
    const auto past_capacity = [&](std::int64_t items, std::int64_t total) {
        return (policy.capacity_items > 0 && items > policy.capacity_items) ||
               (policy.capacity_bytes > 0 && total > policy.capacity_bytes);
    };
    checkers::Evicted::Store one;
    one.id = id;
    const std::optional<ObjectId> entry = audit_.entry(id);
    one.items_before = audit_.order().size() + (entry ? 0 : 1);
    one.bytes_before = audit_.stored_bytes() - (entry ? audit_.bytes_of(*entry) : 0) + bytes;
    one.over = past_capacity(static_cast<std::int64_t>(one.items_before), one.bytes_before);
    const std::set<std::string> leased(evicted_->leased.begin(), evicted_->leased.end());
    std::vector<std::string> no_room;
    one.due = audit_.due_evictions(policy, {{id, bytes}}, leased, &no_room);
    one.refusal_due = (policy.eviction == Eviction::none && one.over) || !no_room.empty();
    // A refusal is the engine's answer to judge when one is due, and with
    // leases declared (a store refusing for a lease that expired); any
    // other error stays an error of the step.
    if (one.refusal_due || lease_ttl_ms() > 0) {
        try {
            call();
        } catch (const std::exception&) {
            // A refusal for a lease on the item's own id is lease-respected's.
            const auto own = leases_.find(id);
            if (!one.refusal_due && own != leases_.end() && own->second.count > 0 && audit_.entry(id)) throw;
            one.refused = true;
            evicted_->stores.push_back(std::move(one));
            return false;
        }
    } else {
        call();
    }
    follow();
    const std::vector<std::string> listed = engine_.stored_ids();
    const std::set<std::string> held(listed.begin(), listed.end());
    for (const std::string& stored : audit_.order()) {
        if (held.count(stored) == 0) one.gone.push_back(stored);
    }
    for (const std::string& gone : one.gone) {
        audit_.remove(gone);
        readings_.drop(gone);
        added_specs_.erase(gone);
    }
    evicted_->stores.push_back(std::move(one));
    return true;
}

void Transitions::settle_evictions() {
    if (!evicted_) return;
    evicted_->items_after = audit_.order().size();
    evicted_->bytes_after = audit_.stored_bytes();
}

// ---- the store ------------------------------------------------------------------

template <>
std::optional<Fact> Transitions::apply(const op::Add& op) {
    CacheContent content = expand(op.cache);
    count_content(content);
    if (deleted_ids_.count(op.id) != 0 && !audit_.entry(op.id)) coverage_.count(Shape::re_add_after_delete);
    for (const auto& [id, spec] : added_specs_) {
        if (id != op.id && spec == op.cache) {
            coverage_.count(Shape::same_content_twice);
            break;
        }
    }
    added_specs_[op.id] = op.cache;
    if (op.meta.value != 0) coverage_.count(Shape::metadata_item);
    Metadata metadata = item_metadata(op.meta);
    const std::int64_t bytes = content_bytes(content);
    begin_stores("add " + checkers::in_quotes(op.id));
    store_item(op.id, bytes, [&] { engine_.add(op.id, content, metadata); }, [&] {
        audit_.store(op.id, audit_.new_object(std::move(content), Origin::stored_item, false), std::move(metadata));
    });
    settle_evictions();
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::AddHandle& op) {
    bool none = false;
    const std::optional<ObjectId> object = known_source(op.handle.value, &none);
    // Storing a conversion's view of another cache is outside the contract.
    if (!object || audit_.object(*object).alias_parent != 0) return std::nullopt;
    if (audit_.object(*object).fed) count_reuse();
    begin_stores("add_handle " + checkers::in_quotes(op.id));
    const bool stored = store_item(op.id, audit_.bytes_of(*object), [&] { engine_.add_handle(op.id, op.handle.value); }, [&] {
        added_specs_.erase(op.id);
        audit_.store(op.id, *object);
        audit_.object(*object).origin = Origin::stored_item;
    });
    settle_evictions();
    if (!stored) return Fact{};  // refused: the handle holds what it held
    checkers::Made fact = made(MadeBy::stored_back, op.handle.value, object);
    fact.id = op.id;
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::Get& op) {
    engine_.get(op.id, op.out.value);
    use(op.id);
    const std::optional<ObjectId> entry = audit_.entry(op.id);
    // No cache for a stored id: store-contract's (the fact keeps the entry);
    // the handle is followed as holding none (as get_cache's).
    audit_.bind(op.out.value, entry && readings_.handle(op.out.value).exists ? entry : std::nullopt);
    checkers::Made fact = made(MadeBy::get, op.out.value, entry);
    fact.id = op.id;
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::GetByIds& op) {
    checkers::GotByIds fact{op.ids, engine_.get_by_ids(op.ids)};
    for (const std::string& id : op.ids) use(id);
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::GetAll&) { return checkers::GotAll{engine_.get_all_ids()}; }

template <>
std::optional<Fact> Transitions::apply(const op::GetCache& op) {
    std::vector<ObjectId> parts;  // the entries that hold tokens
    std::vector<CacheContent> contents;
    std::size_t made_by_model = 0;
    for (const std::string& id : op.ids) {
        const std::optional<ObjectId> entry = audit_.entry(id);
        if (!entry) continue;
        if (audit_.object(*entry).fed) ++made_by_model;
        if (audit_.object(*entry).fed || content_holds_tokens(audit_.object(*entry).content)) {
            parts.push_back(*entry);
            contents.push_back(audit_.object(*entry).content);
        }
    }
    // A merge with a cache the model made: its K/V only the model knows.
    if (made_by_model != 0 && parts.size() > 1) return std::nullopt;
    if (!merged_geometry_ok(contents)) return std::nullopt;
    const bool mixed = dtypes_mixed(contents);
    checkers::Made fact = made(MadeBy::get_cache, op.out.value, std::nullopt);
    fact.refused = run_merge(mixed, [&] { engine_.get_cache(op.ids, op.out.value); });
    for (const std::string& id : op.ids) use(id);
    fact.ids = op.ids.size();
    fact.merged = parts.size() > 1;
    if (fact.refused) {
        count_merge(true, true);
        refused_copies("get_cache " + std::to_string(op.ids.size()) + " ids");
        audit_.bind(op.out.value, std::nullopt);
        return fact;
    }
    if (parts.empty()) {
        bind_tokenless(op, fact);
        return fact;
    }
    if (fact.merged) {
        count_merge(mixed, false);
        fact.object = audit_.new_object(expected_concat(contents), Origin::get_cache, true, 0, 2, audit_.copy_lineage(parts));
    } else {
        count_copy_of(audit_.object(parts.front()).content);
        fact.object = audit_.copy_object(parts.front(), Origin::get_cache, true, 2);
    }
    expect_copies_of("get_cache " + std::to_string(op.ids.size()) + " ids -> " + checkers::handle_text(op.out.value), 1,
                  *fact.object);
    // No cache where one was expected: store-contract's to report (the
    // fact keeps the object it expected). The handle is followed as holding
    // none, so nothing more is asked of what the engine never made
    // (docs/semantics.md#reproduction), and no copy is owed.
    if (!readings_.handle(op.out.value).exists) {
        audit_.bind(op.out.value, std::nullopt);
        copies_.min = 0;
        return fact;
    }
    audit_.bind(op.out.value, fact.object);
    return fact;
}

// docs/semantics.md#store: when the ids get_cache names exist but none
// holds tokens, the engine may give none or a new cache that holds no K/V
// (the layers and flags of its choosing). The expected object is then
// built from the engine's view of it, the only source of its structure:
// the checks judge what may not be so (K/V held: store-contract; storage
// shared with the store: stored-immutable), and later operations on the
// handle are followed from it. Copying nothing moves no byte: no copy, or
// one of 0 bytes. It may carry the owned marker or not (without a marker,
// it must be owned: share nothing); its copy chain may count the entries
// it was asked for (a merge of nothing) or not.
void Transitions::bind_tokenless(const op::GetCache& op, checkers::Made& fact) {
    std::optional<ObjectId> named;  // the first id that exists
    for (const std::string& id : op.ids) {
        named = audit_.entry(id);
        if (named) break;
    }
    fact.tokenless = named.has_value();
    if (!named || !readings_.handle(op.out.value).exists) {
        audit_.bind(op.out.value, std::nullopt);
        return;
    }
    const CacheView view = engine_.view_handle(op.out.value);
    const CacheContent& asked = audit_.object(*named).content;
    CacheContent content;
    content.layout = view.layout;
    content.heads = asked.heads;
    content.head_dim = asked.head_dim;
    bool dtype_known = false;
    for (const LayerView& layer_view : view.layers) {
        LayerContent layer;
        layer.initialized = layer_view.initialized;
        for (std::size_t s = 0; s < layer.slots.size(); ++s) {
            layer.slots[s].present = layer_view.slots[s].present;
            if (!layer_view.slots[s].present || dtype_known) continue;
            content.dtype = layer_view.slots[s].dtype;
            dtype_known = true;
        }
        content.layers.push_back(std::move(layer));
    }
    const bool owned = !readings_.capabilities().owned_marker || readings_.handle_owned(op.out.value);
    fact.object = audit_.new_object(std::move(content), Origin::get_cache, owned, 0, 2);
    // A result holding K/V (store-contract's to report) cannot be followed.
    audit_.object(*fact.object).known = checkers::kv_held(view).empty();
    audit_.bind(op.out.value, fact.object);
    expect_copies_of("get_cache " + std::to_string(op.ids.size()) + " ids -> " + checkers::handle_text(op.out.value), 1,
                  *fact.object);
    copies_.min = 0;
}

template <>
std::optional<Fact> Transitions::apply(const op::Delete& op) {
    engine_.remove(op.ids);
    for (const std::string& id : op.ids) {
        if (audit_.entry(id)) deleted_ids_.insert(id);
        added_specs_.erase(id);
        audit_.remove(id);
        readings_.drop(id);
    }
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::DeleteAll&) {
    engine_.remove_all();
    deleted_ids_.insert(audit_.order().begin(), audit_.order().end());
    added_specs_.clear();
    audit_.remove_all();
    readings_.drop_all();
    return Fact{};
}

// A run of adds: each item as `add` stores it.
template <>
std::optional<Fact> Transitions::apply(const op::Fill& op) {
    if (op.count > 0) begin_stores("fill " + op::fill_id(op.first) + ".." + op::fill_id(op.first + op.count - 1));
    for (std::int64_t k = 0; k < op.count; ++k) {
        CacheSpec spec = op.cache;
        spec.seed += static_cast<std::uint64_t>(k);
        const std::string id = op::fill_id(op.first + k);
        CacheContent content = expand(spec);
        const std::int64_t bytes = content_bytes(content);
        store_item(id, bytes, [&] { engine_.add(id, content, {}); }, [&] {
            added_specs_[id] = spec;
            audit_.store(id, audit_.new_object(std::move(content), Origin::stored_item, false));
        });
    }
    settle_evictions();
    return Fact{};
}

// ---- generation -----------------------------------------------------------------

std::optional<Fact> Transitions::generate(const HandleName& source, const Tokens& prompt, std::int64_t max, bool stream,
                                          std::int64_t out) {
    bool none = false;
    const std::optional<ObjectId> object = known_source(source.value, &none);
    if (!object && !none) return std::nullopt;
    checkers::Generated fact;
    // With no cache the engine starts one of its own layout: an engine
    // that takes no modern cache is never handed one.
    if (object) {
        fact.fresh = audit_.object(*object).content;
        if (const auto& fed = audit_.object(*object).fed) {
            fact.history = *fed;
            count_reuse();
        }
    } else {
        fact.fresh.layout = fresh_layout_;
    }
    if (!generation_compatible(fact.fresh) || prompt.empty()) return std::nullopt;
    if (out != 0 && !batching_free(fact.fresh)) return std::nullopt;
    fact.source = none ? 0 : source.value;
    fact.returned = out;
    fact.stream = stream;
    fact.owned = object && audit_.object(*object).expect_owned;
    fact.prompt = prompt;
    fact.max = max;
    if (fact.owned) {
        ++coverage_.generations_owned;
        coverage_.count(Shape::generation_from_owned);
    }
    // The sets alive while the model runs: the input's copy chain, plus the
    // boundary's copy when it must make one; of the chain, the trace still
    // holds at least the input itself and the levels it references.
    const bool copied = object && !fact.owned;
    if (object) {
        const Object& input = audit_.object(*object);
        fact.sets_max = input.chain_sets + (copied ? 1 : 0);
        fact.sets_min = 1 + audit_.referenced_levels(input.lineage) + (copied ? 1 : 0);
    } else {
        fact.sets_max = fact.sets_min = 1;
    }
    checkers::Copies sized;
    sized.bytes = 0;
    if (object) size_copies(audit_, *object, sized);
    if (out != 0) {
        fact.result = engine_.generate_returning(fact.source, prompt, max, out);
    } else {
        fact.result = engine_.generate(fact.source, prompt, max, stream);
    }
    if (fact.owned) {
        audit_.consumed(*object);
        // Another handle of this very cache (a turn's result and its owned
        // source are one cache) changed too: what was read of it is stale.
        for (const auto& [handle, bound] : audit_.handles()) {
            if (bound == object) readings_.forget_handle(handle);
        }
    }
    expect_copies(checkers::generation_text(fact), copied ? 1 : 0, 0);
    copies_.bytes = sized.bytes;
    copies_.bytes_shown = sized.bytes_shown;
    if (out != 0) bind_returned(fact, object, out);
    return fact;
}

// docs/semantics.md#returned-caches: the cache the model wrote into holds
// the source's K/V, then those of every token the model was fed. From an
// owned source it is that object itself (the source's handle and `out`
// hold one cache); otherwise a new owned cache, the boundary's copy (or
// the fresh cache of a generation from none). What the fed tokens' K/V
// are only the engine's model knows: fed_view gives them, from a fresh
// copy, as generate_fresh gives the tokens.
void Transitions::bind_returned(checkers::Generated& fact, std::optional<ObjectId> source, std::int64_t out) {
    Tokens fed = fact.history;
    if (fact.max > 0) {
        fed.insert(fed.end(), fact.prompt.begin(), fact.prompt.end());
        const Tokens& made = fact.result.tokens;
        if (!made.empty()) fed.insert(fed.end(), made.begin(), made.end() - 1);  // the last is never fed back
    }
    CacheView view = engine_.fed_view(fact.fresh, fed);
    ObjectId object = 0;
    if (fact.owned) {
        object = *source;
    } else {
        const bool copied = source.has_value();
        const std::int64_t chain = copied ? audit_.object(*source).chain_sets + 1 : 1;
        object = audit_.new_object(fact.fresh, Origin::clone, true, 0, chain, copied ? audit_.copy_lineage({*source}) : Lineage{});
    }
    audit_.set_fed(object, std::move(fed), std::move(view));
    audit_.bind(out, object);
    fact.returned = out;
    fact.returned_object = object;
}

template <>
std::optional<Fact> Transitions::apply(const op::Generate& op) { return generate(op.source, op.prompt, op.max, false); }

template <>
std::optional<Fact> Transitions::apply(const op::GenerateStream& op) { return generate(op.source, op.prompt, op.max, true); }

template <>
std::optional<Fact> Transitions::apply(const op::Turn& op) { return generate(op.source, op.prompt, op.max, false, op.out.value); }

// docs/semantics.md#returned-caches: the model's prefill over the prompt on
// a fresh cache, stored: the store's copy is read-only, and holds what a
// fresh cache fed the prompt holds.
template <>
std::optional<Fact> Transitions::apply(const op::Extract& op) {
    if (op.prompt.empty()) return std::nullopt;
    CacheContent fresh;
    fresh.layout = fresh_layout_;
    CacheView view = engine_.fed_view(fresh, op.prompt);
    const std::int64_t bytes = view_bytes(view);
    begin_stores("extract " + checkers::in_quotes(op.id));
    store_item(op.id, bytes, [&] { engine_.extract(op.id, op.prompt); }, [&] {
        const ObjectId object = audit_.new_object(std::move(fresh), Origin::stored_item, false);
        audit_.set_fed(object, op.prompt, std::move(view));
        added_specs_.erase(op.id);
        audit_.store(op.id, object);
        coverage_.count(Shape::extracted_memory);
    });
    settle_evictions();
    return Fact{};
}

// ---- dumps ------------------------------------------------------------------------

template <>
std::optional<Fact> Transitions::apply(const op::Dump& op) {
    engine_.dump(slots_.dir(op.slot));
    audit_.slots()[op.slot] = DumpSlot{{audit_.snapshot()}, false, false, {}};
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::DumpCrash& op) {
    engine_.dump_interrupted(slots_.dir(op.slot), op.bytes);
    coverage_.count(Shape::interrupted_dump);
    DumpSlot& slot = audit_.slots()[op.slot];
    if (slot.candidates.empty()) slot.may_be_absent = true;
    slot.candidates.push_back(audit_.snapshot());
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::Corrupt& op) {
    const std::optional<std::string> damage = slots_.corrupt(op.slot, op.offset, op.truncate != 0);
    if (!damage) return std::nullopt;
    coverage_.count(Shape::corrupted_dump);
    DumpSlot& slot = audit_.slots()[op.slot];
    slot.corrupted = true;
    slot.damage += (slot.damage.empty() ? "" : "; ") + *damage;
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::Load& op) {
    const Snapshot before = audit_.snapshot();
    checkers::Loaded fact;
    fact.slot = op.slot;
    fact.result = engine_.load(slots_.dir(op.slot));
    if (!fact.result.ok) coverage_.count(Shape::failed_load);
    added_specs_.clear();  // what the store holds now is a dump's
    readings_.drop_all();  // the store may hold other entries now
    readings_.begin_round();
    const auto found = audit_.slots().find(op.slot);
    fact.expected = found == audit_.slots().end() ? DumpSlot{} : found->second;
    if (!fact.result.ok || fact.expected.candidates.empty()) return fact;
    // The loaded store must be one of the dumps the slot may hold; the
    // expected store becomes that one.
    for (const Snapshot& candidate : fact.expected.candidates) {
        audit_.restore(candidate, readings_.capabilities().policy.listing);
        fact.difference = readings_.store_difference(false);  // the order is store-contract's to check
        if (fact.difference.empty()) {
            audit_.slots()[op.slot] = DumpSlot{{candidate}, fact.expected.corrupted, false, fact.expected.damage};
            fact.matched = true;
            return fact;
        }
    }
    audit_.restore(before);
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::DumpKill& op) {
    if (!fresh_engine_) return std::nullopt;  // nothing to load the crash states with
    DumpSlot& slot = audit_.slots()[op.slot];
    std::vector<std::string>& temporaries = audit_.temporaries()[op.slot];
    const Snapshot store = audit_.snapshot();
    durability::KillOutcome outcome =
        durability::run_kill_test({engine_, fresh_engine_, slots_.dir(op.slot), op.point, slot, temporaries, store});
    outcome.fact.slot = op.slot;
    // The slot holds what the kill left: the previous dump or this one.
    if (outcome.killed) {
        if (slot.candidates.empty()) slot.may_be_absent = true;
        slot.candidates.push_back(store);
    } else {
        slot.candidates = {store};
        slot.corrupted = false;
        slot.may_be_absent = false;
        slot.damage.clear();
    }
    temporaries = std::move(outcome.temporaries);
    return std::move(outcome.fact);
}

// ---- cache-level --------------------------------------------------------------------

template <>
std::optional<Fact> Transitions::apply(const op::Make& op) {
    CacheContent content = expand(op.cache);
    count_content(content);
    engine_.make(content, op.out.value);
    const ObjectId object = audit_.new_object(std::move(content), Origin::make, false);
    audit_.bind(op.out.value, object);
    return made(MadeBy::make, op.out.value, object);
}

template <>
std::optional<Fact> Transitions::apply(const op::Clone& op) {
    bool none = false;
    const std::optional<ObjectId> source = known_source(op.source.value, &none);
    if (!source) return std::nullopt;  // cloning nothing is not an operation of the API
    count_copy_of(audit_.object(*source).content);
    engine_.clone(op.source.value, op.out.value);
    checkers::Made fact = made(MadeBy::clone, op.out.value, std::nullopt);
    expect_copies_of("clone " + checkers::handle_text(op.source.value) + " -> " + checkers::handle_text(op.out.value), 1,
                  *source);
    fact.object = audit_.copy_object(*source, Origin::clone, true, audit_.object(*source).chain_sets + 1);
    fact.sources = {op.source.value};
    audit_.bind(op.out.value, fact.object);
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::Concat& op) {
    std::vector<CacheContent> parts;
    std::vector<std::int64_t> sources;
    std::vector<ObjectId> objects;
    std::int64_t deepest = 0;
    for (const HandleName& part : op.parts) {
        bool none = false;
        const std::optional<ObjectId> object = known_source(part.value, &none);
        if (!object && !none) return std::nullopt;
        if (!object) continue;
        if (audit_.object(*object).fed) return std::nullopt;  // its K/V only the model knows
        parts.push_back(audit_.object(*object).content);
        sources.push_back(part.value);
        objects.push_back(*object);
        deepest = std::max(deepest, audit_.object(*object).chain_sets);
    }
    if (parts.empty() || !merged_geometry_ok(parts)) return std::nullopt;
    std::vector<Handle> handles;
    for (const HandleName& part : op.parts) handles.push_back(part.value);
    const bool mixed = dtypes_mixed(parts);
    checkers::Made fact = made(MadeBy::concat, op.out.value, std::nullopt);
    fact.refused = run_merge(mixed, [&] { engine_.concat(handles, op.out.value); });
    fact.merged = parts.size() > 1;
    fact.sources = std::move(sources);
    if (fact.merged || fact.refused) count_merge(mixed, fact.refused.has_value());
    if (fact.refused) {
        refused_copies("concat -> " + checkers::handle_text(op.out.value));
        audit_.bind(op.out.value, std::nullopt);
        return fact;
    }
    fact.object = audit_.new_object(expected_concat(parts), Origin::concat, true, 0, deepest + 1, audit_.copy_lineage(objects));
    audit_.bind(op.out.value, fact.object);
    expect_copies_of("concat -> " + checkers::handle_text(op.out.value), 1, *fact.object);
    return fact;
}

std::optional<Fact> Transitions::convert(std::int64_t source_handle, std::int64_t out, Layout from) {
    bool none = false;
    const std::optional<ObjectId> source = known_source(source_handle, &none);
    if (!source || audit_.object(*source).content.layout != from || audit_.object(*source).fed) return std::nullopt;
    const CacheContent& content = audit_.object(*source).content;
    const bool to_legacy = from == Layout::modern;
    if (audit_.object(*source).expect_owned) coverage_.count(Shape::conversion_of_owned);
    if (to_legacy) {
        engine_.to_legacy(source_handle, out);
    } else {
        engine_.from_legacy(source_handle, out);
    }
    // to_legacy may alias its source (transformers does); from_legacy copies.
    const std::int64_t chain = audit_.object(*source).chain_sets;
    const ObjectId object = to_legacy
        ? audit_.new_object(expected_to_legacy(content), Origin::to_legacy, false, *source, chain)
        : audit_.new_object(expected_from_legacy(content), Origin::from_legacy, false, 0, chain + 1,
                            audit_.copy_lineage({*source}));
    audit_.bind(out, object);
    // from_legacy copies; to_legacy may alias its source or copy it.
    const std::string what = std::string(to_legacy ? "to_legacy " : "from_legacy ") + checkers::handle_text(source_handle) +
                             " -> " + checkers::handle_text(out);
    expect_copies_of(what, 1, object);
    if (to_legacy) copies_.min = 0;
    checkers::Made fact = made(to_legacy ? MadeBy::to_legacy : MadeBy::from_legacy, out, object);
    fact.sources = {source_handle};
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::ToLegacy& op) { return convert(op.source.value, op.out.value, Layout::modern); }

template <>
std::optional<Fact> Transitions::apply(const op::FromLegacy& op) { return convert(op.source.value, op.out.value, Layout::legacy); }

template <>
std::optional<Fact> Transitions::apply(const op::Release& op) {
    if (!audit_.handle_created(op.handle.value)) return std::nullopt;
    if (const std::optional<ObjectId> object = audit_.handle(op.handle.value)) {
        const Object& released = audit_.object(*object);
        if (released.origin == Origin::stored_item) coverage_.count(Shape::release_borrowed);
        if (released.expect_owned) coverage_.count(Shape::release_owned);
    }
    engine_.release(op.handle.value);
    audit_.release(op.handle.value);
    return Fact{};
}

// ---- trimming (docs/semantics.md#trimming) ----------------------------------------

namespace {

// The tokens every present slot of `content` holds, when all hold the same
// number and every layer is initialized with keys and values in their
// modern-named slots (or legacy lists): the start of a cache the model made
// that a trim may cut into, since the model's updates appended to exactly
// those slots (a plain start whose layers the model fed all, checked on its
// expected view: holds_uniformly). nullopt otherwise.
std::optional<std::int64_t> plain_tokens(const CacheContent& content) {
    std::optional<std::int64_t> tokens;
    for (const LayerContent& layer : content.layers) {
        if (!layer.initialized || !layer.slots[keys].present || !layer.slots[values].present) return std::nullopt;
        if (layer.slots[key_cache].present || layer.slots[value_cache].present) return std::nullopt;
        for (const Slot side : {keys, values}) {
            const std::int64_t held = layer.slots[side].tokens();
            if (tokens && *tokens != held) return std::nullopt;
            tokens = held;
        }
    }
    return tokens.value_or(0);
}

// Does every layer of `view` hold `tokens` keys and values, in their own
// slots? A model may add layers to what a cache started with (the
// decoder's layer count), which then hold the fed tokens only: a cut of
// such a cache is not a prefix of one sequence, and is not run.
bool holds_uniformly(const CacheView& view, std::int64_t tokens) {
    for (const LayerView& layer : view.layers) {
        if (!layer.initialized || layer.slots[key_cache].present || layer.slots[value_cache].present) return false;
        for (const Slot side : {keys, values}) {
            const SlotView& slot = layer.slots[side];
            if (!slot.present || slot.shape.size() != 4 || slot.shape[2] != tokens) return false;
        }
    }
    return true;
}

std::int64_t most_tokens(const CacheContent& content) {
    std::int64_t most = 0;
    for (const LayerContent& layer : content.layers) {
        for (const SlotContent& slot : layer.slots) most = std::max(most, slot.tokens());
    }
    return most;
}

}  // namespace

// A cache the caller owns, cut to its first `keep` tokens in place. A
// stored item, a view of another cache and a cache whose content a model
// changed unseen are never trimmed (the first two are read-only, the last
// unknown). A cache the model made holds what it started from and the
// tokens fed since: the cut keeps a prefix of both, and what it must hold
// is the engine's model's view of a fresh copy fed the tokens kept.
template <>
std::optional<Fact> Transitions::apply(const op::Trim& op) {
    bool none = false;
    const std::optional<ObjectId> object = known_source(op.handle.value, &none);
    if (!object) return std::nullopt;
    const Object& before = audit_.object(*object);
    if (!before.expect_owned || before.origin == Origin::stored_item || before.alias_parent != 0) return std::nullopt;
    checkers::Trimmed fact;
    fact.handle = op.handle.value;
    fact.object = *object;
    fact.keep = op.keep;
    CacheContent content = before.content;
    std::optional<Tokens> fed = before.fed;
    std::optional<CacheView> view;
    if (fed) {
        const std::optional<std::int64_t> start = plain_tokens(content);
        if (!start) return std::nullopt;
        fact.tokens_before = *start + static_cast<std::int64_t>(fed->size());
        if (!holds_uniformly(audit_.view_of(*object), fact.tokens_before)) return std::nullopt;
        if (op.keep < *start) {
            content = expected_trim(content, op.keep);
            fed->clear();
        } else if (op.keep - *start < static_cast<std::int64_t>(fed->size())) {
            fed->resize(static_cast<std::size_t>(op.keep - *start));
        }
        view = engine_.fed_view(content, *fed);
    } else {
        fact.tokens_before = most_tokens(content);
        content = expected_trim(content, op.keep);
    }
    // docs/semantics.md#store-windows: once a cache held its window, the
    // tokens before it may be gone, and a windowed engine may refuse the
    // cut (mlx-lm's RotatingKVCache.is_trimmable): never asked of it.
    if (audit_.window() > 0 && fact.tokens_before >= audit_.window()) return std::nullopt;
    engine_.trim(op.handle.value, op.keep);
    audit_.trimmed(*object, std::move(content), std::move(fed), std::move(view));
    // Every handle of this cache, and of a view aliasing it, reads anew.
    for (const auto& [handle, bound] : audit_.handles()) {
        if (bound && (*bound == *object || audit_.object(*bound).alias_parent == *object)) readings_.forget_handle(handle);
    }
    return fact;
}

// ---- batches (docs/semantics.md#batches) -----------------------------------------

namespace {

// Can these views be stacked into one batch? Each holds one row of the
// same geometry: modern, every layer initialized with keys and values in
// their own slots, each slot 4-dimensional with batch 1 and a token at
// least (a copy of no element shows no copy), every row's slot of the
// same shape and dtype as the first row's.
bool stackable(const std::vector<CacheView>& rows) {
    const CacheView& first = rows.front();
    for (const CacheView& row : rows) {
        if (row.layout != Layout::modern || row.layers.size() != first.layers.size()) return false;
        for (std::size_t i = 0; i < row.layers.size(); ++i) {
            const LayerView& layer = row.layers[i];
            if (!layer.initialized || layer.slots[key_cache].present || layer.slots[value_cache].present) return false;
            for (const Slot side : {keys, values}) {
                const SlotView& slot = layer.slots[side];
                const SlotView& model = first.layers[i].slots[side];
                if (!slot.present || slot.shape.size() != 4 || slot.shape[0] != 1 || slot.shape[2] < 1) return false;
                if (slot.shape != model.shape || slot.dtype != model.dtype) return false;
            }
        }
    }
    return !first.layers.empty();
}

std::string batch_text(const op::Batch& op) {
    std::string text = "batch";
    for (const HandleName& row : op.rows) text += " " + checkers::handle_text(row.value);
    text += " repeat=" + std::to_string(op.repeat);
    if (!op.reorder.empty()) {
        text += " reorder=";
        for (std::size_t i = 0; i < op.reorder.size(); ++i) text += (i ? "," : "") + std::to_string(op.reorder[i]);
    }
    return text + " select=" + std::to_string(op.select) + " -> " + checkers::handle_text(op.out.value);
}

}  // namespace

// Caches the caller owns, stacked as the rows of one batch; the row handed
// out is a new cache the caller owns holding exactly the row it came from
// (a cache the model made stays one: what it started from and the tokens
// fed). Stored items, views of other caches and caches a generation
// changed unseen are not stacked (read-only, or unknown).
template <>
std::optional<Fact> Transitions::apply(const op::Batch& op) {
    std::vector<ObjectId> objects;
    std::vector<CacheView> views;
    std::vector<std::int64_t> sources;
    std::int64_t deepest = 0;
    for (const HandleName& row : op.rows) {
        bool none = false;
        const std::optional<ObjectId> object = known_source(row.value, &none);
        if (!object) return std::nullopt;
        const Object& held = audit_.object(*object);
        if (!held.expect_owned || held.origin == Origin::stored_item || held.alias_parent != 0) return std::nullopt;
        objects.push_back(*object);
        sources.push_back(row.value);
        deepest = std::max(deepest, held.chain_sets);
    }
    for (const ObjectId object : objects) views.push_back(audit_.view_of(object));
    if (!stackable(views)) return std::nullopt;
    const ObjectId from = objects[op.source_row()];
    std::vector<Handle> rows(sources.begin(), sources.end());
    engine_.batch_row(rows, op.repeat, op.reorder, op.select, op.out.value);
    checkers::Made fact = made(MadeBy::batch, op.out.value, std::nullopt);
    fact.how = batch_text(op);
    fact.sources = std::move(sources);
    // Copied before new_object, which may move the objects it holds.
    CacheContent content = audit_.object(from).content;
    const std::optional<Tokens> fed = audit_.object(from).fed;
    const std::optional<CacheView> view = audit_.object(from).view;
    const ObjectId object = audit_.new_object(std::move(content), Origin::clone, true, 0, deepest + 1, audit_.copy_lineage(objects));
    if (fed) audit_.set_fed(object, *fed, *view);
    fact.object = object;
    audit_.bind(op.out.value, object);
    // The row handed out is new K/V: a copy at least. How many more the
    // stacking, repeat, reorder and select make, and of what size, is the
    // engine's (transformers copies at each step; docs/semantics.md#batches).
    copies_.what = fact.how;
    copies_.min = 1;
    copies_.max = std::numeric_limits<std::size_t>::max();
    return fact;
}

// After every specialization above: one missing for an operation of the
// variant fails to link.
std::optional<Fact> Transitions::apply(const Op& operation) {
    copies_ = checkers::Copies{};
    evicted_.reset();
    copies_.what = op_name(operation);  // an operation that copies nothing
    if (lease_ttl_ms() > 0) return apply_under_leases(operation);
    return std::visit([this](const auto& op) { return apply(op); }, operation);
}

}  // namespace kvcheck
