#include "command_line.h"

#include "kvcheck/limits.h"
#include "kvcheck/plugin.h"
#include "output.h"
#include "report.h"
#include "wire.h"

#include <boost/pfr.hpp>

#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <type_traits>
#include <variant>

namespace kvcheck::cli {
namespace {

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

}  // namespace

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

const std::vector<OptionSpec> list_options = {
    {"adapter", true, "list only the properties this adapter can be judged on (bundled name, plugin path, Python\n"
                      "                             script or exec:COMMAND: its handshake says its cache families)"},
    {"python", true, "the interpreter of a .py adapter (as kvcheck run --python)"},
};

namespace {

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

}  // namespace

ConformanceOptions conformance_options_alone(const Options& options) {
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
    const std::uint64_t memory_mb = options.number("memory-mb", 4096, 1, memory_mb_max);
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

void refuse_memory_below_own_size(const ConformanceOptions& conformance) {
    const std::uint64_t memory_mb = static_cast<std::uint64_t>(conformance.limits.memory_bytes >> 20);
    const std::uint64_t memory_mb_min = own_resident_mb() + memory_mb_headroom;
    if (memory_mb < memory_mb_min) {
        throw UsageError("--memory-mb " + std::to_string(memory_mb) + " is too small: an engine process starts as a copy of "
                         "kvcheck, which holds " + std::to_string(memory_mb_min - memory_mb_headroom) +
                         " MiB; give at least " + std::to_string(memory_mb_min));
    }
}

ConformanceOptions conformance_options(const Options& options) {
    ConformanceOptions conformance = conformance_options_alone(options);
    refuse_memory_below_own_size(conformance);
    return conformance;
}

namespace {

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

}  // namespace

namespace {

// A command's options, or nullopt after its usage is printed for --help.
std::optional<Options> options_or_usage(const Args& args, const std::vector<OptionSpec>& specs, const std::string& command,
                                        const std::string& synopsis, const std::string& about) {
    Options options(args, specs, command);
    if (!options.help()) return options;
    std::cout << usage_of(synopsis, about, specs);
    return std::nullopt;
}

void refuse_arguments(const Options& options) {
    if (!options.positional().empty()) throw UsageError("unexpected argument '" + printable(options.positional().front(), 80) + "'");
}

}  // namespace

std::optional<Options> list_command_line(const Args& args) {
    std::optional<Options> options =
        options_or_usage(args, list_options, "list", "kvcheck list [--adapter NAME|PATH [--python PATH]]",
                         "Lists the bundled adapters and the properties; with --adapter, the properties that\n"
                         "adapter can be judged on, and how many are left out and why.");
    if (options) refuse_arguments(*options);
    return options;
}

std::optional<Options> run_command_line(const Args& args) {
    std::optional<Options> options = options_or_usage(
        args, run_options, "run",
        "kvcheck run [--adapter NAME|PATH ...] [--property ID ...] [--seed S] [--cases N | --seconds T]\n"
        "                   [--report FORMAT] [--out FILE] [--also-report FORMAT=FILE ...]",
        "Runs every (or each chosen) property against each adapter, in child processes, and\n"
        "reports per property: pass, fail (up to --failures distinct failures, each with its shrunk\n"
        "trace and the command that replays it), blocked (fewer than 90 % of the traces could be\n"
        "judged: the others ended in engine errors, grouped by message under engine-error) or\n"
        "skipped. With no --adapter: the reference, every mutant and the Python example\n"
        "store, a self-check of kvcheck itself, which exits 0 when the reference and the example\n"
        "pass and every mutant is caught.");
    if (options) refuse_arguments(*options);
    return options;
}

std::optional<Options> replay_command_line(const Args& args, bool shrink_it) {
    const std::string command = shrink_it ? "shrink" : "replay";
    std::optional<Options> options = options_or_usage(
        args, shrink_it ? shrink_options : replay_options, command,
        "kvcheck " + command + " TRACE --adapter NAME|PATH [--property ID ...]",
        shrink_it ? "Shrinks a failing trace file to a short trace that fails the same way. The trace goes to\n"
                    "--out or standard output; the report to standard output or, when the trace is\n"
                    "there, standard error."
                  : "Runs the trace in the file against the adapter and reports the first violation (or a\n"
                    "crash or hang of the engine), pinned to the step it happened. A thread-level trace (its\n"
                    "first line 'threads lanes=N schedule=...', from kvcheck run --threads) runs on a thread per\n"
                    "lane under that schedule, 3 times on fresh engines: flaky when the runs differ.");
    if (!options) return options;
    if (options->positional().size() != 1) throw UsageError(command + " takes one trace file (see kvcheck " + command + " --help)");
    if (!options->has("adapter")) throw UsageError(command + " needs --adapter");
    return options;
}

ReplayInput replay_input(const Options& options, bool shrink_it) {
    ReplayInput input;
    input.path = options.positional().front();
    const std::string text = read_trace_text(input.path);
    input.threads = read_thread_trace(input.path, text);
    if (input.threads) {
        if (shrink_it) throw UsageError(input.path + " is a thread-level trace: kvcheck run --threads shrinks its findings, kvcheck shrink does not");
        if (options.has("prefix")) throw UsageError("--prefix does not apply to a thread-level trace (" + printable(input.path, 200) + ")");
        return input;
    }
    input.trace = parse_trace_file(input.path, text);
    if (options.has("prefix")) input.prefix = read_trace(options.get("prefix", ""));
    return input;
}

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
              << ", dump format " << dump_format_version_said << ", adapter protocol " << process::protocol_version
              << "\n";
    return 0;
}

bool is_command(const std::string& name) {
    for (const char* command : {"list", "run", "replay", "shrink", "check-dump", "help", "--help", "-h", "--version", "version"}) {
        if (name == command) return true;
    }
    return false;
}

int refuse_unknown_command(const std::string& name) {
    std::cerr << "kvcheck: unknown command '" << printable(name, 80) << "' (try: kvcheck --help)\n";
    return 2;
}

int command_status(const std::function<int()>& command) {
    try {
        const int status = command();
        return standard_output_written() || status > 2 ? status : 2;
    } catch (const UsageError& error) {
        std::cerr << "kvcheck: " << error.what() << "\n";
        return 2;
    } catch (const std::exception& error) {
        // What kvcheck itself could not do (a pipe, a fork, a directory):
        // said as an error, not an abort.
        std::cerr << "kvcheck: error: " << printable(error.what(), 2000) << "\n";
        return 2;
    }
}

std::optional<int> answer_without_engines(const Args& args) {
    // As kvcheck-core's main: no arguments, its help; a help command, the
    // same as a command.
    if (args.empty()) return command_help(args);
    const std::string& command = args.front();
    if (!is_command(command)) return refuse_unknown_command(command);
    if (command == "help" || command == "--help" || command == "-h") return command_status([&] { return command_help(args); });
    const Args rest(args.begin() + 1, args.end());
    bool engines_needed = false;
    const int status = command_status([&] {
        std::optional<Options> options;
        if (command == "list") {
            options = list_command_line(rest);
        } else if (command == "run") {
            options = run_command_line(rest);
        } else if (command == "replay" || command == "shrink") {
            options = replay_command_line(rest, command == "shrink");
        } else if (command == "--version" || command == "version") {
            return command_version(rest);
        } else {
            engines_needed = true;  // check-dump: kvcheck-core's (it reads dumps with libtorch)
            return 0;
        }
        if (!options) return 0;  // the command's --help, printed
        if (command != "list") conformance_options_alone(*options);
        if (command == "replay" || command == "shrink") replay_input(*options, command == "shrink");
        engines_needed = true;
        return 0;
    });
    if (engines_needed && status == 0) return std::nullopt;
    return status;
}

}  // namespace kvcheck::cli
