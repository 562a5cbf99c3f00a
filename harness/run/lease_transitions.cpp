// The transitions of kvcheck's virtual clock and read leases (op::Tick,
// op::Lease, op::Unlease; docs/semantics.md#leases), and the judgement of
// every other operation by the leases on the entries it would remove or
// replace. The expected leases are kept here from the trace alone: a lease
// taken at t lives while the clock is below t + the declared TTL, and each
// lease on an entry moves its expiry to now + TTL (LMCache's TTLLock).
// Nothing here judges: each call becomes a Leased fact that lease-respected
// checks (harness/checkers/lease_respected.cpp).
#include "run/transitions.h"

#include <boost/pfr.hpp>

#include <type_traits>

namespace kvcheck {
namespace {

std::string at_ms(std::int64_t ms) { return "t=" + std::to_string(ms) + " ms"; }

}  // namespace

template <>
std::optional<Fact> Transitions::apply(const op::Tick& op) {
    engine_.advance_clock(op.ms);
    clock_ms_ += op.ms;
    return Fact{};
}

template <>
std::optional<Fact> Transitions::apply(const op::Lease& op) {
    checkers::Leased fact;
    fact.what = "lease " + checkers::in_quotes(op.id);
    fact.now_ms = clock_ms_;
    fact.refusal_due = !audit_.entry(op.id);
    fact.why = fact.refusal_due ? "nothing is stored under it" : "it is stored";
    try {
        engine_.lease(op.id);
    } catch (const std::exception& error) {
        fact.refused = error.what();
    }
    if (!fact.refused && !fact.refusal_due) {
        LeaseRecord& record = leases_[op.id];
        record.count = record.live(clock_ms_) ? record.count + 1 : 1;
        record.until_ms = clock_ms_ + lease_ttl_ms();
    }
    return fact;
}

template <>
std::optional<Fact> Transitions::apply(const op::Unlease& op) {
    checkers::Leased fact;
    fact.what = "unlease " + checkers::in_quotes(op.id);
    fact.now_ms = clock_ms_;
    const auto found = leases_.find(op.id);
    const bool live = found != leases_.end() && found->second.live(clock_ms_);
    fact.refusal_due = !live;
    if (live) {
        fact.why = "it holds " + std::to_string(found->second.count) + " live lease(s), until " + at_ms(found->second.until_ms);
    } else if (found != leases_.end() && found->second.count > 0) {
        fact.why = "its lease expired at " + at_ms(found->second.until_ms) + " (a finish after expiry is refused)";
    } else {
        fact.why = "it holds no lease";
    }
    try {
        engine_.unlease(op.id);
    } catch (const std::exception& error) {
        fact.refused = error.what();
    }
    if (!fact.refused && live) --found->second.count;
    return fact;
}

// The stored ids `operation` would remove or replace: those it names when
// it replaces what it names, the whole store's when it replaces the whole
// store, a fill's items.
std::vector<std::string> Transitions::replaced_ids(const Op& operation) const {
    std::vector<std::string> ids;
    std::visit(
        [&](const auto& o) {
            using O = std::decay_t<decltype(o)>;
            if constexpr (std::is_same_v<O, op::Fill>) {
                for (std::int64_t k = 0; k < o.count; ++k) ids.push_back(op::fill_id(o.first + k));
            } else if constexpr (O::reach == StoreReach::whole_store && O::changes_ids) {
                ids = audit_.order();
            } else if constexpr (O::reach == StoreReach::replaces_named) {
                boost::pfr::for_each_field(o, [&ids](const auto& field) {
                    using F = std::decay_t<decltype(field)>;
                    if constexpr (std::is_same_v<F, std::string>) ids.push_back(field);
                    if constexpr (std::is_same_v<F, Ids>) ids.insert(ids.end(), field.begin(), field.end());
                });
            }
        },
        operation);
    return ids;
}

// An operation that would remove or replace an entry holding a lease must
// be refused whole while the lease is live, and must not be refused for
// it once the lease expired. One touching no leased entry runs as any.
std::optional<Fact> Transitions::apply_under_leases(const Op& operation) {
    // Runs it, then lets go of the leases of the entries it removed.
    const auto run = [&] {
        std::optional<Fact> done = std::visit([this](const auto& op) { return apply(op); }, operation);
        for (auto it = leases_.begin(); it != leases_.end();) it = audit_.entry(it->first) ? std::next(it) : leases_.erase(it);
        return done;
    };
    checkers::Leased fact;
    fact.what = format_op(operation);
    fact.now_ms = clock_ms_;
    bool leased = false;
    for (const std::string& id : replaced_ids(operation)) {
        const auto found = leases_.find(id);
        if (found == leases_.end() || found->second.count == 0 || !audit_.entry(id)) continue;
        leased = true;
        const LeaseRecord& record = found->second;
        if (!fact.why.empty()) fact.why += "; ";
        if (record.live(clock_ms_)) {
            fact.refusal_due = true;
            fact.why += checkers::in_quotes(id) + " holds " + std::to_string(record.count) + " live lease(s), until " +
                        at_ms(record.until_ms);
        } else {
            fact.why += "the lease on " + checkers::in_quotes(id) + " expired at " + at_ms(record.until_ms);
        }
    }
    if (!leased) return run();
    std::optional<Fact> done;
    try {
        done = run();
    } catch (const std::exception& error) {
        fact.refused = error.what();
    }
    if (!fact.refused && !done) return std::nullopt;  // not run: the transition skipped it
    if (fact.refused || fact.refusal_due) return Fact{fact};
    return done;
}

}  // namespace kvcheck
