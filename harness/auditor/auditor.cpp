#include "auditor/auditor.h"

#include <algorithm>
#include <cassert>
#include <tuple>

namespace kvcheck {
namespace {

// Puts `id` last in `ids` (an order of use), taking it out of its place.
void move_to_back(std::vector<std::string>& ids, const std::string& id) {
    const auto found = std::find(ids.begin(), ids.end(), id);
    if (found != ids.end()) ids.erase(found);
    ids.push_back(id);
}

}  // namespace

ObjectId Auditor::new_object(CacheContent content, Origin origin, bool expect_owned, ObjectId alias_parent,
                             std::int64_t chain_sets, Lineage lineage) {
    Object object;
    object.lineage = std::move(lineage);
    object.content = std::move(content);
    object.origin = origin;
    object.expect_owned = expect_owned;
    object.alias_parent = alias_parent;
    object.chain_sets = chain_sets;
    const ObjectId id = next_object_++;
    objects_.emplace(id, std::move(object));
    if (alias_parent != 0) alias_children_[alias_parent].push_back(id);
    return id;
}

ObjectId Auditor::copy_object(ObjectId source, Origin origin, bool expect_owned, std::int64_t chain_sets) {
    const std::optional<std::uint64_t> digest = objects_.at(source).digest;
    const ObjectId id = new_object(objects_.at(source).content, origin, expect_owned, 0, chain_sets, copy_lineage({source}));
    objects_.at(id).digest = digest;
    if (const std::optional<std::vector<std::int64_t>>& fed = objects_.at(source).fed) {
        CacheView view = *objects_.at(source).view;
        set_fed(id, *fed, std::move(view));
    }
    return id;
}

void Auditor::set_fed(ObjectId id, std::vector<std::int64_t> fed, CacheView view) {
    Object& object = objects_.at(id);
    object.fed = std::move(fed);
    object.digest = view_digest(view);
    object.view = std::move(view);
    object.known = true;
}

std::int64_t Auditor::bytes_of(ObjectId id) const {
    const Object& object = objects_.at(id);
    if (!object.fed) return content_bytes(object.content);
    return view_bytes(*object.view);
}

// A cache the model made is expected to read as the engine's fed_view, which
// a windowed engine already gives as it shows it.
std::int64_t Auditor::shown_bytes_of(ObjectId id) const {
    const Object& object = objects_.at(id);
    if (object.fed || window_ == 0) return bytes_of(id);
    return content_bytes(expected_window(object.content, window_));
}

Lineage Auditor::copy_lineage(const std::vector<ObjectId>& sources) const {
    Lineage lineage(1);
    for (const ObjectId source : sources) {
        lineage[0].push_back(source);
        const Lineage& older = objects_.at(source).lineage;
        if (lineage.size() < older.size() + 1) lineage.resize(older.size() + 1);
        for (std::size_t level = 0; level < older.size(); ++level) {
            lineage[level + 1].insert(lineage[level + 1].end(), older[level].begin(), older[level].end());
        }
    }
    return lineage;
}

std::int64_t Auditor::referenced_levels(const Lineage& lineage) const {
    std::vector<ObjectId> referenced;
    for (const auto& [handle, object] : handles_) {
        if (object) referenced.push_back(*object);
    }
    entries_.for_each([&referenced](const std::string&, ObjectId object) { referenced.push_back(object); });
    std::sort(referenced.begin(), referenced.end());
    std::int64_t levels = 0;
    for (const std::vector<ObjectId>& level : lineage) {
        const bool alive = std::any_of(level.begin(), level.end(), [&](ObjectId object) {
            return std::binary_search(referenced.begin(), referenced.end(), object);
        });
        if (alive) ++levels;
    }
    return levels;
}

const Metadata& Auditor::metadata(const std::string& id) const { return metadata_.at(id); }

void Auditor::store(const std::string& id, ObjectId object, Metadata metadata) {
    metadata_[id] = std::move(metadata);
    const auto [node, inserted] = entries_.try_emplace(id);
    if (inserted) order_.push_back(id);
    node->value = object;
    touch(id);
    move_to_back(stores_, id);
    Object& stored = objects_.at(object);
    stored.expect_owned = false;  // storing clears the owned marker
    stored.chain_sets = 1;        // and makes the cache an original: its copy history ends
    stored.lineage.clear();
}

void Auditor::remove(const std::string& id) {
    if (!entries_.erase(id)) return;
    metadata_.erase(id);
    order_.erase(std::find(order_.begin(), order_.end(), id));
    recency_.erase(std::find(recency_.begin(), recency_.end(), id));
    stores_.erase(std::find(stores_.begin(), stores_.end(), id));
}

void Auditor::remove_all() {
    entries_.clear();
    metadata_.clear();
    order_.clear();
    recency_.clear();
    stores_.clear();
}

void Auditor::touch(const std::string& id) {
    if (entries_.find(id) == nullptr) return;
    move_to_back(recency_, id);
}

std::int64_t Auditor::stored_bytes() const {
    std::int64_t bytes = 0;
    entries_.for_each([&](const std::string&, ObjectId object) { bytes += bytes_of(object); });
    return bytes;
}

std::vector<std::string> Auditor::handed_out() const {
    std::vector<std::string> ids;
    for (const std::string& id : order_) {
        const ObjectId entry = *entries_.find(id);
        for (const auto& [handle, object] : handles_) {
            if (object && may_alias(*object, entry)) {
                ids.push_back(id);
                break;
            }
        }
    }
    return ids;
}

std::vector<std::string> Auditor::due_evictions(const StorePolicy& policy,
                                                const std::vector<std::pair<std::string, std::int64_t>>& added,
                                                const std::set<std::string>& leased,
                                                std::vector<std::string>* refused) const {
    std::vector<std::string> order = order_;
    std::vector<std::string> recency = recency_;
    std::vector<std::string> stores = stores_;
    std::map<std::string, std::int64_t> bytes;
    std::int64_t total = 0;
    for (const std::string& id : order_) total += bytes[id] = bytes_of(*entries_.find(id));
    const auto over = [&] {
        return (policy.capacity_items > 0 && static_cast<std::int64_t>(order.size()) > policy.capacity_items) ||
               (policy.capacity_bytes > 0 && total > policy.capacity_bytes);
    };
    // The first of the policy's order that is not leased (the item being
    // stored is never leased: a lease on its id refuses the store).
    const auto victim = [&]() -> std::string {
        const std::vector<std::string>& queue = policy.eviction == Eviction::lru   ? recency
                                                : policy.eviction == Eviction::lrs ? stores
                                                                                   : order;
        for (const std::string& id : queue) {
            if (leased.count(id) == 0) return id;
        }
        return {};
    };
    const auto holds_leased = [&] {
        return std::any_of(order.begin(), order.end(), [&](const std::string& id) { return leased.count(id) != 0; });
    };
    std::vector<std::string> evicted;
    for (const auto& [id, size] : added) {
        const auto state = std::make_tuple(order, recency, stores, bytes, total, evicted.size());
        const auto known = bytes.find(id);
        if (known == bytes.end()) {
            order.push_back(id);
        } else {
            total -= known->second;
        }
        move_to_back(recency, id);
        move_to_back(stores, id);
        total += bytes[id] = size;
        while (over() && evicts_in_order(policy.eviction)) {
            const std::string next = victim();
            assert(!next.empty());  // the item itself is never leased
            if (next == id && holds_leased()) {
                // No room but by evicting the item while a leased entry
                // stays: refused whole.
                std::tie(order, recency, stores, bytes, total, std::ignore) = state;
                evicted.resize(std::get<5>(state));
                if (refused != nullptr) refused->push_back(id);
                break;
            }
            order.erase(std::find(order.begin(), order.end(), next));
            recency.erase(std::find(recency.begin(), recency.end(), next));
            stores.erase(std::find(stores.begin(), stores.end(), next));
            total -= bytes.at(next);
            bytes.erase(next);
            evicted.push_back(next);
        }
    }
    return evicted;
}

std::optional<ObjectId> Auditor::entry(const std::string& id) const {
    const ObjectId* found = entries_.find(id);
    if (found == nullptr) return std::nullopt;
    return *found;
}

const CacheView& Auditor::view_of(ObjectId id) {
    Object& object = objects_.at(id);
    if (!object.view) object.view = expected_view(window_ > 0 ? expected_window(object.content, window_) : object.content);
    return *object.view;
}

CacheView Auditor::values_view_of(ObjectId id) const {
    const Object& object = objects_.at(id);
    // A cache the model made: its view is the engine's fed_view, which
    // carries the values (an engine with a tolerance reports them).
    if (object.fed && object.view) return *object.view;
    return expected_view(window_ > 0 ? expected_window(object.content, window_) : object.content, true);
}

namespace {

// Every field of a content, as bytes: equal keys, equal contents.
std::string content_key(const CacheContent& content) {
    std::string key;
    const auto put = [&key](auto value) { key.append(reinterpret_cast<const char*>(&value), sizeof value); };
    put(static_cast<std::uint8_t>(content.layout));
    put(static_cast<std::uint8_t>(content.dtype));
    put(content.heads);
    put(content.head_dim);
    put(content.layers.size());
    for (const LayerContent& layer : content.layers) {
        put(layer.initialized);
        for (const SlotContent& slot : layer.slots) {
            put(slot.present);
            put(slot.segments.size());
            for (const Segment& segment : slot.segments) {
                put(segment.seed);
                put(segment.tokens);
                put(segment.first);
                put(static_cast<std::uint8_t>(segment.precision));
            }
        }
    }
    return key;
}

}  // namespace

std::uint64_t Auditor::digest_of(ObjectId id) {
    Object& object = objects_.at(id);
    if (object.digest) return *object.digest;
    if (object.view) {
        object.digest = view_digest(*object.view);
        return *object.digest;
    }
    // Objects of one content are many (an entry and its copies, a loaded
    // store and the store it was dumped from): the digest, a pure function
    // of the content, is made once.
    const auto [found, inserted] = digests_by_content_.try_emplace(content_key(object.content));
    if (inserted) found->second = expected_digest(window_ > 0 ? expected_window(object.content, window_) : object.content);
    object.digest = found->second;
    return *object.digest;
}

Snapshot Auditor::snapshot() const {
    Snapshot snapshot;
    snapshot.order = order_;
    snapshot.recency = recency_;
    snapshot.window = window_;
    entries_.for_each([&](const std::string& id, ObjectId object) { snapshot.entries[id] = objects_.at(object).content; });
    snapshot.metadata = metadata_;
    entries_.for_each([&](const std::string& id, ObjectId object) {
        snapshot.objects[id] = object;
        const Object& entry = objects_.at(object);
        if (!entry.fed) return;
        snapshot.fed[id] = *entry.fed;
        snapshot.views[id] = *entry.view;
    });
    return snapshot;
}

void Auditor::restore(const Snapshot& snapshot, ListingOrder listing) {
    remove_all();
    std::map<ObjectId, ObjectId> made;  // the snapshot's objects -> the new ones
    for (const std::string& id : snapshot.order) {
        const auto original = snapshot.objects.find(id);
        ObjectId object = 0;
        if (original != snapshot.objects.end() && made.count(original->second) != 0) {
            object = made.at(original->second);
        } else {
            object = new_object(snapshot.entries.at(id), Origin::stored_item, false);
            const auto fed = snapshot.fed.find(id);
            if (fed != snapshot.fed.end()) set_fed(object, fed->second, snapshot.views.at(id));
            if (original != snapshot.objects.end()) made[original->second] = object;
        }
        store(id, object, snapshot.metadata.at(id));
    }
    // A load stores the dump's items in the order it lists them: that is
    // their recency after it (docs/semantics.md#declared-store-contracts).
    // A snapshot made by hand (a test's) may leave recency out.
    if (listing == ListingOrder::recency && snapshot.recency.size() == order_.size()) recency_ = snapshot.recency;
    stores_ = recency_;  // each stored by the load, in that order
}

std::optional<ObjectId> Auditor::handle(std::int64_t handle) const {
    const auto found = handles_.find(handle);
    if (found == handles_.end()) return std::nullopt;
    return found->second;
}

bool Auditor::may_alias(ObjectId a, ObjectId b) const {
    for (ObjectId at = a; at != 0; at = objects_.at(at).alias_parent) {
        if (at == b) return true;
    }
    return false;
}

// The object and every object derived from it by conversions, through the
// children index: a walk over what may alias it, not over every object.
void Auditor::consumed(ObjectId object) {
    std::vector<ObjectId> pending = {object};
    while (!pending.empty()) {
        const ObjectId at = pending.back();
        pending.pop_back();
        objects_.at(at).known = false;
        const auto children = alias_children_.find(at);
        if (children != alias_children_.end()) pending.insert(pending.end(), children->second.begin(), children->second.end());
    }
}

void Auditor::trimmed(ObjectId id, CacheContent content, std::optional<std::vector<std::int64_t>> fed,
                      std::optional<CacheView> view) {
    Object& object = objects_.at(id);
    object.content = std::move(content);
    object.fed.reset();
    object.view.reset();
    object.digest.reset();
    if (fed) set_fed(id, std::move(*fed), std::move(*view));
    const auto children = alias_children_.find(id);
    if (children == alias_children_.end()) return;
    for (const ObjectId child : children->second) consumed(child);
}

}  // namespace kvcheck
