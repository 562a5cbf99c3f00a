#include "commands.h"

#include "adapters.h"
#include "conformance.h"
#include "interrupt.h"
#include "kv/store.h"
#include "kvcheck/limits.h"
#include "kvcheck/plugin.h"
#include "output.h"
#include "report.h"
#include "report_html.h"
#include "text.h"
#include "thread_run.h"
#include "wire.h"

#include <boost/pfr.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>
#include <thread>

#include <unistd.h>

namespace kvcheck::cli {
namespace {

struct OptionSpec {
    std::string name;
    bool takes_value;
    std::string help;
};

// Parsed options: each name maps to every value it was given ("" for flags).
class Options {
  public:
    Options(const Args& args, const std::vector<OptionSpec>& specs, const std::string& command) {
        for (std::size_t i = 0; i < args.size(); ++i) {
            const std::string& arg = args[i];
            if (arg == "--help" || arg == "-h") {
                help_ = true;
                continue;
            }
            if (arg.rfind("--", 0) != 0) {
                positional_.push_back(arg);
                continue;
            }
            std::string name = arg.substr(2);
            std::optional<std::string> inline_value;
            if (const std::size_t eq = name.find('='); eq != std::string::npos) {
                inline_value = name.substr(eq + 1);
                name = name.substr(0, eq);
            }
            const auto spec = std::find_if(specs.begin(), specs.end(), [&](const OptionSpec& s) { return s.name == name; });
            if (spec == specs.end()) throw UsageError("unknown option --" + name + " for '" + command + "' (see kvcheck " + command + " --help)");
            if (!spec->takes_value) {
                values_[name].push_back("");
                continue;
            }
            if (!inline_value && i + 1 >= args.size()) throw UsageError("--" + name + " needs a value");
            values_[name].push_back(inline_value ? *inline_value : args[++i]);
        }
    }

    bool help() const { return help_; }
    bool has(const std::string& name) const { return values_.count(name) != 0; }
    const std::vector<std::string>& all(const std::string& name) const {
        static const std::vector<std::string> none;
        const auto found = values_.find(name);
        return found == values_.end() ? none : found->second;
    }
    std::string get(const std::string& name, const std::string& fallback) const {
        return has(name) ? values_.at(name).back() : fallback;
    }
    // A whole number of decimal digits only (no sign, no spaces: stoull
    // reads " -1" as 2^64 - 1), within [low, high].
    std::uint64_t number(const std::string& name, std::uint64_t fallback, std::uint64_t low, std::uint64_t high) const {
        if (!has(name)) return fallback;
        const std::string text = values_.at(name).back();
        const bool digits = !text.empty() && text.size() <= 20 && text.find_first_not_of("0123456789") == std::string::npos;
        errno = 0;
        const unsigned long long value = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
        if (!digits || errno == ERANGE) throw UsageError("--" + name + " takes a whole number, not '" + printable(text, 40) + "'");
        if (value < low || value > high) {
            throw UsageError("--" + name + " must be between " + std::to_string(low) + " and " + std::to_string(high) +
                             ", not " + text);
        }
        return value;
    }
    // A finite decimal number within [low, high] (`low` excluded when
    // `low_excluded`): no "nan", "inf", hex or leading spaces.
    double real(const std::string& name, double fallback, double low, bool low_excluded, double high) const {
        if (!has(name)) return fallback;
        const std::string text = values_.at(name).back();
        const bool plain = !text.empty() && text.size() <= 32 && text.find_first_not_of("0123456789.eE+-") == std::string::npos;
        char* end = nullptr;
        const double value = plain ? std::strtod(text.c_str(), &end) : 0;
        if (!plain || end != text.c_str() + text.size() || !std::isfinite(value)) {
            throw UsageError("--" + name + " takes a number of seconds, not '" + printable(text, 40) + "'");
        }
        if (value < low || (low_excluded && value == low) || value > high) {
            char range[96];
            std::snprintf(range, sizeof range, "%s %g and at most %g", low_excluded ? "more than" : "at least", low, high);
            throw UsageError("--" + name + " must be " + range + ", not " + text);
        }
        return value;
    }
    const std::vector<std::string>& positional() const { return positional_; }

  private:
    bool help_ = false;
    std::map<std::string, std::vector<std::string>> values_;
    std::vector<std::string> positional_;
};

std::string usage_of(const std::string& synopsis, const std::string& about, const std::vector<OptionSpec>& specs) {
    std::ostringstream out;
    out << "usage: " << synopsis << "\n\n" << about << "\n\noptions:\n";
    for (const OptionSpec& spec : specs) {
        std::string left = "  --" + spec.name + (spec.takes_value ? " VALUE" : "");
        if (left.size() < 26) left.append(26 - left.size(), ' ');
        out << left << " " << spec.help << "\n";
    }
    out << "  --help                   this text\n";
    return out.str();
}

const std::vector<OptionSpec> isolation_options = {
    {"python", true, "the interpreter of a Python script adapter (default $KVCHECK_PYTHON, else the script's #!\n"
                       "                             interpreter, else $VIRTUAL_ENV/bin/python, else the python beside\n"
                       "                             kvcheck, else /usr/bin/python3)"},
    {"timeout", true, "seconds one operation may run without progress before the engine counts as hung (default 30,\n"
                        "                             at least 1)"},
    {"total-timeout", true, "seconds one engine process may run in all, 0 for no limit, else at least 1 (default 3600;\n"
                              "                             run --seconds adds its budget)"},
    {"memory-mb", true, "resident memory limit of the engine's process and of those it starts, MiB (default 4096)"},
    {"no-isolate", false, "run the engine in kvcheck's own process (for debuggers; a crash ends kvcheck)"},
};

const std::vector<OptionSpec> run_options = [] {
    std::vector<OptionSpec> specs = {
        {"adapter", true, "bundled name (see kvcheck list), plugin path, Python script (x.py ARGS) or exec:COMMAND;\n"
                          "                             repeatable. Default: all bundled adapters"},
        {"property", true, "a property id (see kvcheck list); repeatable. Default: all"},
        {"seed", true, "the run's seed (default 20261202); trace i of the p-th property uses a seed mixed\n"
                       "                             from (seed, p, i) by splitmix64: other seeds, other traces"},
        {"cases", true, "traces per property (default 200)"},
        {"scope", true, "sizes of the caches traces draw: small, default or large (for nightly runs)"},
        {"lanes", true, "clients per trace (default 1): above 1, each trace is that many lanes of requests\n"
                        "                             interleaved by a seeded schedule (random or PCT), checked call by call\n"
                        "                             (docs/semantics.md#concurrent-clients); at most 15"},
        {"threads", false, "the thread level: each of --lanes clients (default 3) calls on a thread of its own, the calls\n"
                           "                             overlapping, a seeded schedule switching at yield points; judges at every quiescent\n"
                           "                             point refcount-exact and free-iff-unreferenced (paged engines) or stored-immutable,\n"
                           "                             store-contract and linearizable, and dump-safe at the end (unbounded stores)\n"
                           "                             (docs/semantics.md#the-thread-level); for engines that declare thread_safe\n"
                           "                             (others: n/a). --cases: traces per adapter"},
        {"model", true, "search one model's caches only, instead of what each engine declares:\n"
                        "                             layers=N,heads=N,head_dim=N,dtype=f32[+f16+bf16],layout=modern[+legacy]\n"
                        "                             [,odd_layers=yes|no] (heads, head_dim default 2, 4; odd_layers no)"},
        {"seconds", true, "time per property instead of a case count"},
        {"failures", true, "distinct failures reported per property (default 3): after a failure, the search goes on\n"
                           "                             within its budget for failures of other checks or messages, each shrunk"},
        {"replays", true, "replays of each shrunk failure on a fresh engine before it is reported (default 3; 0: none):\n"
                          "                             some failing: flaky; none: the earlier trace that makes it fail (shared-state)"},
        {"report", true, "table (default), json, junit, markdown or html (one page, each failure drawn step by step)"},
        {"out", true, "write the report to this file instead of standard output"},
        {"also-report", true, "FORMAT=FILE: also write the run's report in FORMAT to FILE; repeatable (one run, several\n"
                              "                             formats: junit for CI and html for people, say)"},
        {"trace-dir", true, "where failing traces are written (default kvcheck-traces)"},
        {"jobs", true, "engine processes at once (default: the number of cores)"},
        {"quiet", false, "no progress lines on standard error"},
        {"stats", false, "also print how often each shape of interest occurred in the traces run"},
        {"progress-seconds", true, "seconds between progress lines of a task (default 5; 0: at every step of progress)"},
    };
    specs.insert(specs.end(), isolation_options.begin(), isolation_options.end());
    return specs;
}();

const std::vector<OptionSpec> replay_options = [] {
    std::vector<OptionSpec> specs = {
        {"adapter", true, "bundled name, plugin path, Python script or exec:COMMAND (required)"},
        {"property", true, "check only these properties; repeatable. Default: all"},
        {"prefix", true, "a trace file run first, on its own engine in the same engine process (the first part of\n"
                         "                             a shared-state finding's reproducer)"},
        {"quiet", false, "no progress lines on standard error"},
        {"progress-seconds", true, "seconds between progress lines (default 5; 0: at every step of progress)"},
    };
    specs.insert(specs.end(), isolation_options.begin(), isolation_options.end());
    return specs;
}();

const std::vector<OptionSpec> shrink_options = [] {
    std::vector<OptionSpec> specs;
    for (const OptionSpec& spec : replay_options) {
        if (spec.name != "prefix") specs.push_back(spec);
    }
    specs.push_back({"out", true, "write the shrunk trace to this file (default: standard output, the report then on stderr)"});
    specs.push_back({"model", true, "keep the shrunk trace's caches in this model (as run --model; default: what the engine declares)"});
    return specs;
}();

std::vector<Property> chosen_properties(const Options& options) {
    std::vector<Property> properties;
    for (const std::string& id : options.all("property")) {
        const std::optional<Property> property = parse_property(id);
        if (!property) {
            std::string known;
            for (Property p : all_properties()) known += std::string(" ") + property_id(p);
            throw UsageError("unknown property '" + id + "'; known:" + known);
        }
        properties.push_back(*property);
    }
    return properties;
}

// The bounds of the numeric options: wide enough for any real use, narrow
// enough that no value overflows or disables a limit.
constexpr std::uint64_t cases_max = 1'000'000'000;
constexpr std::uint64_t jobs_max = 256;
constexpr std::uint64_t failures_per_property_max = 100;  // --failures: each is shrunk and written
constexpr std::uint64_t replays_max = 1000;               // --replays: each a fresh engine process
constexpr double seconds_max = 10'000'000;               // a run's budget per property: about four months
constexpr double operation_seconds_max = 7 * 24 * 3600;  // --timeout: a week
// The shortest --timeout and --total-timeout: the limits are polled every
// 0.2 s, and an engine process takes a good part of a second to start (a
// Python one, seconds), so a shorter limit would make every engine a fault.
constexpr double limit_seconds_min = 1;
constexpr std::uint64_t memory_mb_max = std::uint64_t{1} << 24;  // 16 TiB: the shift to bytes cannot overflow
// Head room over kvcheck's own resident size that --memory-mb must leave:
// an engine process starts as a copy of kvcheck.
constexpr std::uint64_t memory_mb_headroom = 64;

std::uint64_t own_resident_mb() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return (std::strtoull(line.c_str() + 6, nullptr, 10) + 1023) / 1024;
    }
    return 0;
}

ConformanceOptions conformance_options(const Options& options) {
    ConformanceOptions conformance;
    conformance.seed = options.number("seed", conformance.seed, 0, UINT64_MAX);
    conformance.cases = options.number("cases", conformance.cases, 1, cases_max);
    conformance.seconds = options.real("seconds", 0, 0, true, seconds_max);
    if (options.has("cases") && options.has("seconds")) throw UsageError("give --cases or --seconds, not both");
    conformance.failures_max = options.number("failures", conformance.failures_max, 1, failures_per_property_max);
    conformance.replays = options.number("replays", conformance.replays, 0, replays_max);
    conformance.properties = chosen_properties(options);
    conformance.limits.silence_seconds =
        options.real("timeout", conformance.limits.silence_seconds, limit_seconds_min, false, operation_seconds_max);
    conformance.limits.total_seconds = options.real("total-timeout", conformance.limits.total_seconds, 0, false, seconds_max);
    if (conformance.limits.total_seconds > 0 && conformance.limits.total_seconds < limit_seconds_min) {
        throw UsageError("--total-timeout must be 0 (no limit) or at least " + seconds_text(limit_seconds_min) + ", not " +
                         options.get("total-timeout", ""));
    }
    const std::uint64_t memory_mb_min = own_resident_mb() + memory_mb_headroom;
    const std::uint64_t memory_mb = options.number("memory-mb", 4096, 1, memory_mb_max);
    if (memory_mb < memory_mb_min) {
        throw UsageError("--memory-mb " + std::to_string(memory_mb) + " is too small: an engine process starts as a copy of "
                         "kvcheck, which holds " + std::to_string(memory_mb_min - memory_mb_headroom) +
                         " MiB; give at least " + std::to_string(memory_mb_min));
    }
    conformance.limits.memory_bytes = static_cast<std::int64_t>(memory_mb) << 20;
    conformance.isolate = !options.has("no-isolate");
    conformance.trace_dir = options.get("trace-dir", conformance.trace_dir);
    conformance.progress = !options.has("quiet");
    conformance.progress_seconds = options.real("progress-seconds", conformance.progress_seconds, 0, false, seconds_max);
    conformance.jobs = options.number("jobs", std::clamp<std::uint64_t>(std::thread::hardware_concurrency(), 1, jobs_max), 1, jobs_max);
    try {
        conformance.workload.scope = scope_named(options.get("scope", "default"));
    } catch (const std::invalid_argument& error) {
        throw UsageError(std::string("--scope: ") + error.what());
    }
    conformance.workload.lanes = static_cast<std::int64_t>(options.number("lanes", 1, 1, op::SwitchLane::lanes_max - 1));
    if (options.has("model")) {
        try {
            conformance.model = parse_model_domain(options.get("model", ""));
        } catch (const std::invalid_argument& error) {
            throw UsageError("--model: " + printable(error.what(), 200) + " (see kvcheck run --help)");
        }
    }
    return conformance;
}

AdapterOptions adapter_options(const Options& options) {
    AdapterOptions adapter;
    adapter.python = options.get("python", "");
    adapter.thread_seed = options.number("seed", ConformanceOptions{}.seed, 0, UINT64_MAX);
    return adapter;
}

std::string limits_text(const Limits& limits) {
    return "limits per engine process: " + seconds_text(limits.silence_seconds) + " s per operation without progress, " +
           (limits.total_seconds > 0 ? seconds_text(limits.total_seconds) + " s" : std::string("no limit")) + " in all, " +
           std::to_string(limits.memory_bytes >> 20) + " MiB resident";
}

// With --no-isolate the engines run in kvcheck's own process: what they
// print to standard output goes to standard error meanwhile, so that a
// report on standard output stays valid.
class EngineStdoutToStderr {
  public:
    explicit EngineStdoutToStderr(bool active) {
        if (!active) return;
        std::fflush(stdout);
        std::cout.flush();
        saved_ = ::dup(STDOUT_FILENO);
        if (saved_ >= 0) ::dup2(STDERR_FILENO, STDOUT_FILENO);
    }
    ~EngineStdoutToStderr() {
        if (saved_ < 0) return;
        std::fflush(stdout);
        std::cout.flush();
        ::dup2(saved_, STDOUT_FILENO);
        ::close(saved_);
    }
    EngineStdoutToStderr(const EngineStdoutToStderr&) = delete;
    EngineStdoutToStderr& operator=(const EngineStdoutToStderr&) = delete;

  private:
    int saved_ = -1;
};

// What the engines of an adapter loaded in this process declare, asked of
// one made here, kept on the adapter as a process adapter's handshake keeps
// it (Adapter::model, paged, store, policy): a run then starts no job for a
// property the adapter cannot be judged on, and a list leaves it out
// (known_not_applicable).
void learn_declared(Adapter& adapter) {
    if (adapter.model.has_value()) return;
    const Capabilities capabilities = adapter.make()->capabilities();
    adapter.model = capabilities.model;
    adapter.paged = capabilities.paged;
    adapter.store = capabilities.store;
    adapter.policy = capabilities.policy;
}

// The model domain the run searches, for its first line: --model, or what
// each adapter declares. A bundled adapter was asked (learn_declared); a
// process adapter said it in its handshake; a plugin is not loaded here
// (plugin_probe.h): the report says what it declared.
std::string domains_searched(const std::vector<Adapter>& adapters, const std::optional<ModelDomain>& model) {
    if (model) return domain_text(*model);
    std::vector<std::string> texts;
    for (const Adapter& adapter : adapters) {
        texts.push_back(adapter.model ? domain_text(*adapter.model) : "as it declares (in the report)");
    }
    if (std::all_of(texts.begin(), texts.end(), [&](const std::string& t) { return t == texts.front(); })) {
        return texts.empty() ? "" : texts.front();
    }
    std::string text;
    for (std::size_t i = 0; i < adapters.size(); ++i) {
        text += (i == 0 ? "" : "; ") + printable(adapters[i].name, 40) + " " + texts[i];
    }
    return text;
}

PropertySet property_set(const std::vector<Property>& properties) {
    if (properties.empty()) return PropertySet::all();
    PropertySet set = PropertySet::none();
    for (Property p : properties) set.add(p);
    return set;
}

// A trace file is text of one line per operation; a 10,000-operation trace
// is half a megabyte.
constexpr std::size_t trace_bytes_max = std::size_t{64} << 20;

// A cache the trace asks for beyond what generated traces hold (a
// hand-written 4,096 layers of 10^6 tokens made the reference allocate
// until it was stopped as hung) is refused before anything runs.
void refuse_over_limits(const std::string& path, const Trace& trace) {
    for (std::size_t step = 0; step < trace.size(); ++step) {
        std::visit(
            [&](const auto& op) {
                boost::pfr::for_each_field(op, [&](const auto& field) {
                    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, CacheSpec>) {
                        const std::string fault = spec_over_limits(field);
                        if (!fault.empty()) {
                            throw UsageError(path + ": operation " + std::to_string(step + 1) + " (" + op_name(trace[step]) +
                                             ") asks for a cache beyond kvcheck's limits: " + fault);
                        }
                    }
                });
            },
            trace[step]);
    }
}

// A regular file only (InputFile): a FIFO would block, a device never end.
std::string read_trace_text(const std::string& path) {
    const InputFile file(path);
    if (file.fd() < 0) throw UsageError("trace file " + printable(path, 400) + " " + file.problem());
    // Read with a bound too: the file may grow while it is read.
    std::string text;
    if (file.bytes() <= trace_bytes_max && !file.read(trace_bytes_max, &text)) {
        throw UsageError("cannot read trace file " + path + ": " + std::strerror(errno));
    }
    if (file.bytes() > trace_bytes_max || text.size() > trace_bytes_max) {
        throw UsageError(path + " holds more than the " + std::to_string(trace_bytes_max >> 20) + " MiB a trace file may hold");
    }
    // Every trace file kvcheck writes holds its header at least: an empty
    // one is a write cut short (a full disk), not a trace that passes.
    if (text.empty()) {
        throw UsageError("trace file " + printable(path, 400) + " is empty (0 bytes): no trace to replay (a trace kvcheck "
                         "writes has a header; was its write cut short?)");
    }
    return text;
}

// A thread-level trace file (its `threads` line, kvcheck/threads.h), or
// nothing for any other.
std::optional<ThreadTrace> read_thread_trace(const std::string& path, const std::string& text) {
    std::optional<ThreadTrace> threads;
    try {
        threads = parse_thread_trace(text);
    } catch (const TraceParseError& error) {
        throw UsageError(path + ": " + printable(error.what(), 300));
    }
    if (threads) {
        for (const Trace& lane : threads->plan.lanes) refuse_over_limits(path, lane);
    }
    return threads;
}

Trace parse_trace_file(const std::string& path, const std::string& text) {
    Trace trace;
    try {
        trace = parse_trace(text);
    } catch (const TraceParseError& error) {
        throw UsageError(path + ": " + printable(error.what(), 300));
    }
    refuse_over_limits(path, trace);
    return trace;
}

Trace read_trace(const std::string& path) { return parse_trace_file(path, read_trace_text(path)); }

// The message and notes of a failure, fit for a terminal: an engine's
// exception text may hold anything.
Failure printable_failure(Failure failure) {
    failure.message = printable(failure.message, 2000);
    for (std::string& other : failure.also) other = printable(other, 2000);
    return failure;
}

// The bundled self-check passes when the reference holds every property and
// every mutant is caught by a property it is known to break.
bool bundled_as_expected(const std::vector<AdapterResult>& results, std::ostream& out) {
    bool ok = true;
    for (const AdapterResult& result : results) {
        const auto& breaks = result.adapter.breaks;
        if (breaks.empty()) {
            if (!result.all_pass()) {
                out << "unexpected: " << result.adapter.name << " fails a property\n";
                ok = false;
            }
            continue;
        }
        const bool caught = std::any_of(breaks.begin(), breaks.end(), [&](Property p) { return result.fails(property_id(p)); });
        if (!caught) {
            out << "unexpected: mutant " << result.adapter.name << " (" << result.adapter.description << ") was not caught\n";
            ok = false;
        }
    }
    return ok;
}

}  // namespace

int command_help(const Args&) {
    std::cout << "kvcheck: verification and fuzz testing of KV-cache ownership\n\n"
                 "usage: kvcheck <command> [options]\n\n"
                 "commands:\n"
                 "  list                       the bundled adapters and the properties\n"
                 "  run [--adapter A ...]      check adapters against the properties; with no --adapter,\n"
                 "                             the reference and every mutant (the property x adapter table)\n"
                 "  replay TRACE --adapter A   run one trace file and report what it violates\n"
                 "  shrink TRACE --adapter A   shrink a failing trace file to a short one\n"
                 "  check-dump FILE|DIR        validate a dump file and say what it holds\n"
                 "  --version                  this kvcheck's version and formats\n"
                 "\nexit codes: 0 all properties hold, 1 a property fails, 2 usage or adapter load error,\n"
                 "128+N interrupted by signal N (the report so far is written, marked incomplete).\n"
                 "kvcheck <command> --help describes each command's options.\n";
    return 0;
}

int command_version(const Args&) {
    std::cout << "kvcheck " KVCHECK_VERSION "\n"
              << "report format " << report_format_version << ", plugin ABI " << KVCHECK_PLUGIN_ABI_VERSION
              << ", dump format " << kv::dump_format_version << ", adapter protocol " << process::protocol_version
              << "\n";
    return 0;
}

const std::vector<OptionSpec> list_options = {
    {"adapter", true, "list only the properties this adapter can be judged on (bundled name, plugin path, Python\n"
                      "                             script or exec:COMMAND: its handshake says its cache families)"},
    {"python", true, "the interpreter of a .py adapter (as kvcheck run --python)"},
};

// kvcheck list --adapter A: the properties A can be judged on, then one
// line saying how many are left out and why (as the reports say it), for
// the pytest plugin, which collects an item per property before any run.
int list_for_adapter(const Options& options) {
    Adapter adapter = load_adapter(options.get("adapter", ""), adapter_options(options));
    learn_declared(adapter);  // an engine in this process (bundled, a plugin): one made says
    std::cout << "adapter: " << printable(adapter.name, 80) << "\n\nproperties:\n";
    std::vector<PropertyResult> left_out;
    for (Property p : all_properties()) {
        const std::string id = property_id(p);
        // A list is of a run of one client: linearizable is judged with --lanes only.
        const char* message = p == Property::linearizable ? lanes_not_applicable : known_not_applicable(adapter, p);
        if (message != nullptr) {
            PropertyResult row;
            row.id = id;
            row.verdict = "skipped";
            row.message = message;
            left_out.push_back(std::move(row));
            continue;
        }
        std::cout << "  " << id << std::string(24 - id.size(), ' ') << property_summary(p) << "\n";
    }
    const std::string note = not_applicable_note(left_out, "for this adapter");
    if (!note.empty()) std::cout << "\n" << note << "\n";
    return 0;
}

int command_list(const Args& args) {
    const Options options(args, list_options, "list");
    if (options.help()) {
        std::cout << usage_of("kvcheck list [--adapter NAME|PATH [--python PATH]]",
                              "Lists the bundled adapters and the properties; with --adapter, the properties that\n"
                              "adapter can be judged on, and how many are left out and why.",
                              list_options);
        return 0;
    }
    if (!options.positional().empty()) throw UsageError("unexpected argument '" + printable(options.positional().front(), 80) + "'");
    if (options.has("adapter")) return list_for_adapter(options);
    std::cout << "adapters (bundled):\n";
    for (const Adapter& adapter : bundled_adapters()) {
        std::string breaks;
        for (const Property p : adapter.breaks) breaks += (breaks.empty() ? "" : ", ") + std::string(property_id(p));
        std::cout << "  " << adapter.name << std::string(adapter.name.size() < 11 ? 11 - adapter.name.size() : 1, ' ')
                  << adapter.description << (breaks.empty() ? "" : " [breaks: " + breaks + "]") << "\n";
    }
    std::cout << "  (and, with no --adapter, the Python example store " << python_example_path() << ")\n";
    std::cout << "\nproperties:\n";
    for (Property p : all_properties()) {
        const std::string id = property_id(p);
        std::cout << "  " << id << std::string(24 - id.size(), ' ') << property_summary(p) << "\n";
    }
    std::cout << "\nplugins: kvcheck run --adapter path/to/libengine.so (see adapters/examples)\n"
                 "engines in another process: kvcheck run --adapter my_adapter.py, or --adapter exec:'COMMAND'\n"
                 "(docs/protocol.md; the Python SDK is in python/kvcheck_adapter)\n";
    return 0;
}

int command_run(const Args& args) {
    const Options options(args, run_options, "run");
    if (options.help()) {
        std::cout << usage_of("kvcheck run [--adapter NAME|PATH ...] [--property ID ...] [--seed S] [--cases N | --seconds T]\n"
                              "                   [--report FORMAT] [--out FILE] [--also-report FORMAT=FILE ...]",
                              "Runs every (or each chosen) property against each adapter, in child processes, and\n"
                              "reports per property: pass, fail (up to --failures distinct failures, each with its shrunk\n"
                              "trace and the command that replays it), blocked (fewer than 90 % of the traces could be\n"
                              "judged: the others ended in engine errors, grouped by message under engine-error) or\n"
                              "skipped. With no --adapter: the reference, every mutant and the Python example\n"
                              "store, a self-check of kvcheck itself, which exits 0 when the reference and the example\n"
                              "pass and every mutant is caught.",
                              run_options);
        return 0;
    }
    if (!options.positional().empty()) throw UsageError("unexpected argument '" + printable(options.positional().front(), 80) + "'");
    ConformanceOptions conformance = conformance_options(options);
    const ReportFormat format = parse_report_format(options.get("report", "table"));
    const bool bundled = !options.has("adapter");
    const bool threads = options.has("threads");
    if (threads) {
        if (!options.has("lanes")) conformance.workload.lanes = 3;
        if (conformance.workload.lanes < 2) throw UsageError("--threads needs at least 2 --lanes (clients), not 1");
        const std::vector<Property> judged = thread_properties();
        for (const Property p : conformance.properties) {
            if (std::find(judged.begin(), judged.end(), p) == judged.end()) {
                std::string names;
                for (const Property q : judged) names += (names.empty() ? "" : ", ") + std::string(property_id(q));
                throw UsageError("--threads judges " + names + " only, not " + property_id(p) +
                                 " (docs/semantics.md#the-thread-level)");
            }
        }
    }
    std::vector<Adapter> adapters;
    if (bundled) {
        adapters = bundled_adapters();
        // The concurrency mutants are the self-check's with --lanes, the
        // others without (kvcheck/adapter.h, Adapter::lanes).
        // With --threads: the references that can run at the thread level
        // and the thread mutants (Adapter::threads), which nothing else finds.
        const bool lanes = conformance.workload.lanes > 1;
        adapters.erase(std::remove_if(adapters.begin(), adapters.end(),
                                      [&](const Adapter& a) {
                                          if (threads) {
                                              if (a.threads) return false;
                                              const Capabilities declared = a.make()->capabilities();
                                              return !a.breaks.empty() || !declared.thread_safe || (!declared.paged && store_not_judged_by_threads(declared));
                                          }
                                          return a.threads || (!a.breaks.empty() && (a.lanes > 1) != lanes);
                                      }),
                       adapters.end());
        // The Python example store joins the self-check when it can run
        // here (scripts/bootstrap installs Debian's python3-torch); not
        // the thread level's (the C++ references and thread mutants only).
        try {
            if (!threads) adapters.push_back(python_example(adapter_options(options)));
        } catch (const UsageError& error) {
            std::cerr << "kvcheck run: the Python example store is left out: " << printable(error.what(), 300) << "\n";
        }
    } else {
        for (const std::string& name : options.all("adapter")) adapters.push_back(load_adapter(name, adapter_options(options)));
    }
    // A bundled engine is kvcheck's own: one made here says which
    // properties it can be judged on (no job starts for the others). A
    // plugin's engines are made in the jobs only (plugin_probe.h).
    for (Adapter& adapter : adapters) {
        if (adapter.source == "bundled") learn_declared(adapter);
    }
    // Where the results go is checked before anything runs.
    const TraceDir traces(conformance.trace_dir);
    conformance.trace_name_suffix = traces.name_suffix();
    OutputFile report(options.get("out", ""));
    std::vector<std::pair<ReportFormat, std::unique_ptr<OutputFile>>> also_reports;
    for (const std::string& spec : options.all("also-report")) {
        const std::size_t equals = spec.find('=');
        if (equals == std::string::npos || equals + 1 == spec.size()) {
            throw UsageError("--also-report takes FORMAT=FILE (e.g. junit=report.xml), not '" + printable(spec, 80) + "'");
        }
        also_reports.emplace_back(parse_report_format(spec.substr(0, equals)), std::make_unique<OutputFile>(spec.substr(equals + 1), "--also-report"));
    }
    const bool any_html = format == ReportFormat::html ||
                          std::any_of(also_reports.begin(), also_reports.end(),
                                      [](const auto& also) { return also.first == ReportFormat::html; });
    std::cerr << "kvcheck run: seed " << conformance.seed << ", "
              << (conformance.seconds > 0 ? seconds_text(conformance.seconds) + " s" : std::to_string(conformance.cases) + " traces")
              << " per property, " << adapters.size() << " adapter(s), " << conformance.jobs << " job(s); traces of at most "
              << conformance.workload.trace_ops_max << " operations; " << describe_scope(conformance.workload.scope) << "; "
              << (conformance.workload.lanes > 1 ? std::to_string(conformance.workload.lanes) + " lanes; " : "")
              << (threads ? "the thread level (a thread per lane); " : "") << "domain: " << domains_searched(adapters, conformance.model) << "; " << limits_text(conformance.limits) << "\n";
    if (conformance.isolate) install_interrupt_handlers();
    const auto started = std::chrono::steady_clock::now();
    ConformanceRun run;
    {
        const EngineStdoutToStderr guard(!conformance.isolate);
        run = threads ? check_threads(adapters, conformance) : check_adapters(adapters, conformance);
    }
    // The HTML report draws each failure step by step: its trace replayed
    // once more per step (report_html.h). A Ctrl-C while it draws cuts the
    // drawing short and marks the report incomplete, as one during the run.
    Pictures pictures;
    if (any_html) pictures = picture_failures(run.adapters, conformance);
    if (run.interrupted_by == 0 && conformance.isolate) run.interrupted_by = interrupted_by();
    const auto rendered = [&](ReportFormat f) {
        return f == ReportFormat::html ? render_html(run.adapters, conformance.seed, run.interrupted_by, pictures)
                                       : render_report(run.adapters, f, conformance.seed, run.interrupted_by);
    };
    bool written = report.write(rendered(format));
    for (const auto& [also_format, file] : also_reports) written = file->write(rendered(also_format)) && written;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::size_t distinct = 0, operations = 0;
    for (const AdapterResult& result : run.adapters) {
        distinct += result.traces;
        for (const std::uint32_t count : result.coverage.ops_run) operations += count;
        operations += result.operations_begun;
    }
    // Operations of the distinct traces only: the shrinker's replays and
    // the engine processes' start are in the time, not in the count.
    std::cerr << "kvcheck run: " << distinct << " distinct traces run (each property searches its own), " << operations
              << " operations checked, in " << seconds_text(elapsed) << " s\n";
    // State shared across engine instances, said where a run's end is
    // read first: each finding's reproducer needs both of its parts.
    for (const AdapterResult& result : run.adapters) {
        for (const PropertyResult& row : result.properties) {
            if (row.id != shared_state_id || row.verdict != "fail") continue;
            std::cerr << "kvcheck run: " << printable(result.adapter.name, 80)
                      << ": engines share state across instances (the shared-state row: " << row.failures.size()
                      << (row.failures.size() == 1 ? " finding" : " findings") << ", each replayed with its prefix: "
                      << row.reproduce << ")\n";
        }
    }
    if (options.has("stats")) std::cerr << render_stats(run.adapters);
    if (run.interrupted_by != 0) {
        std::cerr << "kvcheck: interrupted by " << signal_name(run.interrupted_by)
                  << ": the report holds the results so far, marked incomplete\n";
        return 128 + run.interrupted_by;
    }
    if (!written) return 2;
    if (bundled) {
        const bool ok = bundled_as_expected(run.adapters, std::cerr);
        std::cerr << (ok ? "as expected: the reference passes and every mutant is caught\n"
                         : "NOT as expected: see above\n");
        return ok ? 0 : 1;
    }
    const bool all_pass = std::all_of(run.adapters.begin(), run.adapters.end(), [](const AdapterResult& r) { return r.all_pass(); });
    return all_pass ? 0 : 1;
}

namespace {

// Lines of the engine's own words replay and shrink show with a failure.
constexpr std::size_t replay_engine_lines_max = 20;

int replay_or_shrink(const Args& args, bool shrink_it) {
    const std::string command = shrink_it ? "shrink" : "replay";
    const Options options(args, shrink_it ? shrink_options : replay_options, command);
    if (options.help()) {
        std::cout << usage_of("kvcheck " + command + " TRACE --adapter NAME|PATH [--property ID ...]",
                              shrink_it ? "Shrinks a failing trace file to a short trace that fails the same way. The trace goes to\n"
                                          "--out or standard output; the report to standard output or, when the trace is\n"
                                          "there, standard error."
                                        : "Runs the trace in the file against the adapter and reports the first violation (or a\n"
                                          "crash or hang of the engine), pinned to the step it happened. A thread-level trace (its\n"
                                          "first line 'threads lanes=N schedule=...', from kvcheck run --threads) runs on a thread per\n"
                                          "lane under that schedule, 3 times on fresh engines: flaky when the runs differ.",
                              shrink_it ? shrink_options : replay_options);
        return 0;
    }
    if (options.positional().size() != 1) throw UsageError(command + " takes one trace file (see kvcheck " + command + " --help)");
    if (!options.has("adapter")) throw UsageError(command + " needs --adapter");
    const ConformanceOptions conformance = conformance_options(options);
    const std::string path = options.positional().front();
    const std::string text = read_trace_text(path);
    if (const std::optional<ThreadTrace> threads = read_thread_trace(path, text)) {
        // A thread-level finding: replayed on a thread per lane under its
        // schedule, on fresh engines, --replays times (default 3).
        if (shrink_it) throw UsageError(path + " is a thread-level trace: kvcheck run --threads shrinks its findings, kvcheck shrink does not");
        if (options.has("prefix")) throw UsageError("--prefix does not apply to a thread-level trace (" + printable(path, 200) + ")");
        const Adapter adapter = load_adapter(options.get("adapter", ""), adapter_options(options));
        if (conformance.isolate) install_interrupt_handlers();
        const EngineStdoutToStderr guard(!conformance.isolate);
        return replay_threads(adapter, *threads, replay_command(adapter, path), property_set(conformance.properties), conformance,
                              std::cout);
    }
    const Trace trace = parse_trace_file(path, text);
    std::optional<Trace> prefix;
    if (options.has("prefix")) prefix = read_trace(options.get("prefix", ""));
    const Adapter adapter = load_adapter(options.get("adapter", ""), adapter_options(options));
    std::optional<OutputFile> shrunk_out;
    if (shrink_it) shrunk_out.emplace(options.get("out", ""));
    if (conformance.isolate) install_interrupt_handlers();
    ReplayResult result;
    {
        const EngineStdoutToStderr guard(!conformance.isolate);
        result = replay_trace(adapter, trace, property_set(conformance.properties), shrink_it, conformance, prefix);
    }
    if (result.interrupted_by != 0) {
        std::cerr << "kvcheck " << command << ": interrupted by " << signal_name(result.interrupted_by) << "\n";
        return 128 + result.interrupted_by;
    }
    std::string reproduce = replay_command(adapter, path);
    if (prefix) reproduce += " --prefix " + shell_quoted(options.get("prefix", ""));
    if (!result.failed) {
        if (trace.empty()) {
            std::cerr << "kvcheck: warning: " << path << " holds no operations: nothing was checked\n";
        } else if (result.steps_run > 0 && result.ops_skipped == result.steps_run) {
            std::cerr << "kvcheck: warning: every one of the " << result.steps_run
                      << " operations was skipped (each names a handle no earlier operation made, or cannot apply): "
                         "nothing was checked\n";
        }
        std::cout << "kvcheck: " << trace.size() << " operations" << (prefix ? " (after the prefix's " + std::to_string(prefix->size()) + ")" : "")
                  << ", every property holds on " << printable(adapter.name, 80) << "\n";
        return 0;
    }
    const std::string report = format_failure(printable_failure(result.failure), result.trace, reproduce);
    // The engine's own words, escaped as the report of a run escapes them.
    std::cerr << engine_output_text(result.engine_output, result.output, replay_engine_lines_max);
    if (!shrink_it) {
        std::cout << report;
        return 1;
    }
    // The trace alone where it goes, so that the file replays; the report
    // elsewhere.
    const bool to_stdout = shrunk_out->path().empty();
    (to_stdout ? std::cerr : std::cout) << report << std::flush;
    const std::string header = "# kvcheck shrink: " + result.failure.property + " on " + printable(adapter.name, 80) + ": " +
                               printable(result.failure.message, 300) + "\n# shrunk from " + std::to_string(trace.size()) +
                               " operations (" + printable(path, 200) + ")\n";
    return shrunk_out->write(header + format_trace(result.trace)) ? 1 : 2;
}

}  // namespace

int command_replay(const Args& args) { return replay_or_shrink(args, false); }
int command_shrink(const Args& args) { return replay_or_shrink(args, true); }

}  // namespace kvcheck::cli
