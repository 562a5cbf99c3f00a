#include "run/transitions.h"

#include "durability/dump_kill.h"

#include <algorithm>

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

checkers::Made made(MadeBy by, std::int64_t out, std::optional<ObjectId> object) {
    checkers::Made fact;
    fact.by = by;
    fact.out = out;
    fact.object = object;
    return fact;
}

}  // namespace

std::optional<std::size_t> Transitions::copies() {
    if (!read_copies_) return std::nullopt;
    return engine_.take_copies().size();
}

void Transitions::count_layout(Layout layout) {
    (layout == Layout::modern ? coverage_.modern_caches : coverage_.legacy_caches) += 1;
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

// ---- the store ------------------------------------------------------------------

template <>
std::optional<Fact> Transitions::apply(const op::Add& op) {
    CacheContent content = expand(op.cache);
    count_layout(content.layout);
    engine_.add(op.id, content);
    audit_.store(op.id, audit_.new_object(std::move(content), Origin::stored_item, false));
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::AddHandle& op) {
    bool none = false;
    const std::optional<ObjectId> object = known_source(op.handle.value, &none);
    // Storing a conversion's view of another cache is outside the contract.
    if (!object || audit_.object(*object).alias_parent != 0) return std::nullopt;
    engine_.add_handle(op.id, op.handle.value);
    audit_.store(op.id, *object);
    audit_.object(*object).origin = Origin::stored_item;
    checkers::Made fact = made(MadeBy::stored_back, op.handle.value, object);
    fact.id = op.id;
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::Get& op) {
    engine_.get(op.id, op.out.value);
    const std::optional<ObjectId> entry = audit_.entry(op.id);
    audit_.bind(op.out.value, entry);
    checkers::Made fact = made(MadeBy::get, op.out.value, entry);
    fact.id = op.id;
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::GetByIds& op) {
    return checkers::GotByIds{op.ids, engine_.get_by_ids(op.ids)};
}

template <>
std::optional<Fact> Transitions::apply(const op::GetAll&) { return checkers::GotAll{engine_.get_all_ids()}; }

template <>
std::optional<Fact> Transitions::apply(const op::GetCache& op) {
    std::vector<ObjectId> parts;  // the entries that hold tokens
    for (const std::string& id : op.ids) {
        const std::optional<ObjectId> entry = audit_.entry(id);
        if (entry && content_holds_tokens(audit_.object(*entry).content)) parts.push_back(*entry);
    }
    copies();
    engine_.get_cache(op.ids, op.out.value);
    checkers::Made fact = made(MadeBy::get_cache, op.out.value, std::nullopt);
    fact.copies = copies();
    fact.ids = op.ids.size();
    if (parts.empty()) {
        audit_.bind(op.out.value, std::nullopt);
        return fact;
    }
    fact.merged = parts.size() > 1;
    if (fact.merged) {
        ++coverage_.merges;
        std::vector<CacheContent> contents;
        for (const ObjectId part : parts) contents.push_back(audit_.object(part).content);
        fact.object = audit_.new_object(expected_concat(contents), Origin::get_cache, true, 0, 2);
    } else {
        fact.object = audit_.copy_object(parts.front(), Origin::get_cache, true, 2);
    }
    audit_.bind(op.out.value, fact.object);
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::Delete& op) {
    engine_.remove(op.ids);
    for (const std::string& id : op.ids) {
        audit_.remove(id);
        readings_.drop(id);
    }
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::DeleteAll&) {
    engine_.remove_all();
    audit_.remove_all();
    readings_.drop_all();
    return Fact{};
}

// ---- generation -----------------------------------------------------------------

std::optional<Fact> Transitions::generate(const HandleName& source, const Tokens& prompt, std::int64_t max, bool stream) {
    bool none = false;
    const std::optional<ObjectId> object = known_source(source.value, &none);
    if (!object && !none) return std::nullopt;
    checkers::Generated fact;
    fact.fresh = object ? audit_.object(*object).content : CacheContent{};
    if (!generation_compatible(fact.fresh) || prompt.empty()) return std::nullopt;
    fact.source = none ? 0 : source.value;
    fact.stream = stream;
    fact.owned = object && audit_.object(*object).expect_owned;
    fact.prompt = prompt;
    fact.max = max;
    if (fact.owned) ++coverage_.generations_owned;
    copies();
    fact.result = engine_.generate(fact.source, prompt, max, stream);
    fact.copies = copies();
    if (fact.owned) audit_.consumed(*object);
    fact.copies_expected = (object && !fact.owned) ? 1 : 0;
    // The sets alive while the model runs: the input's copy chain, plus the
    // boundary's copy when it must make one.
    fact.sets_max = (object ? audit_.object(*object).chain_sets : 0) + 1 - (fact.owned ? 1 : 0);
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::Generate& op) { return generate(op.source, op.prompt, op.max, false); }

template <>
std::optional<Fact> Transitions::apply(const op::GenerateStream& op) { return generate(op.source, op.prompt, op.max, true); }

// ---- dumps ------------------------------------------------------------------------

template <>
std::optional<Fact> Transitions::apply(const op::Dump& op) {
    engine_.dump(slots_.dir(op.slot));
    audit_.slots()[op.slot] = DumpSlot{{audit_.snapshot()}, false, false};
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::DumpCrash& op) {
    engine_.dump_interrupted(slots_.dir(op.slot), op.bytes);
    DumpSlot& slot = audit_.slots()[op.slot];
    if (slot.candidates.empty()) slot.may_be_absent = true;
    slot.candidates.push_back(audit_.snapshot());
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::Corrupt& op) {
    if (!slots_.corrupt(op.slot, op.offset, op.truncate != 0)) return std::nullopt;
    audit_.slots()[op.slot].corrupted = true;
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::Load& op) {
    const Snapshot before = audit_.snapshot();
    checkers::Loaded fact;
    fact.slot = op.slot;
    fact.result = engine_.load(slots_.dir(op.slot));
    readings_.drop_all();  // the store may hold other entries now
    readings_.begin_round();
    const auto found = audit_.slots().find(op.slot);
    fact.expected = found == audit_.slots().end() ? DumpSlot{} : found->second;
    if (!fact.result.ok || fact.expected.candidates.empty()) return fact;
    // The loaded store must be one of the dumps the slot may hold; the
    // expected store becomes that one.
    for (const Snapshot& candidate : fact.expected.candidates) {
        audit_.restore(candidate);
        fact.difference = readings_.store_difference(false);  // the order is store-contract's to check
        if (fact.difference.empty()) {
            audit_.slots()[op.slot] = DumpSlot{{candidate}, fact.expected.corrupted, false};
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
    }
    temporaries = std::move(outcome.temporaries);
    return std::move(outcome.fact);
}

// ---- cache-level --------------------------------------------------------------------

template <>
std::optional<Fact> Transitions::apply(const op::Make& op) {
    CacheContent content = expand(op.cache);
    count_layout(content.layout);
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
    engine_.clone(op.source.value, op.out.value);
    checkers::Made fact = made(MadeBy::clone, op.out.value, std::nullopt);
    fact.copies = copies();
    fact.object = audit_.copy_object(*source, Origin::clone, true, audit_.object(*source).chain_sets + 1);
    fact.sources = {op.source.value};
    audit_.bind(op.out.value, fact.object);
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::Concat& op) {
    std::vector<CacheContent> parts;
    std::vector<std::int64_t> sources;
    std::int64_t deepest = 0;
    for (const HandleName& part : op.parts) {
        bool none = false;
        const std::optional<ObjectId> object = known_source(part.value, &none);
        if (!object && !none) return std::nullopt;
        if (!object) continue;
        parts.push_back(audit_.object(*object).content);
        sources.push_back(part.value);
        deepest = std::max(deepest, audit_.object(*object).chain_sets);
    }
    if (parts.empty()) return std::nullopt;
    std::vector<Handle> handles;
    for (const HandleName& part : op.parts) handles.push_back(part.value);
    engine_.concat(handles, op.out.value);
    checkers::Made fact = made(MadeBy::concat, op.out.value, std::nullopt);
    fact.copies = copies();
    fact.merged = parts.size() > 1;
    if (fact.merged) ++coverage_.merges;
    fact.object = audit_.new_object(expected_concat(parts), Origin::concat, true, 0, deepest + 1);
    fact.sources = std::move(sources);
    audit_.bind(op.out.value, fact.object);
    return fact;
}

std::optional<Fact> Transitions::convert(std::int64_t source_handle, std::int64_t out, Layout from) {
    bool none = false;
    const std::optional<ObjectId> source = known_source(source_handle, &none);
    if (!source || audit_.object(*source).content.layout != from) return std::nullopt;
    const CacheContent& content = audit_.object(*source).content;
    const bool to_legacy = from == Layout::modern;
    if (to_legacy) {
        engine_.to_legacy(source_handle, out);
    } else {
        engine_.from_legacy(source_handle, out);
    }
    // to_legacy may alias its source (transformers does); from_legacy copies.
    const std::int64_t chain = audit_.object(*source).chain_sets;
    const ObjectId object = to_legacy
        ? audit_.new_object(expected_to_legacy(content), Origin::to_legacy, false, *source, chain)
        : audit_.new_object(expected_from_legacy(content), Origin::from_legacy, false, 0, chain + 1);
    audit_.bind(out, object);
    return made(to_legacy ? MadeBy::to_legacy : MadeBy::from_legacy, out, object);
}

template <>
std::optional<Fact> Transitions::apply(const op::ToLegacy& op) { return convert(op.source.value, op.out.value, Layout::modern); }

template <>
std::optional<Fact> Transitions::apply(const op::FromLegacy& op) { return convert(op.source.value, op.out.value, Layout::legacy); }

// After every specialization above: one missing for an operation of the
// variant fails to link.
std::optional<Fact> Transitions::apply(const Op& operation) {
    return std::visit([this](const auto& op) { return apply(op); }, operation);
}

}  // namespace kvcheck
