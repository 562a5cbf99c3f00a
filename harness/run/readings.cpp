#include "run/readings.h"

#include <algorithm>
#include <unordered_set>

namespace kvcheck {
namespace {

template <typename T>
void add_unique(std::vector<T>& list, const T& value) {
    if (std::find(list.begin(), list.end(), value) == list.end()) list.push_back(value);
}

std::string in_quotes(const std::string& id) { return "\"" + id + "\""; }

}  // namespace

void Readings::begin_round() {
    ++round_;
    listed_.reset();
}

// ---- entries ------------------------------------------------------------------

EntryReading& Readings::entry(const std::string& id, const std::uint64_t* known_version) {
    const auto [node, inserted] = readings_.try_emplace(id);
    EntryReading& entry = node->value;
    if (inserted) entry.id = &node->key;
    if (entry.round == round_) return entry;
    entry.round = round_;
    std::optional<std::uint64_t> version;
    if (trust_versions_) version = known_version ? *known_version : engine_.entry_version(id);
    if (version && version == entry.version) return entry;
    unindex(entry);
    entry = EntryReading{};
    entry.round = round_;
    entry.version = version;
    entry.id = &node->key;
    return entry;
}

std::vector<Readings::ReadEntry> Readings::read_all(bool content, bool marker, bool index) {
    // The expected entries the engine lists: one it lacks is a difference of
    // the ids (reported on the listing), not an entry to ask about.
    std::vector<std::string> ids;
    ids.reserve(audit_.order().size());
    if (listed() == audit_.order()) {
        ids = audit_.order();
    } else {
        const std::unordered_set<std::string> held(listed().begin(), listed().end());
        for (const std::string& id : audit_.order()) {
            if (held.count(id) != 0) ids.push_back(id);
        }
    }
    std::vector<std::uint64_t> versions;
    if (trust_versions_) {
        versions = engine_.entry_versions(ids);
        if (!answered_all("entry_versions", versions.size(), ids.size())) return {};
    }
    // Without a marker there is none to read (entry_owned says false).
    const bool with_marker = marker && capabilities_.owned_marker;
    std::vector<ReadEntry> entries;
    entries.reserve(ids.size());
    std::vector<std::string> unread;
    std::vector<EntryReading*> unread_entries;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        EntryReading& reading = entry(ids[i], trust_versions_ ? &versions[i] : nullptr);
        const ObjectId expected = *audit_.entry(ids[i]);
        entries.push_back({&reading, expected});
        if ((content && !reading.digest && reading.matched != expected) || (with_marker && !reading.owned) ||
            (index && !reading.indexed && !reading.storage_read)) {
            unread.push_back(ids[i]);
            unread_entries.push_back(&reading);
        }
    }
    if (unread.empty()) return entries;
    const bool with_storage = capabilities_.storage_identity;
    std::vector<EntryFacts> facts = engine_.read_entries(unread, with_storage);
    if (!answered_all("read_entries", facts.size(), unread.size())) return {};
    for (std::size_t i = 0; i < unread.size(); ++i) {
        EntryReading& reading = *unread_entries[i];
        reading.batched = true;
        reading.digest = facts[i].digest;
        reading.owned = capabilities_.owned_marker && facts[i].owned;
        if (!with_storage) continue;
        reading.storage = std::move(facts[i].storage);
        reading.storage_read = true;
    }
    return entries;
}

bool Readings::answered_all(const char* method, std::size_t answers, std::size_t ids) {
    if (answers == ids) return true;
    verdicts_.engine_error(std::string("the adapter's ") + method + " returned " + std::to_string(answers) +
                           " results for " + std::to_string(ids) + " ids");
    return false;
}

// A fact read_entries gave that a check is about to report is asked again
// of its one-entry method: an adapter whose two disagree has an engine
// error, not a violation. True when they agree.
bool Readings::batch_agrees(const EntryReading& entry, const char* method, bool agree) {
    if (!entry.batched || agree) return true;
    verdicts_.engine_error(std::string("the adapter's read_entries and ") + method + " disagree on entry " + in_quotes(*entry.id));
    return false;
}

std::string Readings::entry_difference(const std::string& id, EntryReading& entry, ObjectId expected) {
    if (entry.matched == expected) return {};
    if (!entry.digest) entry.digest = engine_.entry_digest(id);
    if (*entry.digest == audit_.digest_of(expected)) {
        entry.matched = expected;
        return {};
    }
    if (!batch_agrees(entry, "entry_digest", engine_.entry_digest(id) == *entry.digest)) return {};
    if (capabilities_.content_tolerance.declared()) {
        std::string difference = within_tolerance(
            entry_firsts_, id, expected, *entry.digest, [&] { return engine_.view_entry(id); }, "entry_digest of entry " + in_quotes(id));
        if (difference.empty()) entry.matched = expected;
        return difference;
    }
    // The view only to name the difference.
    const std::string difference = view_difference(engine_.view_entry(id), audit_.view_of(expected));
    if (difference.empty()) {
        verdicts_.engine_error("the adapter's entry_digest of entry " + in_quotes(id) + " disagrees with its view_entry");
    }
    return difference;
}

bool Readings::entry_owned(const std::string& id, EntryReading& entry) {
    if (!capabilities_.owned_marker) return false;
    if (!entry.owned) entry.owned = engine_.entry_owned(id);
    if (*entry.owned && !batch_agrees(entry, "entry_owned", engine_.entry_owned(id))) entry.owned = false;
    return *entry.owned;
}

void Readings::index_storage(EntryReading& entry, const std::vector<std::uint64_t>* only) {
    if (entry.indexed) return;
    if (!entry.storage_read) {
        entry.storage = engine_.storage_of_entry(*entry.id);
        entry.storage_read = true;
    }
    for (const std::uint64_t identity : entry.storage) {
        if (only == nullptr || std::binary_search(only->begin(), only->end(), identity)) holders_.add(identity, entry.id);
    }
    entry.indexed = true;
}

void Readings::unindex(EntryReading& entry) {
    if (!entry.indexed) return;
    for (const std::uint64_t identity : entry.storage) holders_.remove(identity, entry.id);
    entry.indexed = false;
}

// An engine with a content tolerance reads a value back within it of what
// it was given (docs/semantics.md#content-tolerance), but it reads the same
// object the same way every time: a stored entry's or a handle's first
// reading of an object is judged within the tolerance, and every later one
// must equal it exactly, so that no write into a stored or handed-out cache
// hides under the tolerance.
template <typename Key, typename View>
std::string Readings::within_tolerance(std::unordered_map<Key, FirstReading>& firsts, const Key& key, ObjectId expected,
                                       std::uint64_t digest, View view, const std::string& what) {
    const std::uint64_t expected_digest = audit_.digest_of(expected);
    const auto first = firsts.find(key);
    if (first != firsts.end() && first->second.object == expected && first->second.expected == expected_digest) {
        if (digest == first->second.digest) return {};
        return "content differs from its first reading (compared exactly: a content tolerance allows no change "
               "of what was read once)";
    }
    const CacheView actual = view();
    if (view_digest(actual) != digest) {
        verdicts_.engine_error("the adapter's " + what + " disagrees with its view");
        return {};
    }
    std::string difference = view_difference(actual, audit_.values_view_of(expected), capabilities_.content_tolerance);
    if (difference.empty()) firsts[key] = FirstReading{expected, expected_digest, digest};
    return difference;
}

void Readings::drop(const std::string& id) {
    entry_firsts_.erase(id);
    EntryReading* found = readings_.find(id);
    if (found == nullptr) return;
    unindex(*found);
    readings_.erase(id);
}

void Readings::drop_all() {
    entry_firsts_.clear();
    readings_.clear();
    holders_.clear();
}

void Readings::distrust_all() {
    trust_versions_ = false;
    holders_.clear();
    readings_.for_each([](const std::string&, EntryReading& entry) {
        entry.indexed = false;
        entry.round = 0;
        entry.version.reset();
    });
}

const std::vector<std::string>& Readings::listed() {
    if (!listed_) listed_ = engine_.stored_ids();
    return *listed_;
}

std::string Readings::store_difference(bool ordered) {
    const std::string ids = checkers::ids_difference(listed(), audit_.order(), ordered);
    if (!ids.empty()) return ids;
    for (const std::string& id : audit_.order()) {
        const std::string difference = entry_difference(id, entry(id), *audit_.entry(id));
        if (!difference.empty()) return "entry " + in_quotes(id) + " " + difference;
        if (!capabilities_.metadata) continue;
        const Metadata found = engine_.entry_metadata(id);
        if (found != audit_.metadata(id)) {
            return "entry " + in_quotes(id) + " has metadata " + checkers::metadata_text(found) + ", expected " +
                   checkers::metadata_text(audit_.metadata(id));
        }
    }
    return {};
}

// ---- handles --------------------------------------------------------------------

const checkers::HandleReading& Readings::handle(std::int64_t handle) { return handle_record(handle).reading; }

const Readings::HandleRecord& Readings::handle_record(std::int64_t handle) {
    const auto found = handle_readings_.find(handle);
    if (found != handle_readings_.end()) return found->second;
    HandleRecord record;
    const HandleFacts facts = engine_.handle_facts(handle);
    record.reading.exists = facts.exists;
    record.marker = facts.owned;
    if (facts.exists && capabilities_.storage_identity) record.reading.storage = engine_.storage_of_handle(handle);
    return handle_readings_.emplace(handle, std::move(record)).first->second;
}

// docs/semantics.md#ownership: without a marker, "owned" is what the marker
// means, computed: not a stored object and sharing no list, layer or tensor
// storage with any stored entry. A stored object shares all of its storage
// with its entry, so one test says both. Every entry is indexed for it (the
// index otherwise holds only the entries the schedule read), which costs a
// batch read of the entries not indexed in this round; the run starts a
// round after each operation so that the store is the one it left.
bool Readings::handle_owned(std::int64_t handle) {
    const HandleRecord& record = handle_record(handle);
    if (!record.reading.exists) return false;
    if (capabilities_.owned_marker) return record.marker;
    index_every_entry();
    bool shares = false;
    for (const std::uint64_t identity : record.reading.storage) {
        holders_.for_each_holder(identity, [&shares](const std::string&) { shares = true; });
        if (shares) return false;
    }
    return true;
}

void Readings::index_every_entry() {
    if (every_entry_indexed_round_ == round_) return;
    for (const ReadEntry& read : read_all(false, false, true)) index_storage(*read.reading);
    every_entry_indexed_round_ = round_;
}

std::string Readings::handle_difference(std::int64_t handle, ObjectId expected) {
    // A handle that holds no cache has no view to compare: asking would
    // make the engine refuse a request the harness should not have made.
    // Its absence is store-contract's to report (docs/semantics.md#reproduction).
    if (!this->handle(handle).exists) return {};
    const std::uint64_t digest = engine_.handle_digest(handle);
    if (digest == audit_.digest_of(expected)) return {};
    if (capabilities_.content_tolerance.declared()) {
        return within_tolerance(
            handle_firsts_, handle, expected, digest, [&] { return engine_.view_handle(handle); },
            "handle_digest of " + checkers::handle_text(handle));
    }
    const std::string difference = view_difference(engine_.view_handle(handle), audit_.view_of(expected));
    if (difference.empty()) {
        verdicts_.engine_error("the adapter's handle_digest of " + checkers::handle_text(handle) + " disagrees with its view_handle");
    }
    return difference;
}

// ---- the storage index ------------------------------------------------------------

std::vector<std::string> Readings::holders_of(const std::vector<std::uint64_t>& identities) const {
    std::vector<std::string> entries;
    for (const std::uint64_t identity : identities) {
        holders_.for_each_holder(identity, [&entries](const std::string& id) { add_unique(entries, id); });
    }
    return entries;
}

std::vector<std::string> Readings::entries_reached(const std::vector<std::int64_t>& handles) {
    std::vector<std::string> entries;
    if (!capabilities_.storage_identity) return entries;
    for (const std::int64_t h : handles) {
        if (!audit_.handle(h)) continue;
        for (const std::string& id : holders_of(handle(h).storage)) add_unique(entries, id);
    }
    return entries;
}

std::optional<std::string> Readings::aliased_entry(const checkers::HandleFact& fact) {
    std::vector<std::string> offending;
    for (const std::string& id : holders_of(handle(fact.handle).storage)) {
        const std::optional<ObjectId> stored = audit_.entry(id);
        if (stored && !audit_.may_alias(fact.object, *stored)) offending.push_back(id);
    }
    if (offending.empty()) return std::nullopt;
    std::string first = offending.front();
    for (const std::string& id : audit_.order()) {
        if (std::find(offending.begin(), offending.end(), id) != offending.end()) {
            first = id;
            break;
        }
    }
    const EntryReading* found = readings_.find(first);
    if (found != nullptr && found->batched) {
        std::vector<std::uint64_t> batch = found->storage;
        std::vector<std::uint64_t> one = engine_.storage_of_entry(first);
        std::sort(batch.begin(), batch.end());
        std::sort(one.begin(), one.end());
        if (!batch_agrees(*found, "storage_of_entry", batch == one)) return std::nullopt;
    }
    return first;
}

namespace {

// The object a chain of views (conversion results) comes down from.
ObjectId view_root(const Auditor& audit, ObjectId object) {
    while (audit.object(object).alias_parent != 0) object = audit.object(object).alias_parent;
    return object;
}

}  // namespace

// Was `copy` copied from `source`, or from another view of the same cache?
bool Readings::copied_from(ObjectId copy, ObjectId source) const {
    const Lineage& lineage = audit_.object(copy).lineage;
    if (lineage.empty()) return false;
    const ObjectId root = view_root(audit_, source);
    return std::any_of(lineage[0].begin(), lineage[0].end(),
                       [&](ObjectId from) { return view_root(audit_, from) == root; });
}

std::optional<std::int64_t> Readings::handle_sharing(const checkers::HandleFact& fact) {
    if (!capabilities_.storage_identity) return std::nullopt;
    if (handles_by_identity_round_ != round_) {
        handles_by_identity_.clear();
        for (const auto& [h, object] : audit_.handles()) {
            if (!object) continue;
            for (const std::uint64_t identity : handle(h).storage) handles_by_identity_[identity].push_back(h);
        }
        handles_by_identity_round_ = round_;
    }
    for (const std::uint64_t identity : handle(fact.handle).storage) {
        const auto found = handles_by_identity_.find(identity);
        if (found == handles_by_identity_.end()) continue;
        for (const std::int64_t other : found->second) {
            const std::optional<ObjectId> object = audit_.handle(other);
            if (other == fact.handle || !object || *object == fact.object) continue;
            // Views of one cache share it.
            if (view_root(audit_, fact.object) == view_root(audit_, *object)) continue;
            // A copy sharing with what it was copied from is the copy's
            // fault, judged where it was made (clone-independent,
            // merge-correct), whenever the store is read.
            if (copied_from(fact.object, *object) || copied_from(*object, fact.object)) continue;
            return other;
        }
    }
    return std::nullopt;
}

std::optional<std::string> Readings::entry_sharing(const std::string& id, EntryReading& entry, ObjectId expected) {
    if (!capabilities_.storage_identity) return std::nullopt;
    if (!entry.storage_read) {
        entry.storage = engine_.storage_of_entry(id);
        entry.storage_read = true;
    }
    std::optional<std::string> sharing;
    for (const std::uint64_t identity : entry.storage) {
        holders_.for_each_holder(identity, [&](const std::string& other) {
            if (sharing || other == id) return;
            const std::optional<ObjectId> object = audit_.entry(other);
            if (object && *object != expected) sharing = other;
        });
        if (sharing) break;
    }
    return sharing;
}

std::vector<std::int64_t> Readings::handles_meeting(const std::vector<std::string>& entries) {
    std::vector<std::uint64_t> identities;
    for (const std::string& id : entries) {
        const EntryReading& reading = entry(id);
        identities.insert(identities.end(), reading.storage.begin(), reading.storage.end());
    }
    std::sort(identities.begin(), identities.end());
    std::vector<std::int64_t> meeting;
    for (const auto& [h, object] : audit_.handles()) {
        if (!object) continue;
        for (const std::uint64_t identity : handle(h).storage) {
            if (std::binary_search(identities.begin(), identities.end(), identity)) {
                meeting.push_back(h);
                break;
            }
        }
    }
    return meeting;
}

}  // namespace kvcheck
