// The paged family's speed (issue 30):
// - checked/<N>: checked paged operations per second on the paged reference
//   (adapters/reference/paged_reference.h) with a pool of N blocks of 2
//   tokens (16, 1,024, 65,536), every checker on: the same seeded mix of
//   paged operations at each size (at most 8 sequences alive, requests of
//   1-8 tokens from a 3-token alphabet so that they share prefixes), so
//   that only the pool's size changes. The pool sizes run interleaved,
//   round by round, so that the machine's drift does not land on one.
// - unchecked/<N>: the same mix with no checker (the engine's operations,
//   and the two readings of the pool around each that the facts carry).
// - pool_alloc_free, pool_lookup: the reference pool (kv::paged::Pool,
//   src/kv/paged_pool.h, 64 blocks) allocating, freeing and stepping a
//   request of 8 tokens that hits a cached prefix of 4, and looking one
//   up, with a model that computes nothing (zero K/V: the pool still
//   stages and gathers them), against baseline_...: a plain hash map from
//   chain hash to block and a free list, written here, doing the same
//   bookkeeping (chain hashes, lookup, touch, take, evict, publish, free)
//   and holding no K/V.
#include "bench_util.h"

#include "kv/paged_pool.h"
#include "kvcheck/executor.h"
#include "kvcheck/workload.h"
#include "reference/paged_reference.h"

#include <ATen/ops/zeros.h>
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvbench {
namespace {

using namespace kvcheck;

constexpr std::size_t mix_ops_count = 300;
constexpr std::uint64_t mix_seed = 30;
constexpr int rounds = 3;

// The seeded paged mix: allocs (3 in 10), appends, forks, frees, lookups,
// steps, exports, now and then an evict.
Trace paged_mix() {
    SeededChooser choose(mix_seed);
    std::vector<std::int64_t> alive;
    std::int64_t next_seq = 1;
    std::vector<Tokens> requests;
    auto tokens = [&] {
        Tokens t;
        if (!requests.empty() && !choose.one_in(3)) {
            const Tokens& past = requests[choose.below(requests.size())];
            t.assign(past.begin(), past.begin() + choose.between(1, static_cast<std::int64_t>(past.size())));
        }
        const std::int64_t more = choose.between(t.empty() ? 1 : 0, 4);
        for (std::int64_t i = 0; i < more && t.size() < 8; ++i) t.push_back(choose.between(1, 3));
        return t;
    };
    auto pick = [&] { return alive[choose.below(alive.size())]; };
    Trace trace;
    while (trace.size() < mix_ops_count) {
        const std::uint64_t roll = choose.below(20);
        if (alive.empty() || (roll < 6 && alive.size() < 8)) {
            Tokens t = tokens();
            requests.push_back(t);
            alive.push_back(next_seq);
            trace.push_back(op::PagedAlloc{next_seq++, std::move(t), choose.one_in(4) ? 1 : 0});
        } else if (roll < 9) {
            trace.push_back(op::PagedAppend{pick(), choose.between(1, 3)});
        } else if (roll < 10 && alive.size() < 8) {
            alive.push_back(next_seq);
            trace.push_back(op::PagedFork{pick(), next_seq++});
        } else if (roll < 13) {
            const std::size_t at = choose.below(alive.size());
            trace.push_back(op::PagedFree{alive[at]});
            alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(at));
        } else if (roll < 15) {
            trace.push_back(op::PagedLookup{tokens(), 0});
        } else if (roll < 18) {
            trace.push_back(op::PagedStep{});
        } else if (roll < 19) {
            trace.push_back(op::PagedExport{pick()});
        } else {
            trace.push_back(op::PagedEvict{});
        }
    }
    return trace;
}

std::shared_ptr<adapters::PagedReference> engine_of(std::int64_t blocks) {
    kv::paged::PoolConfig config = adapters::PagedReference::default_config();
    config.blocks = blocks;
    return std::make_shared<adapters::PagedReference>(nullptr, config);
}

// One run of the mix: operations per second of wall-clock and of this
// process's CPU time (which other processes on a shared machine do not
// inflate); its steps run.
struct Rate {
    double wall = 0;
    double cpu = 0;
};

Rate ops_per_second(const Trace& trace, std::int64_t blocks, bool checked, std::size_t& steps) {
    const std::shared_ptr<adapters::PagedReference> engine = engine_of(blocks);
    RunOptions options;
    if (!checked) options.properties = PropertySet::none();
    const double start = now_seconds();
    const double cpu_start = cpu_seconds();
    const RunResult run = execute(trace, *engine, options);
    const double cpu = cpu_seconds() - cpu_start;
    const double seconds = now_seconds() - start;
    if (run.failure) throw std::runtime_error("the paged reference failed the mix: " + run.failure->message);
    steps = run.steps_run;
    return {static_cast<double>(run.steps_run) / seconds, static_cast<double>(run.steps_run) / cpu};
}

// $KVCHECK_BENCH_POOL_SIZES (e.g. "16,1024") runs fewer: a checked
// operation at 65,536 blocks costs seconds on a tree before issue 39's
// item 2, and a side-by-side run must finish (bench/paged_side_by_side.py).
std::vector<std::int64_t> pool_sizes_of_run() {
    const char* asked = std::getenv("KVCHECK_BENCH_POOL_SIZES");
    if (asked == nullptr || *asked == '\0') return {16, 1024, 65536};
    std::vector<std::int64_t> sizes;
    std::stringstream list(asked);
    for (std::string size; std::getline(list, size, ',');) sizes.push_back(std::stoll(size));
    return sizes;
}

const std::vector<std::int64_t> pool_sizes = pool_sizes_of_run();

void checked_by_pool_size(benchmark::State& state) {
    const Trace trace = paged_mix();
    std::vector<Samples> checked(pool_sizes.size()), unchecked(pool_sizes.size());
    std::vector<Samples> checked_cpu(pool_sizes.size()), unchecked_cpu(pool_sizes.size());
    std::size_t steps = 0;
    for (auto _ : state) {
        for (int r = 0; r < rounds; ++r) {
            for (std::size_t i = 0; i < pool_sizes.size(); ++i) {
                const Rate on = ops_per_second(trace, pool_sizes[i], true, steps);
                const Rate off = ops_per_second(trace, pool_sizes[i], false, steps);
                checked[i].add(on.wall);
                checked_cpu[i].add(on.cpu);
                unchecked[i].add(off.wall);
                unchecked_cpu[i].add(off.cpu);
            }
        }
    }
    for (std::size_t i = 0; i < pool_sizes.size(); ++i) {
        const std::string n = std::to_string(pool_sizes[i]);
        state.counters["checked_ops_s/" + n] = checked[i].median();
        state.counters["checked_ops_cpu_s/" + n] = checked_cpu[i].median();
        state.counters["unchecked_ops_s/" + n] = unchecked[i].median();
        state.counters["unchecked_ops_cpu_s/" + n] = unchecked_cpu[i].median();
    }
    state.counters["steps"] = static_cast<double>(steps);
}

// A model that computes nothing: zero K/V of the pool's geometry, next
// token 1. What remains of an alloc is the pool's own work.
class NullModel final : public kv::Model {
  public:
    explicit NullModel(const kv::paged::PoolConfig& config) : config_(config) {}
    std::int64_t forward(const std::vector<std::int64_t>& tokens, kv::Cache& cache) override {
        const auto n = static_cast<std::int64_t>(tokens.size());
        for (std::int64_t l = 0; l < config_.layers; ++l) {
            cache.update(at::zeros({1, config_.heads, n, config_.head_dim}), at::zeros({1, config_.heads, n, config_.head_dim}), l);
        }
        return 1;
    }
    std::int64_t eos_token() const override { return -1; }

  private:
    kv::paged::PoolConfig config_;
};

const kv::paged::Tokens prefix = {1, 2, 3, 1};
const kv::paged::Tokens request = {1, 2, 3, 1, 2, 2, 3, 3};

// 64 blocks: the step after each free (the reference publishes at the
// step, and its queue of publications grows until one) scans them all.
void pool_alloc_free(benchmark::State& state) {
    kv::paged::PoolConfig config = adapters::PagedReference::default_config();
    config.blocks = 64;
    NullModel model(config);
    kv::paged::Pool pool(config, model);
    pool.alloc("cached", {1, 2, 3, 1, 2}, "");
    pool.step();  // the prefix's 2 blocks published
    for (auto _ : state) {
        pool.alloc("r", request, "");
        pool.free("r");
        pool.step();
    }
}

void pool_lookup(benchmark::State& state) {
    kv::paged::PoolConfig config = adapters::PagedReference::default_config();
    config.blocks = 1024;
    NullModel model(config);
    kv::paged::Pool pool(config, model);
    pool.alloc("cached", {1, 2, 3, 1, 2}, "");
    pool.step();
    for (auto _ : state) benchmark::DoNotOptimize(pool.lookup(request, ""));
}

// The baseline: chain hash -> block in an unordered_map, a free list, a
// count per block; blocks of 2 tokens; the hits of a request are touched,
// the rest taken from the free list; a free releases them, last first.
class Baseline {
  public:
    explicit Baseline(std::int64_t blocks) : counts_(static_cast<std::size_t>(blocks)), keys_(static_cast<std::size_t>(blocks)) {
        for (std::int64_t b = 1; b < blocks; ++b) free_.push_back(b);
    }
    std::vector<std::int64_t> hits(const kv::paged::Tokens& tokens) const {
        std::vector<std::int64_t> found;
        std::uint64_t parent = 0;
        for (std::size_t i = 0; (i + 1) * 2 < tokens.size(); ++i) {
            parent = hash(parent, tokens[2 * i], tokens[2 * i + 1]);
            const auto at = index_.find(parent);
            if (at == index_.end()) break;
            found.push_back(at->second);
        }
        return found;
    }
    std::vector<std::int64_t> alloc(const kv::paged::Tokens& tokens) {
        std::vector<std::int64_t> table = hits(tokens);
        for (const std::int64_t b : table) {
            if (counts_[static_cast<std::size_t>(b)]++ == 0) free_.erase(std::find(free_.begin(), free_.end(), b));
        }
        std::uint64_t parent = 0;
        for (std::size_t i = 0; i < table.size(); ++i) parent = hash(parent, tokens[2 * i], tokens[2 * i + 1]);
        while (table.size() * 2 < tokens.size()) {
            const std::int64_t b = free_.front();
            free_.pop_front();
            const std::uint64_t old = keys_[static_cast<std::size_t>(b)];
            if (old != 0) index_.erase(old);  // evicted
            ++counts_[static_cast<std::size_t>(b)];
            const std::size_t i = table.size();
            if ((i + 1) * 2 <= tokens.size()) {
                parent = hash(parent, tokens[2 * i], tokens[2 * i + 1]);
                index_.emplace(parent, b);
                keys_[static_cast<std::size_t>(b)] = parent;
            } else {
                keys_[static_cast<std::size_t>(b)] = 0;
            }
            table.push_back(b);
        }
        return table;
    }
    void free(const std::vector<std::int64_t>& table) {
        for (auto it = table.rbegin(); it != table.rend(); ++it) {
            if (--counts_[static_cast<std::size_t>(*it)] == 0) free_.push_back(*it);
        }
    }

  private:
    static std::uint64_t hash(std::uint64_t parent, std::int64_t a, std::int64_t b) {
        std::uint64_t h = parent * 0x9E3779B97F4A7C15ULL ^ static_cast<std::uint64_t>(a) * 0xBF58476D1CE4E5B9ULL;
        h ^= static_cast<std::uint64_t>(b) * 0x94D049BB133111EBULL;
        return (h ^ (h >> 31)) | 1;  // never 0 (0: no key)
    }
    std::vector<std::int64_t> counts_;
    std::vector<std::uint64_t> keys_;
    std::deque<std::int64_t> free_;
    std::unordered_map<std::uint64_t, std::int64_t> index_;
};

void baseline_alloc_free(benchmark::State& state) {
    Baseline pool(64);
    pool.free(pool.alloc({1, 2, 3, 1, 2}));
    const auto cached = pool.alloc({1, 2, 3, 1, 2});  // held, as the reference's "cached" sequence
    for (auto _ : state) pool.free(pool.alloc(request));
    benchmark::DoNotOptimize(cached);
}

void baseline_lookup(benchmark::State& state) {
    Baseline pool(1024);
    const auto cached = pool.alloc({1, 2, 3, 1, 2});
    for (auto _ : state) benchmark::DoNotOptimize(pool.hits(request).size() * 2);
    benchmark::DoNotOptimize(cached);
}

BENCHMARK(checked_by_pool_size)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(pool_alloc_free)->Unit(benchmark::kMicrosecond);
BENCHMARK(baseline_alloc_free)->Unit(benchmark::kMicrosecond);
BENCHMARK(pool_lookup)->Unit(benchmark::kMicrosecond);
BENCHMARK(baseline_lookup)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvbench
