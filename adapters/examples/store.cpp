#include "store.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>

namespace vector_engine {

// ---- Copier ------------------------------------------------------------------

CachePtr Copier::clone(const Cache& source, const std::string& reason) {
    return record(vector_engine::clone(source, depth_), {&source}, reason, true);
}

CachePtr Copier::concat(const std::vector<ConstCachePtr>& parts, const std::string& reason) {
    std::vector<const Cache*> sources;
    for (const ConstCachePtr& part : parts) sources.push_back(part.get());
    return record(vector_engine::concat(parts), sources, reason, true);
}

CachePtr Copier::from_legacy(const Cache& source) {
    return record(vector_engine::from_legacy(source), {&source}, "from_legacy", false);
}

CachePtr Copier::record(CachePtr copy, const std::vector<const Cache*>& sources, const std::string& reason, bool owned) {
    assert(copy);
    log_.push_back({reason, footprint_bytes(*copy)});
    copy->set_owned(owned);
    Cache::Lineage lineage(1);
    for (const Cache* source : sources) {
        lineage[0].push_back(source->weak_from_this());
        const Cache::Lineage& older = source->lineage();
        if (lineage.size() < older.size() + 1) lineage.resize(older.size() + 1);
        for (std::size_t level = 0; level < older.size(); ++level) {
            lineage[level + 1].insert(lineage[level + 1].end(), older[level].begin(), older[level].end());
        }
    }
    copy->set_lineage(std::move(lineage));
    return copy;
}

// ---- Store -------------------------------------------------------------------

void Store::add(const std::string& id, CachePtr cache, Metadata metadata) {
    if (!cache) throw std::invalid_argument("add: item '" + id + "' has no cache");
    cache->set_owned(false);  // a stored cache is never an owned copy,
    cache->set_lineage({});   // and no longer a copy of anything
    if (items_.count(id) == 0) order_.push_back(id);
    items_[id] = Item{id, std::move(cache), std::move(metadata)};
}

const Item* Store::get(const std::string& id) const {
    const auto found = items_.find(id);
    return found == items_.end() ? nullptr : &found->second;
}

CachePtr Store::get_cache(const std::vector<std::string>& ids) {
    std::vector<ConstCachePtr> parts;
    for (const std::string& id : ids) {
        const Item* item = get(id);
        if (item && holds_tokens(*item->cache)) parts.push_back(item->cache);
    }
    if (parts.empty()) return nullptr;
    if (parts.size() == 1) return copier_.clone(*parts.front(), "get_cache");
    return copier_.concat(parts, "merge");
}

void Store::remove(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
        if (items_.erase(id) == 0) continue;
        order_.erase(std::find(order_.begin(), order_.end(), id));
    }
}

void Store::remove_all() {
    items_.clear();
    order_.clear();
}

void Store::dump(const std::string& dir, Disk& disk) const {
    std::vector<Item> items;
    for (const std::string& id : order_) items.push_back(items_.at(id));
    const std::vector<char> bytes = encode_dump(items);
    disk.make_dirs(dir);
    const std::string target = dir + "/" + dump_file_name;
    const std::string temporary = target + ".partial";
    disk.write_file(temporary, bytes);
    disk.rename(temporary, target);
}

void Store::load(const std::string& dir, Disk& disk) {
    const std::string path = dir + "/" + dump_file_name;
    // What a crashed dump left: the next dump would overwrite it, a load removes it.
    disk.remove(path + ".partial");
    const DumpLimits limits;
    std::vector<Item> loaded = decode_dump(disk.read_file(path, limits.file_bytes_max), path, limits);
    // Nothing below throws: the store changes all at once or not at all.
    std::vector<std::string> order;
    std::map<std::string, Item> items;
    for (Item& item : loaded) {
        order.push_back(item.id);
        items[item.id] = std::move(item);
    }
    order_.swap(order);
    items_.swap(items);
}

// ---- the boundary ---------------------------------------------------------------

void generate(const Model& model, Copier& copier, const CachePtr& past, const std::vector<std::int64_t>& prompt,
              std::int64_t max_new_tokens, const TokenSink& sink, RunStats& stats) {
    CachePtr working;
    if (!past) {
        working = Cache::make(Layout::modern);
    } else if (past->owned()) {
        working = past;  // the one copy of this generation already exists: write into it
    } else {
        working = copier.clone(*past, "generate");
    }
    run_model(model, prompt, *working, max_new_tokens, sink, stats);
}

}  // namespace vector_engine
