#include "trace_target.h"

#include "bundled.h"
#include "byte_chooser.h"
#include "extra_counters.h"
#include "sha1.h"

#include "kvcheck/domain.h"
#include "kvcheck/search.h"

#include <ATen/Parallel.h>
#include <boost/pfr.hpp>
#include <c10/util/Logging.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>

namespace kvcheck::fuzz {
namespace {

namespace fs = std::filesystem;

struct Settings {
    TraceTarget target;
    const Adapter* adapter = nullptr;
    Runner runner;                // how a shrink runs its candidates
    std::string program;          // argv[0], for the reproduce command
    std::string artifact_prefix;  // prepended to "crash-<sha1>.trace"
    std::string work_dir;         // this process's dump directory, emptied before each run
    TextLimits limits;
    bool shrink = true;
    bool print_trace = false;
    // Time to a verdict, as the failure report gives it: from the first
    // input this process ran (libtorch loaded, libFuzzer set up) to the
    // violation, then the shrink.
    std::optional<std::chrono::steady_clock::time_point> first_input;
    std::uint64_t inputs = 0;
};

Settings& settings() {
    static Settings instance;
    return instance;
}

std::string env_or(const char* name, const std::string& fallback) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? std::string(value) : fallback;
}

std::string flag_value(int argc, char** argv, const std::string& flag) {
    const std::string prefix = "-" + flag + "=";
    std::string value;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg.rfind(prefix, 0) == 0) value = arg.substr(prefix.size());
    }
    return value;
}

// Dumps are written and fsync'ed on every Dump operation: on tmpfs that
// costs nothing, on a disk it would dominate the run.
std::string make_work_dir() {
    std::string base = env_or("KVCHECK_FUZZ_TMPDIR", "");
    if (base.empty()) base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : fs::temp_directory_path().string();
    std::string pattern = base + "/kvcheck-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
        std::cerr << "kvcheck fuzz: cannot create a directory under " << base << "\n";
        std::exit(2);
    }
    return pattern;
}

void remove_work_dir() {
    std::error_code ignored;
    if (!settings().work_dir.empty()) fs::remove_all(settings().work_dir, ignored);
}

void print_settings(const Settings& s) {
    const WorkloadOptions& w = s.target.workload;
    const TextLimits& t = s.limits;
    std::cerr << "kvcheck fuzz target " << s.target.name << ": adapter " << s.adapter->name
              << (s.adapter->breaks.empty() ? "" : " (a mutant: " + s.adapter->description + ")") << "\n";
    if (!s.adapter->breaks.empty()) {
        std::cerr << "  breaks:";
        for (const Property property : s.adapter->breaks) std::cerr << " " << property_id(property);
        std::cerr << "\n";
    }
    std::cerr
              << "  choice bytes: trace_ops_max=" << w.trace_ops_max << " cache_layers_max=" << w.cache_layers_max
              << " layer_tokens_max=" << w.layer_tokens_max << " prompt_tokens_max=" << w.prompt_tokens_max
              << " new_tokens_max=" << w.new_tokens_max << " id_pool=" << w.id_pool << " dump_slots=" << w.dump_slots << "; "
              << describe_scope(w.scope) << "\n"
              << "  text traces: trace_ops_max=" << t.trace_ops_max << " cache_layers_max=" << t.cache_layers_max
              << " layer_tokens_max=" << t.layer_tokens_max << " heads_max=" << t.heads_max
              << " head_dim_max=" << t.head_dim_max << " slot_values_max=" << t.slot_values_max
              << " prompt_tokens_max=" << t.prompt_tokens_max
              << " new_tokens_max=" << t.new_tokens_max << " ids_max=" << t.ids_max << "\n"
              << "  shrunk traces go to " << (s.artifact_prefix.empty() ? "./" : s.artifact_prefix)
              << "crash-<sha1>.trace; dumps under " << s.work_dir << "; shrink " << (s.shrink ? "on" : "off") << "\n";
}

// ---- text traces ------------------------------------------------------------

// Why a text trace is over the limits; empty when it is within them. Every
// field of every operation is held to the limit of its kind, whatever the
// operation; an operation must also be well formed (its trait): the
// generator gives every cache-making operation a fresh handle, and a text
// trace that names h0 (no cache) or one of the operation's own sources as
// its output is outside what the executor models. A cache must be one of
// the engine's model when it declares one (kvcheck/domain.h): a real engine
// raises on any other.
std::string over_limits(const Trace& trace, const TextLimits& limits, const ModelDomain& model) {
    if (trace.size() > limits.trace_ops_max) return "too many operations";
    // One geometry per trace, as the workload draws it (a merge needs one);
    // dtypes may mix.
    std::optional<std::pair<std::int64_t, std::int64_t>> geometry;
    const auto cache_ok = [&](const CacheSpec& spec) {
        const std::pair<std::int64_t, std::int64_t> own{spec.heads, spec.head_dim};
        if (geometry && *geometry != own) return false;
        geometry = own;
        if (spec.heads > limits.heads_max || spec.head_dim > limits.head_dim_max) return false;
        if (!spec_fault(model, spec).empty()) return false;
        if (spec.layers.size() > limits.cache_layers_max) return false;
        for (const LayerSpec& layer : spec.layers) {
            if (layer.tokens < 0 || layer.tokens > limits.layer_tokens_max) return false;
            if (layer.tokens * spec.heads * spec.head_dim > limits.slot_values_max) return false;
        }
        return true;
    };
    const auto prompt_ok = [&](const Tokens& prompt) {
        if (prompt.size() > limits.prompt_tokens_max) return false;
        for (std::int64_t token : prompt) {
            if (token < 0 || token > limits.token_max) return false;
        }
        return true;
    };
    const auto integer_ok = [&](std::string_view field, std::int64_t value) {
        if (field == "max") return value >= 0 && value <= limits.new_tokens_max;
        if (field == "slot") return value >= 0 && value <= limits.dump_slot_max;
        if (field == "bytes") return value >= 0 && value <= limits.dump_crash_bytes_max;
        if (field == "count") return value >= 0 && value <= limits.fill_items_max;
        if (field == "first") return value >= 0 && value <= limits.fill_first_max;
        return true;  // offsets wrap, switches are tested for zero
    };
    for (const Op& operation : trace) {
        bool ok = op_well_formed(operation);
        std::visit(
            [&](const auto& o) {
                using T = std::decay_t<decltype(o)>;
                boost::pfr::for_each_field(o, [&](const auto& field, std::size_t index) {
                    using F = std::decay_t<decltype(field)>;
                    if constexpr (std::is_same_v<F, CacheSpec>) {
                        ok = cache_ok(field) && ok;
                    } else if constexpr (std::is_same_v<F, Tokens>) {
                        ok = ok && prompt_ok(field);
                    } else if constexpr (std::is_same_v<F, Ids> || std::is_same_v<F, HandleNames>) {
                        ok = ok && field.size() <= limits.ids_max;
                    } else if constexpr (std::is_same_v<F, std::int64_t>) {
                        ok = ok && integer_ok(T::fields[index], field);
                    }
                });
            },
            operation);
        if (!ok) return std::string("operation over the limits: ") + op_name(operation);
    }
    return {};
}

std::optional<Trace> decode(const std::uint8_t* data, std::size_t size, const Settings& s) {
    if (size > 0 && data[0] == '#') {
        try {
            Trace trace = parse_trace(std::string(reinterpret_cast<const char*>(data), size));
            if (!over_limits(trace, s.limits, s.target.workload.capabilities.model).empty()) return std::nullopt;
            return trace;
        } catch (const std::exception&) {
            return std::nullopt;  // TraceParseError, or a spec the parser rejects
        }
    }
    ByteChooser choose(data, size);
    return s.target.generate(choose, s.target.workload);
}

// ---- failures -----------------------------------------------------------------

std::string one_line(std::string text) {
    for (char& c : text) {
        if (c == '\n' || c == '\r') c = ' ';
    }
    return text;
}

// The corpus/regressions format: a header the replay tests read, then the trace.
std::string regression_text(const Settings& s, const Finding& shrunk, const std::string& reproduce) {
    const Failure& f = shrunk.reported;
    std::ostringstream text;
    text << "# kvcheck fuzz regression, found by fuzz_" << s.target.name << " on adapter " << s.adapter->name << "\n"
         << "# target: " << s.target.name << "\n"
         << "# adapter: " << s.adapter->name << "\n"
         << "# expect: " << f.property << "\n"
         << "# ERROR: " << f.property << ": " << one_line(f.message) << " at step " << f.step + 1 << "\n"
         << "# reproduce: " << reproduce << "\n"
         << format_trace(shrunk.shrunk.trace);
    return text.str();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

[[noreturn]] void report(const Trace& trace, const Failure& failure, const std::uint8_t* data, std::size_t size) {
    const Settings& s = settings();
    const double found_seconds = s.first_input ? seconds_since(*s.first_input) : 0.0;
    const auto shrink_start = std::chrono::steady_clock::now();
    std::cerr << "==kvcheck== fuzz_" << s.target.name << " on adapter " << s.adapter->name << ": " << failure.property
              << " violated at step " << failure.step + 1 << " of " << trace.size() << "\n";
    Finding shrunk;
    if (s.shrink) {
        shrunk = shrink_failure(s.runner, trace, failure);
    } else {
        shrunk.found = shrunk.shrunk.trace = trace;
        shrunk.found_failure = shrunk.shrunk.failure = shrunk.reported = failure;
    }
    const double shrink_seconds = seconds_since(shrink_start);
    const std::string file = s.artifact_prefix + "crash-" + sha1_hex(data, size) + ".trace";
    const std::string reproduce = replay_command(*s.adapter, file);
    std::ofstream out(file);
    out << regression_text(s, shrunk, reproduce);
    out.close();
    std::cerr << format_failure(shrunk.reported, shrunk.shrunk.trace, reproduce);
    if (out) {
        std::cerr << "INFO: kvcheck: shrunk " << trace.size() << " -> " << shrunk.shrunk.trace.size() << " operations in "
                  << shrunk.shrunk.runs << " runs; trace written to " << file << " (it also replays through this target: "
                  << "KVCHECK_ADAPTER=" << s.adapter->name << " " << s.program << " " << file << ")\n";
    } else {
        std::cerr << "WARNING: kvcheck: could not write " << file << "\n";
    }
    std::cerr << "INFO: kvcheck: found after " << found_seconds << " s and " << s.inputs
              << " inputs (from the first input this process ran), shrunk in " << shrink_seconds << " s\n";
    remove_work_dir();  // abort() skips atexit
    std::abort();
}

}  // namespace

// Dumps of the run before are removed first: each run starts with empty slots.
void empty_work_dir() {
    const std::string& dir = settings().work_dir;
    std::error_code ignored;
    fs::remove_all(dir, ignored);
    fs::create_directories(dir, ignored);
}

RunResult execute_fresh(const Trace& trace, const EngineFactory& make, const RunOptions& options) {
    const std::shared_ptr<Engine> engine = make();
    return execute(trace, *engine, options);
}

void init_target(int* argc, char*** argv, TraceTarget target) {
    // One thread: the tensors are tiny, and the cores are the fuzzer's.
    at::set_num_threads(1);
    // A c10::Error records a symbolized C++ backtrace, which costs far more
    // than a step; the failure report names the step instead.
    c10::SetStackTraceFetcher([] { return std::string("(backtrace off in fuzz targets)"); });
    Settings& s = settings();
    s.target = std::move(target);
    s.program = (*argc > 0) ? (*argv)[0] : "fuzz_" + s.target.name;
    const std::string name = env_or("KVCHECK_ADAPTER", s.target.default_adapter);
    s.adapter = adapters::find_bundled(name);
    if (s.adapter == nullptr) {
        std::cerr << "kvcheck fuzz: unknown adapter '" << name << "'; bundled:";
        for (const auto& a : adapters::bundled()) std::cerr << " " << a.name;
        std::cerr << "\n";
        std::exit(2);
    }
    s.target.workload.capabilities = s.adapter->make()->capabilities();
    const std::string dir = env_or("KVCHECK_ARTIFACT_DIR", "");
    s.artifact_prefix = dir.empty() ? flag_value(*argc, *argv, "artifact_prefix") : dir + "/";
    s.shrink = env_or("KVCHECK_SHRINK", "1") != "0";
    s.print_trace = env_or("KVCHECK_PRINT_TRACE", "0") != "0";
    s.work_dir = make_work_dir();
    std::atexit(remove_work_dir);
    // Shrinking runs each candidate the target's way, on fresh engines, and
    // keeps to the traces this target accepts as text, so that the shrunk
    // trace replays through it.
    s.runner.make = s.adapter->make;
    s.runner.options.work_dir = s.work_dir;
    s.runner.options.fresh_engine = s.adapter->make;  // dump_kill runs when fuzzing as when shrinking
    s.runner.before_run = [](const Trace&) { empty_work_dir(); };
    s.runner.shrink_accepts = [](const Trace& candidate) {
        return over_limits(candidate, settings().limits, settings().target.workload.capabilities.model).empty();
    };
    s.runner.check = [](const Trace& candidate, const RunOptions& options) {
        return settings().target.check(candidate, settings().adapter->make, options);
    };
    print_settings(s);
}

int run_input(const std::uint8_t* data, std::size_t size) {
    Settings& s = settings();
    if (!s.first_input) s.first_input = std::chrono::steady_clock::now();
    ++s.inputs;
    const std::optional<Trace> trace = decode(data, size, s);
    if (!trace) return -1;
    if (s.print_trace) std::cerr << "---- trace (" << trace->size() << " operations)\n" << format_trace(*trace);
    empty_work_dir();
    RunOptions options = s.runner.options;
    options.record_states = true;
    const RunResult result = s.target.check(*trace, s.adapter->make, options);
    count_states(result.coverage.states);
    if (result.failure) report(*trace, *result.failure, data, size);
    return 0;
}

}  // namespace kvcheck::fuzz
