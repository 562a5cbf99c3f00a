// What a paged engine's keys mean, learnt from the pools it reports: a
// key's parent is an opaque number (the engine's chain hash) and a salt's
// extra keys are the engine's own string, so neither is computed by
// kvcheck; the checkers that read them (lookup-exact, index-consistent,
// hit-consumed) learn them here, one instance each, from every paged fact
// after judging it (docs/semantics.md#paged-properties).
//
// Learnt:
// - the salt each sequence was allocated with (a fork's: its parent's);
// - a key's identity (the parent number its child's key carries): two
//   keyed blocks next to each other in a table;
// - a salt's extra keys at block position i: a keyed block at position i
//   of the table of a sequence of that salt (an engine may key a salt into
//   the first block only, as vLLM does its cache salt);
// - the salt that published a key: the salt of the sequences holding a
//   block when an operation gives it that key (its writers: nobody can hit
//   a block before it is keyed).
// A value seen two ways (a buggy engine, or a hit across extra keys) is
// conflicting and never used: what is not learnt is not assumed, so each
// check that reads it is one-sided there.
//
//   KeyLearning learnt;
//   ... judge(fact, learnt) ...; learnt.learn(fact);
#pragma once

#include "checkers/checker.h"

#include <map>
#include <optional>
#include <string>
#include <utility>

namespace kvcheck::checkers {

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

// Orders keys for maps (PagedKey has no order of its own).
struct KeyLess {
    bool operator()(const PagedKey& a, const PagedKey& b) const {
        if (a.parent != b.parent) return a.parent < b.parent;
        if (a.tokens != b.tokens) return a.tokens < b.tokens;
        return a.extra < b.extra;
    }
};

class KeyLearning {
  public:
    // The salt of the sequence an alloc or fork makes (a checker may call
    // it before judging the fact; learn calls it too).
    void see_sequence(const Paged& fact);
    // Learns from one paged operation's fact (call it after judging it).
    void learn(const Paged& fact);

    std::optional<std::int64_t> salt_of(std::int64_t seq) const;
    std::optional<std::string> extra(std::int64_t salt, std::int64_t position) const;
    std::optional<std::uint64_t> identity(const PagedKey& key) const;
    std::optional<std::int64_t> publisher(const PagedKey& key) const;

  private:
    std::map<std::int64_t, std::int64_t> salt_of_;  // sequence -> the salt it was allocated with
    std::map<std::pair<std::int64_t, std::int64_t>, Learnt<std::string>> extra_of_;  // (salt, position) -> extra keys
    std::map<PagedKey, Learnt<std::uint64_t>, KeyLess> identity_of_;
    std::map<PagedKey, Learnt<std::int64_t>, KeyLess> publisher_of_;
};

// Why the keyed block at `position` of the table of a sequence of `salt`
// does not carry that salt's keys, as far as `learnt` knows them: its key
// was published by a request of another salt, or its extra keys are not
// the salt's at that position, or (with `previous`, the key of the block
// before it) it does not chain from that key. Empty when none of these is
// known to hold.
std::string foreign_key(const KeyLearning& learnt, std::int64_t salt, std::int64_t position, const PagedKey& key,
                        const PagedKey* previous);

}  // namespace kvcheck::checkers
