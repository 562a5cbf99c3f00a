// The generation path, generate(get_cache(id)), through the engine
// interface, for the reference and for M3 (the double-copy mutant): the K/V
// copies and bytes the engine logs, the peak K/V sets alive it reports, the
// time of one path, and the peak resident memory the path adds, measured
// in a child process (this binary run again with --rss-child) so that each
// measurement starts from a clean heap.
//
// Also the main of kv_bench_copy: the child mode comes before Google
// Benchmark sees the arguments.
#include "bench_util.h"

#include "bundled.h"

#include <benchmark/benchmark.h>

#include <malloc.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvbench {
namespace {

using kvcheck::Engine;

// kvcheck caches have the decoder's geometry ([1, 2 heads, seq, 4]); a
// two-layer float32 cache holds 128 bytes per token.
constexpr std::int64_t path_layers = 2;
constexpr std::int64_t token_bytes = path_layers * 2 * kvcheck::cache_heads * kvcheck::cache_head_dim * 4;

const std::vector<std::int64_t> path_prompt = {5, 7};
constexpr std::int64_t path_new_tokens_max = 4;
constexpr kvcheck::Handle path_handle = 1;

kvcheck::CacheContent content_of_bytes(std::int64_t cache_bytes) {
    kvcheck::CacheSpec spec;
    spec.seed = 7;
    const std::int64_t tokens = std::max<std::int64_t>(1, cache_bytes / token_bytes);
    for (std::int64_t i = 0; i < path_layers; ++i) spec.layers.push_back({0b11, true, tokens});
    return kvcheck::expand(spec);
}

std::shared_ptr<Engine> make_engine(const std::string& adapter) {
    const kvcheck::Adapter* bundled = kvcheck::adapters::find_bundled(adapter);
    if (!bundled) throw std::invalid_argument("no bundled adapter " + adapter);
    return bundled->make();
}

struct PathFacts {
    std::size_t copies = 0;
    std::int64_t bytes_copied = 0;
    std::int64_t peak_live_sets = 0;
};

// One generate(get_cache({"a"})), the copy handed to the model released
// after, as a caller would.
PathFacts run_path(Engine& engine) {
    engine.take_copies();
    engine.get_cache({"a"}, path_handle);
    const kvcheck::GenerateResult result = engine.generate(path_handle, path_prompt, path_new_tokens_max, false);
    engine.release(path_handle);
    PathFacts facts;
    for (const kvcheck::CopyRecord& copy : engine.take_copies()) {
        ++facts.copies;
        facts.bytes_copied += copy.bytes;
    }
    facts.peak_live_sets = result.peak_live_sets;
    return facts;
}

// ---- peak resident memory, in a child process ----

std::int64_t status_kib(const char* field) {
    std::ifstream status("/proc/self/status");
    std::string line;
    const std::string prefix = std::string(field) + ":";
    while (std::getline(status, line)) {
        if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size()));
    }
    throw std::runtime_error(std::string("no ") + field + " in /proc/self/status");
}

// The child: stores a cache of `cache_bytes`, resets the peak (VmHWM), runs
// the path once and prints how far the peak rose above the resident size
// before it. glibc is told to map every allocation of 1 MiB or more on its
// own, so that freed K/V leaves the resident set at once: the peak is then
// the K/V alive at the worst moment, not what the allocator keeps cached.
int rss_child(const std::string& adapter, std::int64_t cache_bytes) {
    ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
    const std::shared_ptr<Engine> engine = make_engine(adapter);
    engine->add("a", content_of_bytes(cache_bytes), {});
    ::malloc_trim(0);
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to VmRSS
    const std::int64_t before_kib = status_kib("VmRSS");
    run_path(*engine);
    const std::int64_t peak_kib = status_kib("VmHWM");
    std::printf("%lld\n", static_cast<long long>((peak_kib - before_kib) * 1024));
    return 0;
}

std::string self_path;

std::int64_t peak_rss_added(const std::string& adapter, std::int64_t cache_bytes) {
    const std::string command = "'" + self_path + "' --rss-child " + adapter + " " + std::to_string(cache_bytes);
    FILE* child = ::popen(command.c_str(), "r");
    if (!child) throw std::runtime_error("cannot run " + command);
    long long bytes = -1;
    const int read = std::fscanf(child, "%lld", &bytes);
    if (::pclose(child) != 0 || read != 1) throw std::runtime_error("the child failed: " + command);
    return bytes;
}

// ---- the benchmark ----

void generation_path(benchmark::State& state, const std::string& adapter, std::int64_t cache_bytes) {
    const std::shared_ptr<Engine> engine = make_engine(adapter);
    const kvcheck::CacheContent content = content_of_bytes(cache_bytes);
    engine->add("a", content, {});
    const double stored_bytes = static_cast<double>(kvcheck::content_seq_length(content) * token_bytes);
    Samples seconds;
    PathFacts facts;
    for (auto _ : state) {
        const double start = now_seconds();
        facts = run_path(*engine);
        seconds.add(now_seconds() - start);
    }
    state.counters["cache_bytes"] = stored_bytes;
    state.counters["copies"] = static_cast<double>(facts.copies);
    state.counters["bytes_copied"] = static_cast<double>(facts.bytes_copied);
    state.counters["copied_in_caches"] = static_cast<double>(facts.bytes_copied) / stored_bytes;
    state.counters["peak_live_sets"] = static_cast<double>(facts.peak_live_sets);
    state.counters["path_ms"] = seconds.median() * 1e3;
    if (cache_bytes >= (std::int64_t{16} << 20)) {
        const auto added = static_cast<double>(peak_rss_added(adapter, cache_bytes));
        state.counters["peak_rss_added_MiB"] = added / (1 << 20);
        state.counters["peak_rss_added_in_caches"] = added / stored_bytes;
    }
}

const bool registered = [] {
    for (const char* adapter : {"reference", "M3"}) {
        for (const std::int64_t kib : {64, 1024, 16 * 1024, 64 * 1024}) {
            const std::int64_t bytes = kib * 1024;
            const std::string size = kib >= 1024 ? std::to_string(kib / 1024) + "MiB" : std::to_string(kib) + "KiB";
            benchmark::RegisterBenchmark(("generation_path/" + std::string(adapter) + "/" + size).c_str(),
                                         generation_path, std::string(adapter), bytes)
                ->Iterations(kib >= 16 * 1024 ? 3 : 50)
                ->Unit(benchmark::kMillisecond);
        }
    }
    return true;
}();

}  // namespace
}  // namespace kvbench

int main(int argc, char** argv) {
    if (argc == 4 && std::string(argv[1]) == "--rss-child") {
        return kvbench::rss_child(argv[2], std::stoll(argv[3]));
    }
    kvbench::self_path = std::filesystem::read_symlink("/proc/self/exe").string();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
