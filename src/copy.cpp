#include "kv/copy.h"

#include <algorithm>
#include <cassert>

namespace kv {

const char* copy_reason_name(CopyReason reason) {
    switch (reason) {
        case CopyReason::get_cache: return "get_cache";
        case CopyReason::merge: return "merge";
        case CopyReason::generate: return "generate";
        case CopyReason::user: return "user";
        case CopyReason::conversion: return "conversion";
    }
    return "?";
}

CachePtr Copier::clone_strategy(const Cache& source) { return kv::clone(source); }

CachePtr Copier::concat_strategy(const std::vector<ConstCachePtr>& parts) {
    return kv::concat(parts);
}

CachePtr Copier::batch_strategy(const std::vector<ConstCachePtr>& rows, const BatchSteps& steps) {
    return kv::batch_row(rows, steps);
}

CachePtr Copier::clone(const Cache& source, CopyReason reason) {
    return record(clone_strategy(source), {&source}, reason);
}

CachePtr Copier::concat(const std::vector<ConstCachePtr>& parts, CopyReason reason) {
    std::vector<const Cache*> sources;
    for (const ConstCachePtr& part : parts) sources.push_back(part.get());
    return record(concat_strategy(parts), sources, reason);
}

CachePtr Copier::batch_row(const std::vector<ConstCachePtr>& rows, const BatchSteps& steps, CopyReason reason) {
    std::vector<const Cache*> sources;
    for (const ConstCachePtr& row : rows) sources.push_back(row.get());
    return record(batch_strategy(rows, steps), sources, reason);
}

CachePtr Copier::from_legacy(const Cache& source) {
    return record(kv::from_legacy(source), {&source}, CopyReason::conversion, false);
}

CachePtr Copier::record(CachePtr copy, const std::vector<const Cache*>& sources,
                        CopyReason reason, bool owned) {
    assert(copy);
    const Footprint size = footprint(*copy);
    log_.push_back({reason, size.tensors, size.bytes});
    copy->set_owned(owned);
    Cache::Lineage lineage(1);
    for (const Cache* source : sources) {
        lineage[0].push_back(source->weak_from_this());
        const Cache::Lineage& older = source->lineage();
        if (lineage.size() < older.size() + 1) lineage.resize(older.size() + 1);
        for (std::size_t level = 0; level < older.size(); ++level) {
            auto& into = lineage[level + 1];
            into.insert(into.end(), older[level].begin(), older[level].end());
        }
    }
    copy->set_lineage(std::move(lineage));
    return copy;
}

std::int64_t live_sets_on_path(const Cache& cache) {
    std::int64_t live = 1;
    for (const auto& level : cache.lineage()) {
        const bool any_alive = std::any_of(level.begin(), level.end(),
                                           [](const auto& weak) { return !weak.expired(); });
        if (any_alive) ++live;
    }
    return live;
}

}  // namespace kv
