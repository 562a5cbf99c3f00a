// Copy accounting: every deliberate K/V copy (clone, concat, the copy
// from_legacy makes) made by the store, the generation boundary or a
// conversion goes through a Copier, which logs it.
//
// The Copier is also the seam where a deviating copy strategy plugs in
// (the mutant adapters do, to plant known bugs); the reference strategy is
// kv::clone / kv::concat. Whatever the strategy, the Copier marks the result
// owned and records its lineage, so the K/V sets alive along a generation
// path can be counted.
//
//   kv::Copier copier;
//   auto copy = copier.clone(*stored, kv::CopyReason::get_cache);
//   copier.log().size() == 1; copier.log()[0].bytes == footprint(*copy).bytes
#pragma once

#include "kv/cache.h"

#include <cstdint>
#include <vector>

namespace kv {

enum class CopyReason : std::uint8_t { get_cache, merge, generate, user, conversion };

const char* copy_reason_name(CopyReason reason);

struct CopyEvent {
    CopyReason reason;
    std::int64_t tensors;
    std::int64_t bytes;
};

class Copier {
  public:
    virtual ~Copier() = default;

    // An owned copy of `source` (lineage: source), logged under `reason`.
    CachePtr clone(const Cache& source, CopyReason reason);
    // An owned merge of `parts` in order (lineage: every part), logged.
    CachePtr concat(const std::vector<ConstCachePtr>& parts, CopyReason reason);
    // The row of a batch of `rows` that `steps` selects (kv::batch_row;
    // lineage: every row), logged: the row handed out is the copy.
    CachePtr batch_row(const std::vector<ConstCachePtr>& rows, const BatchSteps& steps, CopyReason reason);
    // kv::from_legacy of `source` (lineage: source), logged as a
    // conversion. Not marked owned: a conversion hands out no owned copy.
    CachePtr from_legacy(const Cache& source);

    const std::vector<CopyEvent>& log() const { return log_; }
    void clear_log() { log_.clear(); }

  protected:
    // The copy strategy. The reference uses kv::clone and kv::concat.
    virtual CachePtr clone_strategy(const Cache& source);
    virtual CachePtr concat_strategy(const std::vector<ConstCachePtr>& parts);
    virtual CachePtr batch_strategy(const std::vector<ConstCachePtr>& rows, const BatchSteps& steps);

  private:
    CachePtr record(CachePtr copy, const std::vector<const Cache*>& sources, CopyReason reason, bool owned = true);

    std::vector<CopyEvent> log_;
};

// The number of K/V sets alive on the copy chain that ends in `cache`: the
// cache itself plus each lineage level with a live member (the parts of a
// merge are one level: one set). An original (never copied) counts 1.
std::int64_t live_sets_on_path(const Cache& cache);

}  // namespace kv
