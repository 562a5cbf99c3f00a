// The paged family's transitions: each reads the pool (PagedEngine::
// paged_state), runs the operation, reads the pool again, and returns the
// fact the paged checkers judge (checkers::Paged). The expected state they
// keep is the sequences alive and what each must hold; an operation naming
// a sequence that is not alive (or creating one that is) is skipped, as an
// operation naming an unknown handle is.
#include "run/transitions.h"

#include "kvcheck/paged.h"

#include <stdexcept>

namespace kvcheck {
namespace {

using checkers::Paged;
using checkers::PagedBy;

PagedEngine& paged_of(Engine& engine) {
    PagedEngine* paged = engine.paged();
    if (paged == nullptr) throw std::logic_error("the engine claims Capabilities::paged but paged() is null");
    return *paged;
}

Paged fact_of(PagedBy by, const Op& op) {
    Paged fact;
    fact.by = by;
    fact.what = format_op(op);
    return fact;
}

// A contiguous cache a paged pool can take: modern, every layer holding
// keys and values of one length, at least one token.
bool importable(const CacheContent& content) {
    if (content.layout != Layout::modern || content.layers.empty()) return false;
    const std::int64_t length = logical_slot(content, 0, keys).tokens();
    if (length < 1) return false;
    for (std::size_t i = 0; i < content.layers.size(); ++i) {
        const LayerContent& layer = content.layers[i];
        if (!layer.initialized || !layer.slots[keys].present || !layer.slots[values].present) return false;
        if (layer.slots[key_cache].present || layer.slots[value_cache].present) return false;
        if (logical_slot(content, i, keys).tokens() != length || logical_slot(content, i, values).tokens() != length) {
            return false;
        }
    }
    return true;
}

}  // namespace

// Runs a paged operation between two readings of the pool. A refusal (an
// exception) is the fact's when the operation may refuse, else an error
// of the step.
template <typename Call>
std::optional<Fact> Transitions::run_paged(Paged fact, bool may_refuse, Call&& call) {
    PagedEngine& paged = paged_of(engine_);
    fact.before = paged.paged_state();
    fact.blocks = static_cast<std::int64_t>(fact.before.blocks.size());
    if (may_refuse) {
        try {
            call(paged, fact);
        } catch (const std::exception& error) {
            fact.refused = error.what();
        }
    } else {
        call(paged, fact);
    }
    fact.after = paged.paged_state();
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedAlloc& op) {
    if (paged_sequences_.count(op.seq) != 0) return std::nullopt;
    Paged fact = fact_of(PagedBy::alloc, op);
    fact.seq = op.seq;
    fact.tokens = op.tokens;
    fact.salt = op.salt;
    std::optional<Fact> result = run_paged(std::move(fact), true, [&op](PagedEngine& paged, Paged& f) {
        f.cached = paged.paged_alloc(op.seq, op.tokens, op.salt);
    });
    if (!std::get<Paged>(*result).refused) paged_sequences_[op.seq] = PagedSequence{std::nullopt, true, op.salt};
    return result;
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedAppend& op) {
    const auto at = paged_sequences_.find(op.seq);
    if (at == paged_sequences_.end()) return std::nullopt;
    Paged fact = fact_of(PagedBy::append, op);
    fact.seq = op.seq;
    fact.decoded_exported = paged_of(engine_).paged_decode_exported(op.seq, op.count);
    std::optional<Fact> result = run_paged(std::move(fact), true, [&op](PagedEngine& paged, Paged& f) {
        f.appended = paged.paged_append(op.seq, op.count);
    });
    if (!std::get<Paged>(*result).refused) at->second.imported.reset();  // no longer exactly what was imported
    return result;
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedFork& op) {
    const auto parent = paged_sequences_.find(op.parent);
    if (parent == paged_sequences_.end() || paged_sequences_.count(op.child) != 0) return std::nullopt;
    Paged fact = fact_of(PagedBy::fork, op);
    fact.seq = op.child;
    fact.parent = op.parent;
    const PagedSequence copy = parent->second;
    std::optional<Fact> result = run_paged(std::move(fact), true, [&op](PagedEngine& paged, Paged&) {
        paged.paged_fork(op.parent, op.child);
    });
    if (!std::get<Paged>(*result).refused) paged_sequences_[op.child] = copy;
    return result;
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedFree& op) {
    if (paged_sequences_.count(op.seq) == 0) return std::nullopt;
    Paged fact = fact_of(PagedBy::free, op);
    fact.seq = op.seq;
    std::optional<Fact> result = run_paged(std::move(fact), false, [&op](PagedEngine& paged, Paged&) {
        paged.paged_free(op.seq);
    });
    paged_sequences_.erase(op.seq);
    return result;
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedLookup& op) {
    Paged fact = fact_of(PagedBy::lookup, op);
    fact.tokens = op.tokens;
    fact.salt = op.salt;
    return run_paged(std::move(fact), false, [&op](PagedEngine& paged, Paged& f) {
        f.cached = paged.paged_lookup(op.tokens, op.salt);
    });
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedEvict& op) {
    return run_paged(fact_of(PagedBy::evict, op), false, [](PagedEngine& paged, Paged&) { paged.paged_evict(); });
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedReset& op) {
    if (!paged_sequences_.empty()) return std::nullopt;
    if (!paged_of(engine_).paged_state().copies.empty()) return std::nullopt;  // a step must end them first
    return run_paged(fact_of(PagedBy::reset, op), false, [](PagedEngine& paged, Paged&) { paged.paged_reset(); });
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedStep& op) {
    return run_paged(fact_of(PagedBy::step, op), false, [](PagedEngine& paged, Paged&) { paged.paged_step(); });
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedImport& op) {
    if (paged_sequences_.count(op.seq) != 0) return std::nullopt;
    CacheContent content = expand(op.cache);
    if (!importable(content)) return std::nullopt;
    Paged fact = fact_of(PagedBy::import, op);
    fact.seq = op.seq;
    std::optional<Fact> result = run_paged(std::move(fact), true, [&op, &content](PagedEngine& paged, Paged&) {
        paged.paged_import(op.seq, content);
    });
    if (!std::get<Paged>(*result).refused) paged_sequences_[op.seq] = PagedSequence{std::move(content), false};
    return result;
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedExport& op) {
    const auto at = paged_sequences_.find(op.seq);
    if (at == paged_sequences_.end()) return std::nullopt;
    Paged fact = fact_of(PagedBy::exported, op);
    fact.seq = op.seq;
    fact.imported = at->second.imported;
    fact.computed = at->second.computed;
    fact.salt = at->second.salt;
    return run_paged(std::move(fact), false, [&op](PagedEngine& paged, Paged& f) {
        f.exported = paged.paged_export(op.seq);
    });
}

template <>
std::optional<Fact> Transitions::apply(const op::PagedRewind& op) {
    const auto at = paged_sequences_.find(op.seq);
    if (at == paged_sequences_.end()) return std::nullopt;
    Paged fact = fact_of(PagedBy::rewind, op);
    fact.seq = op.seq;
    fact.dropped = op.count;
    std::optional<Fact> result = run_paged(std::move(fact), true, [&op](PagedEngine& paged, Paged&) {
        paged.paged_rewind(op.seq, op.count, op.token);
    });
    if (!std::get<Paged>(*result).refused) at->second.imported.reset();  // no longer exactly what was imported
    return result;
}

}  // namespace kvcheck
