// Clone cost against the physical limit: kv::clone of caches from 4 KiB to
// 256 MiB (4 layers of K and V, float32 and bfloat16) against a plain
// memcpy of the same bytes, slot by slot,
// - into reused buffers, already resident: the physical limit;
// - into fresh buffers taken from the allocator and given back each round,
//   as a clone's are: what a copy costs when the pages come from the kernel.
// The three run interleaved, one after the other in every round, so that
// the load other processes put on a shared machine falls on all three
// alike, and each reports its median round. Minor page faults per round
// show when fresh pages dominate.
//
// kv::clone takes its buffers from the buffer pool (kv/buffer_pool.h), so
// from the second round on a clone copies into the pages the previous one
// left resident. clone_vs_memcpy_pool_off runs the same rounds with the
// pool's limit at 0 (every block goes back to the system when freed), to
// show what the pool buys; it cannot share rounds with the pooled clone,
// as turning the pool off empties it.
//
// Merges: Store::get_cache of k ids (k parts of total/k bytes each) against
// a clone of one cache of the same total bytes, also interleaved.
#include "bench_util.h"

#include "kv/buffer_pool.h"
#include "kv/cache.h"
#include "kv/store.h"

#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace kvbench {
namespace {

constexpr std::int64_t cache_layers = 4;
constexpr std::int64_t cache_heads = 2;
constexpr std::int64_t cache_head_dim = 64;

// A modern cache of `cache_layers` initialized layers holding `cache_bytes`
// bytes in all, zero-filled (the values do not change what a copy costs).
kv::CachePtr cache_of_bytes(std::int64_t cache_bytes, at::ScalarType dtype) {
    const auto element_bytes = static_cast<std::int64_t>(c10::elementSize(dtype));
    const std::int64_t token_bytes = cache_heads * cache_head_dim * element_bytes;
    const std::int64_t seq = std::max<std::int64_t>(1, cache_bytes / (cache_layers * 2 * token_bytes));
    auto cache = kv::Cache::make(kv::Layout::modern);
    const auto options = at::TensorOptions().dtype(dtype);
    for (std::int64_t i = 0; i < cache_layers; ++i) {
        cache->update(at::zeros({1, cache_heads, seq, cache_head_dim}, options),
                      at::zeros({1, cache_heads, seq, cache_head_dim}, options), i);
    }
    return cache;
}

struct Range {
    const void* data;
    std::size_t bytes;
};

// The slots of a modern cache as byte ranges, in the order clone copies them.
std::vector<Range> slot_ranges(const kv::Cache& cache) {
    std::vector<Range> ranges;
    for (const kv::LayerPtr& layer : *cache.layers()) {
        for (const at::Tensor* t : {&layer->keys, &layer->values}) ranges.push_back({t->data_ptr(), t->nbytes()});
    }
    return ranges;
}

struct FreeBuffer {
    void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, FreeBuffer>;

// Aligned as libtorch's CPU allocator aligns (64 bytes), through the same
// allocator (glibc's).
Buffer allocate(std::size_t bytes) {
    void* p = nullptr;
    if (::posix_memalign(&p, 64, bytes) != 0) throw std::bad_alloc();
    return Buffer(p);
}

// Sets the buffer pool's limit for the life of a benchmark, and restores it.
class PoolLimit {
  public:
    explicit PoolLimit(std::int64_t limit_bytes) : saved_(kv::buffer_pool_stats().limit_bytes) {
        kv::set_buffer_pool_limit(limit_bytes);
    }
    ~PoolLimit() { kv::set_buffer_pool_limit(saved_); }
    PoolLimit(const PoolLimit&) = delete;
    PoolLimit& operator=(const PoolLimit&) = delete;

  private:
    std::int64_t saved_;
};

void clone_vs_memcpy(benchmark::State& state, at::ScalarType dtype, std::int64_t cache_bytes, bool pool) {
    const PoolLimit limit(pool ? kv::buffer_pool_limit_bytes_default : 0);
    const kv::CachePtr source = cache_of_bytes(cache_bytes, dtype);
    const std::vector<Range> ranges = slot_ranges(*source);
    std::size_t total_bytes = 0;
    std::vector<Buffer> reused;
    for (const Range& range : ranges) {
        total_bytes += range.bytes;
        reused.push_back(allocate(range.bytes));
        std::memset(reused.back().get(), 1, range.bytes);  // resident before the first round
    }
    Samples clone_seconds, memcpy_seconds, fresh_seconds;
    long clone_faults = 0;
    long fresh_faults = 0;
    const kv::BufferPoolStats pool_before = kv::buffer_pool_stats();
    // The page-fault counter is read between the timed spans, never inside
    // one: a read is a getrusage system call (~0.7 us, more with cold
    // caches), which a span of 4 KiB to 1 MiB of copying must not carry.
    for (auto _ : state) {
        const double t0 = now_seconds();
        for (std::size_t i = 0; i < ranges.size(); ++i) std::memcpy(reused[i].get(), ranges[i].data, ranges[i].bytes);
        benchmark::ClobberMemory();
        const double t1 = now_seconds();
        const long f1 = minor_faults();
        const double t2 = now_seconds();
        {
            std::vector<Buffer> fresh;
            for (const Range& range : ranges) {
                fresh.push_back(allocate(range.bytes));
                std::memcpy(fresh.back().get(), range.data, range.bytes);
            }
            benchmark::ClobberMemory();
        }
        const double t3 = now_seconds();
        const long f2 = minor_faults();
        const double t4 = now_seconds();
        {
            kv::CachePtr copy = kv::clone(*source);
            benchmark::DoNotOptimize(copy);
        }
        const double t5 = now_seconds();
        const long f3 = minor_faults();
        memcpy_seconds.add(t1 - t0);
        fresh_seconds.add(t3 - t2);
        clone_seconds.add(t5 - t4);
        fresh_faults += f2 - f1;
        clone_faults += f3 - f2;
        state.SetIterationTime(t5 - t4);
    }
    const kv::BufferPoolStats pool_after = kv::buffer_pool_stats();
    const double bytes = static_cast<double>(total_bytes);
    const double rounds = static_cast<double>(state.iterations());
    state.counters["pool"] = pool ? 1 : 0;
    state.counters["pool_reused_blocks_per_clone"] =
        static_cast<double>(pool_after.reused_blocks - pool_before.reused_blocks) / rounds;
    state.counters["pool_fresh_blocks_per_clone"] =
        static_cast<double>(pool_after.fresh_blocks - pool_before.fresh_blocks) / rounds;
    state.counters["cache_bytes"] = bytes;
    state.counters["clone_GBps"] = bytes / clone_seconds.median() / 1e9;
    state.counters["memcpy_GBps"] = bytes / memcpy_seconds.median() / 1e9;
    state.counters["memcpy_fresh_GBps"] = bytes / fresh_seconds.median() / 1e9;
    state.counters["clone_vs_memcpy"] = memcpy_seconds.median() / clone_seconds.median();
    state.counters["clone_vs_memcpy_fresh"] = fresh_seconds.median() / clone_seconds.median();
    state.counters["clone_page_faults"] = static_cast<double>(clone_faults) / rounds;
    state.counters["memcpy_fresh_page_faults"] = static_cast<double>(fresh_faults) / rounds;
    state.counters["torch_threads"] = at::get_num_threads();
}

std::string size_name(std::int64_t bytes) {
    return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MiB" : std::to_string(bytes >> 10) + "KiB";
}

void merge_vs_clone(benchmark::State& state, std::int64_t part_count, std::int64_t total_bytes) {
    kv::Store store;
    std::vector<std::string> ids;
    for (std::int64_t i = 0; i < part_count; ++i) {
        ids.push_back("part" + std::to_string(i));
        store.add({{ids.back(), cache_of_bytes(total_bytes / part_count, at::kFloat), {}}});
    }
    const kv::CachePtr whole = cache_of_bytes(total_bytes, at::kFloat);
    Samples merge_seconds, clone_seconds;
    long merge_faults = 0;
    std::int64_t merged_bytes = 0;
    for (auto _ : state) {
        const double t0 = now_seconds();
        {
            kv::CachePtr copy = kv::clone(*whole);
            benchmark::DoNotOptimize(copy);
        }
        const double t1 = now_seconds();
        const long f1 = minor_faults();  // outside the timed spans, as in clone_vs_memcpy
        const double t2 = now_seconds();
        {
            kv::CachePtr merged = store.get_cache(ids);
            merged_bytes = kv::footprint(*merged).bytes;
        }
        const double t3 = now_seconds();
        merge_faults += minor_faults() - f1;
        clone_seconds.add(t1 - t0);
        merge_seconds.add(t3 - t2);
        state.SetIterationTime(t3 - t2);
    }
    const double bytes = static_cast<double>(merged_bytes);
    state.counters["parts"] = static_cast<double>(part_count);
    state.counters["parts_bytes"] = bytes;
    state.counters["merge_GBps"] = bytes / merge_seconds.median() / 1e9;
    state.counters["clone_GBps"] = static_cast<double>(kv::footprint(*whole).bytes) / clone_seconds.median() / 1e9;
    state.counters["merge_vs_clone"] = clone_seconds.median() / merge_seconds.median();
    state.counters["merge_page_faults"] = static_cast<double>(merge_faults) / static_cast<double>(state.iterations());
}

// Rounds per size: enough for a stable median, about a second or two of
// copying at the largest sizes.
const bool registered = [] {
    const std::pair<at::ScalarType, const char*> dtypes[] = {{at::kFloat, "f32"}, {at::kBFloat16, "bf16"}};
    for (const auto& [dtype, dtype_name] : dtypes) {
        for (const std::int64_t kib : {4, 64, 1024, 16 * 1024, 64 * 1024, 256 * 1024}) {
            const std::int64_t bytes = kib * 1024;
            const std::int64_t rounds = std::clamp<std::int64_t>((std::int64_t{2} << 30) / bytes, 10, 2000);
            for (const bool pool : {true, false}) {
                const std::string name = pool ? "clone_vs_memcpy/" : "clone_vs_memcpy_pool_off/";
                benchmark::RegisterBenchmark((name + dtype_name + "/" + size_name(bytes)).c_str(), clone_vs_memcpy,
                                             dtype, bytes, pool)
                    ->Iterations(rounds)
                    ->UseManualTime()
                    ->Unit(benchmark::kMicrosecond);
            }
        }
    }
    for (const std::int64_t mib : {1, 64}) {
        for (const std::int64_t parts : {2, 8, 32, 128}) {
            const std::int64_t bytes = mib << 20;
            benchmark::RegisterBenchmark(("merge/" + std::to_string(parts) + "ids/" + size_name(bytes)).c_str(),
                                         merge_vs_clone, parts, bytes)
                ->Iterations(std::clamp<std::int64_t>((std::int64_t{1} << 30) / bytes, 10, 1000))
                ->UseManualTime()
                ->Unit(benchmark::kMicrosecond);
        }
    }
    return true;
}();

}  // namespace
}  // namespace kvbench
