#include "commands.h"

#include "adapters.h"
#include "command_line.h"
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

// kvcheck --version (command_line.cpp) says the dump format without
// libtorch's headers: it must be the one kvcheck reads and writes.
static_assert(kv::dump_format_version == dump_format_version_said, "command_line.h: dump_format_version_said");

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
    const std::optional<Options> parsed = list_command_line(args);
    if (!parsed) return 0;  // list --help
    const Options& options = *parsed;
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
    const std::optional<Options> parsed = run_command_line(args);
    if (!parsed) return 0;  // run --help
    const Options& options = *parsed;
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
    const std::optional<Options> parsed = replay_command_line(args, shrink_it);
    if (!parsed) return 0;  // its --help
    const Options& options = *parsed;
    const ConformanceOptions conformance = conformance_options_alone(options);
    const ReplayInput input = replay_input(options, shrink_it);
    refuse_memory_below_own_size(conformance);
    const std::string& path = input.path;
    if (input.threads) {
        // A thread-level finding: replayed on a thread per lane under its
        // schedule, on fresh engines, --replays times (default 3).
        const Adapter adapter = load_adapter(options.get("adapter", ""), adapter_options(options));
        if (conformance.isolate) install_interrupt_handlers();
        const EngineStdoutToStderr guard(!conformance.isolate);
        return replay_threads(adapter, *input.threads, replay_command(adapter, path), property_set(conformance.properties), conformance,
                              std::cout);
    }
    const Trace& trace = input.trace;
    const std::optional<Trace>& prefix = input.prefix;
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
