// What the run has read of the engine: stored entries, handles, the listing,
// and the storage index that traces a handle to the entries it reaches.
//
// Reading a stored entry (its view, which hashes its content; its owned
// marker; its storage identities) is what a check costs. An engine with
// entry_versions says which entries may have changed: what was read of an
// entry is kept while its version stays, and read again when the version
// moves. Without versions what was read is not trusted from one round of
// reading to the next. A round starts whenever the engine may have changed
// (the run starts one before and after each step, and after a load).
//
// A handle changes only through the operations that name it: its reading
// is kept from the step that last named it (or the last full read), and
// dropped before a step that names it runs.
//
// Readings report what they find contradictory in the adapter itself (a
// batch read disagreeing with a one-entry read, a digest disagreeing with
// its view, an answer for the wrong number of ids) as engine errors.
#pragma once

#include "auditor/auditor.h"
#include "checkers/checker.h"
#include "id_map.h"
#include "run/verdicts.h"
#include "storage_index.h"

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvcheck {

struct EntryReading {
    std::uint64_t round = 0;  // the round its version was last asked in
    std::optional<std::uint64_t> version;
    std::optional<ObjectId> matched;  // its view equalled this object's
    std::optional<std::uint64_t> digest;
    std::optional<bool> owned;
    bool storage_read = false;  // storage holds its storage identities
    bool indexed = false;       // they are in the storage index
    bool batched = false;       // digest, owned and storage came from read_entries
    std::vector<std::uint64_t> storage;
    const std::string* id = nullptr;  // the key of its node (stable until erased)
};

class Readings {
  public:
    Readings(Engine& engine, const Capabilities& capabilities, Auditor& auditor, Verdicts& verdicts)
        : engine_(engine), capabilities_(capabilities), audit_(auditor), verdicts_(verdicts),
          trust_versions_(capabilities.entry_versions) {}

    void begin_round();
    const Capabilities& capabilities() const { return capabilities_; }

    // ---- entries ----

    // What is known of entry `id` in this round. `known_version`: its
    // version, already asked (entry_versions) when versions are trusted.
    EntryReading& entry(const std::string& id, const std::uint64_t* known_version = nullptr);

    // The readings of every entry the auditor holds, in insertion order,
    // with the objects they must match: what a full read's checks will ask
    // of them is asked of the engine in two calls for all of them (the
    // versions, then the facts the versions do not vouch for), not a few
    // calls per entry. Empty when the engine answers for other entries than
    // it was asked about (an engine error).
    struct ReadEntry {
        EntryReading* reading;
        ObjectId expected;
    };
    std::vector<ReadEntry> read_all(bool content, bool marker, bool index);

    // The difference of entry `id` from the object the auditor expects;
    // empty when none (or when the adapter contradicts itself).
    std::string entry_difference(const std::string& id, EntryReading& entry, ObjectId expected);
    bool entry_owned(const std::string& id, EntryReading& entry);

    // Reads the entry's storage identities into the index; with `only` (a
    // sorted list), just those among them.
    void index_storage(EntryReading& entry, const std::vector<std::uint64_t>* only = nullptr);

    void drop(const std::string& id);  // the entry is gone
    void drop_all();                   // the store may hold other entries now
    // Every reading made stale, kept for reuse, and versions no longer
    // trusted: the end-of-run read reads everything anew.
    void distrust_all();

    // The ids the engine lists, asked once a round.
    const std::vector<std::string>& listed();
    // The first difference between the engine's store and the expected one,
    // as text: the ids held (in insertion order when `ordered`), then each
    // entry's content. Empty when they agree.
    std::string store_difference(bool ordered);

    // ---- handles ----

    const checkers::HandleReading& handle(std::int64_t handle);
    // Probe::owned: the engine's marker, or, without one, derived from the
    // storage of every stored entry (indexed in this round for it).
    bool handle_owned(std::int64_t handle);
    void forget_handle(std::int64_t handle) { handle_readings_.erase(handle); }
    void forget_handles() { handle_readings_.clear(); }
    // The difference of the cache of `handle` from `expected`'s view, as
    // the probe reports it.
    std::string handle_difference(std::int64_t handle, ObjectId expected);

    // ---- the storage index ----

    // The stored entries that share storage with one of `handles`.
    std::vector<std::string> entries_reached(const std::vector<std::int64_t>& handles);
    // The first stored entry, in insertion order, sharing storage with the
    // handle's cache that its object may not alias; confirmed with the
    // one-entry method when the entry's storage came from a batch.
    std::optional<std::string> aliased_entry(const checkers::HandleFact& handle);
    // Another indexed entry that shares one of entry `id`'s storage
    // identities and holds an object other than `expected`.
    std::optional<std::string> entry_sharing(const std::string& id, EntryReading& entry, ObjectId expected);
    // Another live handle sharing storage with `handle` although neither's
    // object may alias the other's; from a map of every live handle's
    // storage made once per round.
    std::optional<std::int64_t> handle_sharing(const checkers::HandleFact& handle);
    // The handles whose storage meets that of `entries`.
    std::vector<std::int64_t> handles_meeting(const std::vector<std::string>& entries);

  private:
    // docs/semantics.md#content-tolerance: the first reading of an entry or
    // a handle holding `object` with the content whose expected digest is
    // `expected` (a trim changes an object's content in place), which was
    // within the declared tolerance; every later reading of it must have
    // `digest` exactly.
    struct FirstReading {
        ObjectId object;
        std::uint64_t expected;
        std::uint64_t digest;
    };
    template <typename Key, typename View>
    std::string within_tolerance(std::unordered_map<Key, FirstReading>& firsts, const Key& key, ObjectId expected,
                                 std::uint64_t digest, View view, const std::string& what);
    std::unordered_map<std::string, FirstReading> entry_firsts_;
    std::unordered_map<std::int64_t, FirstReading> handle_firsts_;

    // What is read of a handle: what the checkers see, and the engine's marker.
    struct HandleRecord {
        checkers::HandleReading reading;
        bool marker = false;
    };
    const HandleRecord& handle_record(std::int64_t handle);
    // Indexes the storage of every stored entry the engine lists, once a round.
    void index_every_entry();
    bool copied_from(ObjectId copy, ObjectId source) const;
    bool answered_all(const char* method, std::size_t answers, std::size_t ids);
    bool batch_agrees(const EntryReading& entry, const char* method, bool agree);
    void unindex(EntryReading& entry);
    std::vector<std::string> holders_of(const std::vector<std::uint64_t>& identities) const;

    Engine& engine_;
    const Capabilities& capabilities_;
    Auditor& audit_;
    Verdicts& verdicts_;
    bool trust_versions_ = false;
    std::uint64_t round_ = 0;
    std::optional<std::vector<std::string>> listed_;
    IdMap<EntryReading> readings_;
    StorageIndex holders_;  // storage identity -> entries holding it
    std::unordered_map<std::int64_t, HandleRecord> handle_readings_;
    std::uint64_t every_entry_indexed_round_ = 0;  // the round index_every_entry last ran in
    // Storage identity -> the live handles holding it, for handle_sharing;
    // made in the round `handles_by_identity_round_`.
    std::unordered_map<std::uint64_t, std::vector<std::int64_t>> handles_by_identity_;
    std::uint64_t handles_by_identity_round_ = 0;
};

}  // namespace kvcheck
