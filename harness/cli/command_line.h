// The kvcheck command line up to the engines: each command's options, its
// --help, and every check of their values that needs no engine. The
// kvcheck executable (adapters/kvcheck_front.cpp) links this and not
// libtorch: it answers help and usage errors itself, in a few milliseconds,
// and runs kvcheck-core (the same directory) for everything else, which
// makes the same checks again, in the same order, before it loads an
// engine. A start of kvcheck-core costs 0.4 CPU-s (about 1 s under ASan),
// all of it libtorch's load (BENCHMARKS.md, "kvcheck starts without
// libtorch").
//
//   const std::optional<Options> options = run_command_line(args);
//   if (!options) return 0;  // run --help, printed
//   ConformanceOptions conformance = conformance_options(*options);
#pragma once

#include "adapters.h"
#include "commands.h"
#include "conformance.h"
#include "text.h"
#include "kvcheck/threads.h"
#include "kvcheck/trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck::cli {

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

// The dump format kvcheck reads and writes, as --version says it:
// kv::dump_format_version (src/kv/store.h, behind libtorch's headers), which
// kvcheck-core's commands.cpp checks it equals when it compiles.
inline constexpr std::int64_t dump_format_version_said = 1;

extern const std::vector<OptionSpec> list_options;
extern const std::vector<OptionSpec> run_options;
extern const std::vector<OptionSpec> replay_options;
extern const std::vector<OptionSpec> shrink_options;

// Each command's options, parsed and checked as far as they can be without
// an engine (unknown options, missing values, stray arguments); nullopt
// when --help was given (its usage is then printed on standard output).
std::optional<Options> list_command_line(const Args& args);
std::optional<Options> run_command_line(const Args& args);
std::optional<Options> replay_command_line(const Args& args, bool shrink_it);

// The options of a run, replay or shrink, each value checked (UsageError
// naming the option): conformance_options_alone. A --memory-mb below what
// the process that checks it holds (an engine process starts as its copy)
// is refused by refuse_memory_below_own_size: that depends on the process,
// so kvcheck-core checks it last (after a replay's trace files), and the
// torch-free front leaves it to kvcheck-core. conformance_options: both.
ConformanceOptions conformance_options_alone(const Options& options);
void refuse_memory_below_own_size(const ConformanceOptions& conformance);
ConformanceOptions conformance_options(const Options& options);

// What a replay or shrink runs, read and checked before any engine: the
// trace file (a regular file, within its size, parsed, no cache beyond
// kvcheck's limits) and its --prefix; a thread-level trace is replayed,
// never shrunk, and takes no prefix. Each fault is a UsageError naming the
// file. kvcheck-core refuses a --memory-mb below its own size after these.
struct ReplayInput {
    std::string path;
    std::optional<ThreadTrace> threads;  // a thread-level trace (kvcheck/threads.h), else
    Trace trace;                         // the trace's operations
    std::optional<Trace> prefix;         // --prefix's
};
ReplayInput replay_input(const Options& options, bool shrink_it);

// `kvcheck ARGS` answered without an engine: the exit status of a help or
// a usage error (said on standard error), nullopt when the command line
// passes every check here and the command needs kvcheck-core.
std::optional<int> answer_without_engines(const Args& args);

// Whether NAME is a kvcheck command (or help/version), and the usage error
// of one that is not (exit 2).
bool is_command(const std::string& name);
int refuse_unknown_command(const std::string& name);

// A command's exit status as kvcheck gives it: a UsageError said as
// "kvcheck: MESSAGE" and any other exception as "kvcheck: error: ...", both
// 2; 2 as well when what it printed on standard output did not go through
// (a report on a full disk is lost), unless interrupted (128 + N says
// more).
int command_status(const std::function<int()>& command);

}  // namespace kvcheck::cli
