// lookup-exact (paged): the cached tokens a lookup reports, and those an
// alloc reports, are the longest chain of the request's full blocks
// (ending before its last token) that the prefix index held before the
// operation: block i's key is (the identity of block i - 1's key, 0 for
// the first; the block's B tokens; the request's extra keys), and each key
// maps to at least one block. So a lookup that stops short (always 0, a
// cached free block not counted) or counts past a miss is caught, and an
// alloc that hits less than it could.
//
// A key's parent is an opaque number (the engine's chain hash), and a
// salt's extra keys are the engine's own string: neither is computed
// here. They are learnt from the pool as the engine reports it after each
// paged operation: two keyed blocks next to each other in a table say the
// identity of the first's key (the second's parent); a keyed block at
// position i of the table of a sequence allocated with salt X says the
// extra keys of salt X at position i (an engine may key a salt into the
// first block only, as vLLM does its cache salt). What is
// not learnt (or learnt two ways: a buggy engine) is not assumed, so the
// check is one-sided there: the reported chain must be possible (each of
// its blocks' tokens indexed under keys that may be its own) and at least
// as long as the part of the chain known to be indexed.
//
// Checked: at each lookup and successful alloc, against the index before it.
// Not checked here: that the hit blocks hold the model's K/V
// (prefix-hit-exact) or are the ones attached (hit-consumed).
#include "checkers/checker.h"

#include <map>
#include <optional>
#include <utility>

namespace kvcheck::checkers {
namespace {

// A value learnt from the engine's reports: unset, known, or seen two
// ways (then never used).
template <typename Value>
struct Learnt {
    std::optional<Value> value;
    bool conflicting = false;
    void see(const Value& seen) {
        if (value && *value != seen) conflicting = true;
        value = seen;
    }
    std::optional<Value> get() const { return conflicting ? std::nullopt : value; }
};

// Orders keys for the maps below (PagedKey has no order of its own).
struct KeyLess {
    bool operator()(const PagedKey& a, const PagedKey& b) const {
        if (a.parent != b.parent) return a.parent < b.parent;
        if (a.tokens != b.tokens) return a.tokens < b.tokens;
        return a.extra < b.extra;
    }
};

class LookupExact final : public Checker {
  public:
    LookupExact() : Checker(Property::lookup_exact) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        if ((fact.by == PagedBy::lookup || fact.by == PagedBy::alloc) && !fact.refused) judge(fact, probe);
        if (fact.by == PagedBy::alloc && !fact.refused) salt_of_[fact.seq] = fact.salt;
        if (fact.by == PagedBy::fork && !fact.refused && salt_of_.count(fact.parent) != 0) salt_of_[fact.seq] = salt_of_[fact.parent];
        learn(fact.after);
    }

  private:
    // The bounds of the chain a request may hit, in blocks.
    struct Chain {
        std::int64_t known = 0;     // its first `known` blocks are indexed, for certain
        std::int64_t possible = 0;  // no more than `possible` blocks can be
    };

    void judge(const Paged& fact, Probe& probe) const {
        const std::int64_t b = fact.before.block_tokens;
        const auto length = static_cast<std::int64_t>(fact.tokens.size());
        if (b < 1 || fact.cached < 0 || fact.cached % b != 0 || fact.cached >= length) return;  // prefix-hit-exact's
        const Chain chain = chain_of(fact.before, fact.tokens, fact.salt);
        const std::int64_t hit = fact.cached / b;
        expect(probe, chain.known <= hit && hit <= chain.possible, [&] {
            const bool short_of = hit < chain.known;
            return fact.what + " reported " + std::to_string(fact.cached) + " cached tokens; the index before it " +
                   (short_of ? "held the chain of its first " + std::to_string(chain.known * b) + " tokens"
                             : "held no chain past its first " + std::to_string(chain.possible * b) + " tokens") +
                   " (" + chain_text(fact.before, fact.tokens, short_of ? chain.known : chain.possible + 1) + ")";
        });
    }

    // Walks the request's blocks through the index.
    Chain chain_of(const PagedState& state, const Tokens& tokens, std::int64_t salt) const {
        const std::int64_t b = state.block_tokens;
        const auto hittable = static_cast<std::int64_t>((tokens.size() - 1) / static_cast<std::size_t>(b));
        Chain chain;
        std::optional<std::uint64_t> parent = 0;
        bool certain = true;
        for (std::int64_t i = 0; i < hittable; ++i) {
            const Tokens chunk(tokens.begin() + i * b, tokens.begin() + (i + 1) * b);
            const auto salted = extra_of_.find({salt, i});
            const std::optional<std::string> extra = salted == extra_of_.end() ? std::nullopt : salted->second.get();
            std::optional<PagedKey> found;  // the one key it may be, when parent and extra are known
            bool may = false;
            for (const PagedIndexEntry& entry : state.index) {
                if (entry.blocks.empty() || entry.key.tokens != chunk) continue;
                if ((extra && entry.key.extra != *extra) || (parent && entry.key.parent != *parent)) continue;
                may = true;
                if (extra && parent) found = entry.key;
            }
            if (!may) break;
            chain.possible = i + 1;
            certain = certain && found.has_value();
            if (certain) chain.known = i + 1;
            parent = std::nullopt;
            if (found) {
                const auto identity = identity_of_.find(*found);
                if (identity != identity_of_.end()) parent = identity->second.get();
            }
        }
        return chain;
    }

    // What the index holds for each of the request's first `blocks` blocks.
    static std::string chain_text(const PagedState& state, const Tokens& tokens, std::int64_t blocks) {
        const std::int64_t b = state.block_tokens;
        std::string text;
        for (std::int64_t i = 0; i < blocks && (i + 1) * b < static_cast<std::int64_t>(tokens.size()); ++i) {
            const Tokens chunk(tokens.begin() + i * b, tokens.begin() + (i + 1) * b);
            std::size_t keys = 0;
            for (const PagedIndexEntry& entry : state.index) keys += !entry.blocks.empty() && entry.key.tokens == chunk ? 1 : 0;
            text += (i == 0 ? "" : "; ") + tokens_text(chunk) + ": " + std::to_string(keys) + " keys indexed";
        }
        return text;
    }

    // Learns key identities (a key's identity is its table successor's
    // parent) and salts' extra keys from the pool's tables.
    void learn(const PagedState& state) {
        for (const auto& [seq, table] : state.tables) {
            const auto salt = salt_of_.find(seq);
            for (std::size_t i = 0; i < table.size(); ++i) {
                const PagedBlock* block = keyed(state, table[i]);
                if (block == nullptr) continue;
                if (salt != salt_of_.end()) extra_of_[{salt->second, static_cast<std::int64_t>(i)}].see(block->key.extra);
                const PagedBlock* next = i + 1 < table.size() ? keyed(state, table[i + 1]) : nullptr;
                if (next != nullptr) identity_of_[block->key].see(next->key.parent);
            }
        }
    }

    static const PagedBlock* keyed(const PagedState& state, std::int64_t block) {
        if (block < 1 || block >= static_cast<std::int64_t>(state.blocks.size())) return nullptr;
        const PagedBlock& b = state.blocks[static_cast<std::size_t>(block)];
        return b.keyed ? &b : nullptr;
    }

    std::map<std::int64_t, std::int64_t> salt_of_;  // sequence -> the salt it was allocated with
    std::map<std::pair<std::int64_t, std::int64_t>, Learnt<std::string>> extra_of_;  // (salt, position) -> extra keys
    std::map<PagedKey, Learnt<std::uint64_t>, KeyLess> identity_of_;
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::lookup_exact>() {
    return std::make_unique<LookupExact>();
}

}  // namespace kvcheck::checkers
