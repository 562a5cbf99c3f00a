// A map from entry ids to values, for the per-entry state that every check
// of a step looks up: the executor's readings, the auditor's entries, the
// reference adapter's snapshots. Internal to the harness and the adapters.
#pragma once

#include "probe_table.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvcheck {

// One open-addressing table of (hash, node) pairs (linear probing, at most
// half full, deletion by backward shift), each node holding an id and its
// value. A look-up reads the table's slot, then the node: two cache misses
// in a big cold store where std::unordered_map's reads three (the bucket,
// the node before the first of the bucket, the node), and at 1,000 entries
// those look-ups were the checks' largest single cost (BENCHMARKS.md).
//
// A node's key and value stay where they are until the id is erased (or
// the map cleared): the storage index names entries by their key's address.
//
//   IdMap<int> map;
//   auto [value, inserted] = map.try_emplace("a");  // *value == 0, inserted
//   map.find("a");                                   // the same pointer
//   map.erase("a");                                  // true; find gives null
template <typename T>
class IdMap {
  public:
    struct Node {
        std::string key;
        T value{};
    };

    // The value of `id`, or null.
    T* find(const std::string& id) {
        Node* node = find_node(id);
        return node ? &node->value : nullptr;
    }
    const T* find(const std::string& id) const {
        const Node* node = const_cast<IdMap*>(this)->find_node(id);
        return node ? &node->value : nullptr;
    }

    // The node of `id`, made with a value-initialized T when there was none
    // (then `inserted` is true).
    std::pair<Node*, bool> try_emplace(const std::string& id) {
        if ((used_ + 1) * 2 > slots_.size()) grow();
        const std::uint64_t hash = hash_of(id);
        std::size_t at = homes_.of(hash);
        for (; slots_[at].node != nullptr; at = homes_.next(at)) {
            if (slots_[at].hash == hash && slots_[at].node->key == id) return {slots_[at].node, false};
        }
        auto node = std::make_unique<Node>();
        node->key = id;
        slots_[at] = {hash, node.release()};
        ++used_;
        return {slots_[at].node, true};
    }

    // Erases `id`: false when it was not there.
    bool erase(const std::string& id) {
        if (used_ == 0) return false;
        const std::uint64_t hash = hash_of(id);
        for (std::size_t at = homes_.of(hash); slots_[at].node != nullptr; at = homes_.next(at)) {
            if (slots_[at].hash == hash && slots_[at].node->key == id) {
                delete slots_[at].node;
                erase_at(at);
                return true;
            }
        }
        return false;
    }

    void clear() {
        for (Slot& slot : slots_) {
            delete slot.node;
            slot = Slot{};
        }
        used_ = 0;
    }

    std::size_t size() const { return used_; }

    // f(const std::string& id, T& value) for every entry, in no order.
    template <typename F>
    void for_each(F&& f) {
        for (const Slot& slot : slots_) {
            if (slot.node != nullptr) f(std::as_const(slot.node->key), slot.node->value);
        }
    }
    template <typename F>
    void for_each(F&& f) const {
        for (const Slot& slot : slots_) {
            if (slot.node != nullptr) f(slot.node->key, std::as_const(slot.node->value));
        }
    }

    IdMap() = default;
    IdMap(const IdMap&) = delete;
    IdMap& operator=(const IdMap&) = delete;
    ~IdMap() { clear(); }

  private:
    struct Slot {
        std::uint64_t hash = 0;
        Node* node = nullptr;  // null: free; owned
    };

    static std::uint64_t hash_of(const std::string& id) { return std::hash<std::string>{}(id); }

    Node* find_node(const std::string& id) {
        if (used_ == 0) return nullptr;
        const std::uint64_t hash = hash_of(id);
        for (std::size_t at = homes_.of(hash); slots_[at].node != nullptr; at = homes_.next(at)) {
            if (slots_[at].hash == hash && slots_[at].node->key == id) return slots_[at].node;
        }
        return nullptr;
    }

    void erase_at(std::size_t hole) {
        erase_by_backward_shift(
            slots_, hole, homes_, [](const Slot& slot) { return slot.node == nullptr; },
            [](const Slot& slot) { return slot.hash; });
        --used_;
    }

    void grow() {
        std::vector<Slot> old = std::move(slots_);
        const std::size_t size = old.empty() ? 16 : old.size() * 2;
        slots_.assign(size, Slot{});
        homes_.resize(size);
        for (const Slot& slot : old) {
            if (slot.node == nullptr) continue;
            std::size_t at = homes_.of(slot.hash);
            while (slots_[at].node != nullptr) at = homes_.next(at);
            slots_[at] = slot;
        }
    }

    std::vector<Slot> slots_;
    std::size_t used_ = 0;
    ProbeHomes homes_;
};

}  // namespace kvcheck
