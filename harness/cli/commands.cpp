#include "commands.h"

#include "adapters.h"
#include "conformance.h"
#include "report.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

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
    std::uint64_t number(const std::string& name, std::uint64_t fallback) const {
        if (!has(name)) return fallback;
        const std::string text = values_.at(name).back();
        try {
            std::size_t used = 0;
            const unsigned long long value = std::stoull(text, &used);
            if (used != text.size() || text[0] == '-') throw std::invalid_argument(text);
            return value;
        } catch (const std::exception&) {
            throw UsageError("--" + name + " takes a whole number, not '" + text + "'");
        }
    }
    double real(const std::string& name, double fallback) const {
        if (!has(name)) return fallback;
        const std::string text = values_.at(name).back();
        try {
            std::size_t used = 0;
            const double value = std::stod(text, &used);
            if (used != text.size() || value < 0) throw std::invalid_argument(text);
            return value;
        } catch (const std::exception&) {
            throw UsageError("--" + name + " takes a number of seconds, not '" + text + "'");
        }
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
    out << "  --help                     this text\n";
    return out.str();
}

const std::vector<OptionSpec> isolation_options = {
    {"python", true, "the interpreter of a Python script adapter (default $KVCHECK_PYTHON, else /usr/bin/python3)"},
    {"timeout", true, "seconds a single trace may run before the engine counts as hung (default 30)"},
    {"memory-mb", true, "resident memory limit of the engine's process and of those it starts, MiB (default 4096)"},
    {"no-isolate", false, "run the engine in kvcheck's own process (for debuggers; a crash ends kvcheck)"},
};

const std::vector<OptionSpec> run_options = [] {
    std::vector<OptionSpec> specs = {
        {"adapter", true, "bundled name (see kvcheck list), plugin path, Python script (x.py ARGS) or exec:COMMAND;\n"
                          "                             repeatable. Default: all bundled adapters"},
        {"property", true, "a property id (see kvcheck list); repeatable. Default: all"},
        {"seed", true, "the run's seed (default 20261202); trace i of the p-th property uses seed + p*2^32 + i"},
        {"cases", true, "traces per property (default 200)"},
        {"scope", true, "sizes of the caches traces draw: small, default or large (for nightly runs)"},
        {"seconds", true, "time per property instead of a case count"},
        {"report", true, "table (default), json, junit or markdown"},
        {"out", true, "write the report to this file instead of standard output"},
        {"trace-dir", true, "where failing traces are written (default kvcheck-traces)"},
        {"jobs", true, "engine processes at once (default: the number of cores)"},
        {"quiet", false, "no progress lines on standard error"},
        {"stats", false, "also print how often each shape of interest occurred in the traces run"},
    };
    specs.insert(specs.end(), isolation_options.begin(), isolation_options.end());
    return specs;
}();

const std::vector<OptionSpec> replay_options = [] {
    std::vector<OptionSpec> specs = {
        {"adapter", true, "bundled name, plugin path, Python script or exec:COMMAND (required)"},
        {"property", true, "check only these properties; repeatable. Default: all"},
    };
    specs.insert(specs.end(), isolation_options.begin(), isolation_options.end());
    return specs;
}();

const std::vector<OptionSpec> shrink_options = [] {
    std::vector<OptionSpec> specs = replay_options;
    specs.push_back({"out", true, "write the shrunk trace to this file (default: standard output)"});
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

ConformanceOptions conformance_options(const Options& options) {
    ConformanceOptions conformance;
    conformance.seed = options.number("seed", conformance.seed);
    conformance.cases = options.number("cases", conformance.cases);
    conformance.seconds = options.real("seconds", 0);
    conformance.properties = chosen_properties(options);
    conformance.limits.silence_seconds = options.real("timeout", conformance.limits.silence_seconds);
    conformance.limits.memory_bytes = static_cast<std::int64_t>(options.number("memory-mb", 4096)) << 20;
    conformance.isolate = !options.has("no-isolate");
    conformance.trace_dir = options.get("trace-dir", conformance.trace_dir);
    conformance.progress = !options.has("quiet");
    conformance.jobs = options.number("jobs", std::max(1u, std::thread::hardware_concurrency()));
    try {
        conformance.workload.scope = scope_named(options.get("scope", "default"));
    } catch (const std::invalid_argument& error) {
        throw UsageError(std::string("--scope: ") + error.what());
    }
    if (conformance.cases == 0 && conformance.seconds == 0) throw UsageError("--cases must be at least 1");
    if (conformance.jobs == 0) throw UsageError("--jobs must be at least 1");
    return conformance;
}

AdapterOptions adapter_options(const Options& options) {
    AdapterOptions adapter;
    adapter.python = options.get("python", "");
    return adapter;
}

void write_output(const std::string& text, const std::string& path) {
    if (path.empty()) {
        std::cout << text;
        return;
    }
    std::ofstream out(path);
    out << text;
    if (!out) throw UsageError("cannot write " + path);
    std::cerr << "report written to " << path << "\n";
}

PropertySet property_set(const std::vector<Property>& properties) {
    if (properties.empty()) return PropertySet::all();
    PropertySet set = PropertySet::none();
    for (Property p : properties) set.add(p);
    return set;
}

Trace read_trace(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw UsageError("cannot read trace file " + path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
        return parse_trace(text);
    } catch (const TraceParseError& error) {
        throw UsageError(path + ": " + error.what());
    }
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
                 "\nexit codes: 0 all properties hold, 1 a property fails, 2 usage or adapter load error.\n"
                 "kvcheck <command> --help describes each command's options.\n";
    return 0;
}

int command_list(const Args& args) {
    const Options options(args, {}, "list");
    if (options.help()) {
        std::cout << usage_of("kvcheck list", "Lists the bundled adapters and the properties.", {});
        return 0;
    }
    std::cout << "adapters (bundled):\n";
    for (const Adapter& adapter : bundled_adapters()) {
        std::string breaks;
        for (const Property p : adapter.breaks) breaks += (breaks.empty() ? "" : ", ") + std::string(property_id(p));
        std::cout << "  " << adapter.name << std::string(adapter.name.size() < 11 ? 11 - adapter.name.size() : 1, ' ')
                  << adapter.description << (breaks.empty() ? "" : " [breaks: " + breaks + "]") << "\n";
    }
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
                              "                   [--report FORMAT] [--out FILE]",
                              "Runs every (or each chosen) property against each adapter, in child processes, and\n"
                              "reports per property: pass, fail (with the shrunk trace and the command that replays\n"
                              "it) or skipped. With no --adapter: the reference and every mutant, a self-check of\n"
                              "kvcheck itself, which exits 0 when the reference passes and every mutant is caught.",
                              run_options);
        return 0;
    }
    if (!options.positional().empty()) throw UsageError("unexpected argument '" + options.positional().front() + "'");
    const ConformanceOptions conformance = conformance_options(options);
    const ReportFormat format = parse_report_format(options.get("report", "table"));
    const bool bundled = !options.has("adapter");
    std::vector<Adapter> adapters;
    if (bundled) {
        adapters = bundled_adapters();
    } else {
        for (const std::string& name : options.all("adapter")) adapters.push_back(load_adapter(name, adapter_options(options)));
    }
    std::cerr << "kvcheck run: seed " << conformance.seed << ", "
              << (conformance.seconds > 0 ? std::to_string(conformance.seconds) + " s" : std::to_string(conformance.cases) + " traces")
              << " per property, " << adapters.size() << " adapter(s), " << conformance.jobs << " job(s); traces of at most "
              << conformance.workload.trace_ops_max << " operations; " << describe_scope(conformance.workload.scope) << "\n";
    const std::vector<AdapterResult> results = check_adapters(adapters, conformance);
    write_output(render_report(results, format, conformance.seed), options.get("out", ""));
    std::size_t traces = 0;
    for (const AdapterResult& result : results) traces += result.traces;
    std::cerr << "kvcheck run: " << traces << " distinct traces run (each property searches its own)\n";
    if (options.has("stats")) std::cerr << render_stats(results);
    if (bundled) {
        const bool ok = bundled_as_expected(results, std::cerr);
        std::cerr << (ok ? "as expected: the reference passes and every mutant is caught\n"
                         : "NOT as expected: see above\n");
        return ok ? 0 : 1;
    }
    const bool all_pass = std::all_of(results.begin(), results.end(), [](const AdapterResult& r) { return r.all_pass(); });
    return all_pass ? 0 : 1;
}

namespace {

int replay_or_shrink(const Args& args, bool shrink_it) {
    const std::string command = shrink_it ? "shrink" : "replay";
    const Options options(args, shrink_it ? shrink_options : replay_options, command);
    if (options.help()) {
        std::cout << usage_of("kvcheck " + command + " TRACE --adapter NAME|PATH [--property ID ...]",
                              shrink_it ? "Shrinks a failing trace file to a short trace that fails the same way."
                                        : "Runs the trace in the file against the adapter, every property checked after every\n"
                                          "step, and reports the first violation (or a crash or hang of the engine).",
                              shrink_it ? shrink_options : replay_options);
        return 0;
    }
    if (options.positional().size() != 1) throw UsageError(command + " takes one trace file (see kvcheck " + command + " --help)");
    if (!options.has("adapter")) throw UsageError(command + " needs --adapter");
    const Adapter adapter = load_adapter(options.get("adapter", ""), adapter_options(options));
    const Trace trace = read_trace(options.positional().front());
    const ConformanceOptions conformance = conformance_options(options);
    const ReplayResult result = replay_trace(adapter, trace, property_set(conformance.properties), shrink_it, conformance);
    const std::string reproduce = replay_command(adapter, options.positional().front());
    if (!result.failed) {
        std::cout << "kvcheck: " << trace.size() << " operations, every property holds on " << adapter.name << "\n";
        return 0;
    }
    std::cout << format_failure(result.failure, result.trace, reproduce);
    if (!result.output.empty()) std::cout << "the engine's output ended with:\n" << result.output << "\n";
    if (shrink_it) write_output(format_trace(result.trace), options.get("out", ""));
    return 1;
}

}  // namespace

int command_replay(const Args& args) { return replay_or_shrink(args, false); }
int command_shrink(const Args& args) { return replay_or_shrink(args, true); }

}  // namespace kvcheck::cli
