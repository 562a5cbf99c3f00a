#include "kv/store.h"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <csignal>
#include <unistd.h>

namespace kv {

bool holds_tokens(const Cache& cache) {
    for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
        const at::Tensor k = logical_keys(cache, i);
        const at::Tensor v = logical_values(cache, i);
        if ((k.defined() && k.numel() > 0) || (v.defined() && v.numel() > 0)) return true;
    }
    return false;
}

Store::Store(std::shared_ptr<Copier> copier) : copier_(std::move(copier)) { assert(copier_); }

Store::~Store() {
    for (const auto& [id, item] : items_) item->stored = false;
}

void Store::add(const std::vector<NewItem>& items) {
    for (const NewItem& item : items) {
        if (!item.cache) throw std::invalid_argument("add: item '" + item.id + "' has no cache");
    }
    for (const NewItem& item : items) {
        if (capacity_ > 0 && items_.count(item.id) == 0 && order_.size() >= capacity_ && !victim()) {
            throw std::runtime_error("add: the store is full (" + std::to_string(capacity_) + " items) and every entry is pinned");
        }
        item.cache->set_owned(false);  // a stored cache is never an owned copy,
        item.cache->set_lineage({});   // and no longer a copy of anything: it is the original now
        auto stored = std::make_shared<const Item>(Item{item.id, item.cache, item.metadata});
        stored->stored = true;
        auto [position, inserted] = items_.try_emplace(item.id);
        if (!inserted) position->second->stored = false;  // overwritten
        position->second = std::move(stored);
        ++changes_;
        if (inserted) order_.push_back(item.id);
        touch(item.id);
        while (capacity_ > 0 && order_.size() > capacity_) remove({*victim()});
    }
}

// The least recently used entry that is not pinned.
const std::string* Store::victim() const {
    for (const std::string& id : recency_) {
        if (!pinned_ || !pinned_(id)) return &id;
    }
    return nullptr;
}

void Store::touch(const std::string& id) {
    if (items_.count(id) == 0) return;
    const auto found = std::find(recency_.begin(), recency_.end(), id);
    if (found != recency_.end()) recency_.erase(found);
    recency_.push_back(id);
}

ItemPtr Store::get(const std::string& id) const {
    const auto found = items_.find(id);
    return found == items_.end() ? nullptr : found->second;
}

const ItemPtr* Store::find(const std::string& id) const {
    const auto found = items_.find(id);
    return found == items_.end() ? nullptr : &found->second;
}

std::vector<ItemPtr> Store::get_by_ids(const std::vector<std::string>& ids) const {
    std::vector<ItemPtr> found;
    found.reserve(ids.size());
    for (const std::string& id : ids) found.push_back(get(id));
    return found;
}

std::vector<ItemPtr> Store::get_all() const { return get_by_ids(order_); }

CachePtr Store::get_cache(const std::vector<std::string>& ids) {
    std::vector<ConstCachePtr> parts;
    for (const std::string& id : ids) {
        const ItemPtr item = get(id);
        if (item && holds_tokens(*item->cache)) parts.push_back(item->cache);
    }
    if (parts.empty()) return nullptr;
    if (parts.size() == 1) return copier_->clone(*parts.front(), CopyReason::get_cache);
    return copier_->concat(parts, CopyReason::merge);
}

void Store::remove(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
        const auto found = items_.find(id);
        if (found == items_.end()) continue;
        found->second->stored = false;
        items_.erase(found);
        ++changes_;
        order_.erase(std::find(order_.begin(), order_.end(), id));
        recency_.erase(std::find(recency_.begin(), recency_.end(), id));
    }
}

void Store::remove_all() {
    ++changes_;
    for (const auto& [id, item] : items_) item->stored = false;
    items_.clear();
    order_.clear();
    recency_.clear();
}

namespace {

// Does the temporary-file suffix `pid_text` name this process or one that
// no longer runs? (A process of another user answers EPERM: it runs.)
bool orphaned_by(const std::string& pid_text) {
    if (pid_text.empty() || pid_text.size() > 9) return false;
    if (!std::all_of(pid_text.begin(), pid_text.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
    const auto pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid <= 0) return false;
    return pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH);
}

void remove_orphaned_temporaries(const std::string& dir, FileSystem& fs) {
    const std::string prefix = std::string(dump_file_name) + ".tmp-";
    std::vector<std::string> names;
    try {
        names = fs.list(dir);
    } catch (const IoError&) {
        return;  // no directory yet, or one we may not read: nothing to clean
    }
    for (const std::string& name : names) {
        if (name.rfind(prefix, 0) != 0 || !orphaned_by(name.substr(prefix.size()))) continue;
        try {
            fs.remove(dir + "/" + name);
        } catch (const IoError&) {
            // A read-only directory keeps its orphans; the load goes on.
        }
    }
}

}  // namespace

void Store::dump(const std::string& dir, FileSystem& fs) const {
    const std::vector<char> bytes = encode_dump(get_all());
    fs.make_dirs(dir);
    remove_orphaned_temporaries(dir, fs);
    const std::string target = dir + "/" + dump_file_name;
    const std::string temporary = target + dump_temporary_suffix + std::to_string(::getpid());
    fs.write_file(temporary, bytes);
    fs.rename(temporary, target);
}

void Store::load(const std::string& dir, FileSystem& fs, const LoadLimits& limits) {
    remove_orphaned_temporaries(dir, fs);
    const std::string path = dir + "/" + dump_file_name;
    std::vector<char> bytes;
    try {
        bytes = fs.read_file(path, limits.file_bytes_max);
    } catch (const IoError& error) {
        throw DumpError(std::string("cannot load dump: ") + error.what());
    }
    std::vector<Item> loaded = decode_dump(bytes, path, limits);
    // Nothing below throws: the store changes all at once or not at all.
    std::vector<std::string> order;
    std::map<std::string, ItemPtr> items;
    for (Item& item : loaded) {
        if (items.count(item.id) == 0) order.push_back(item.id);
        std::string id = item.id;
        items[id] = std::make_shared<const Item>(std::move(item));
    }
    for (const auto& [id, item] : items) item->stored = true;
    for (const auto& [id, item] : items_) item->stored = false;
    recency_ = order;  // a load stores the dump's items in its order
    order_.swap(order);
    items_.swap(items);
    ++changes_;
}

}  // namespace kv
