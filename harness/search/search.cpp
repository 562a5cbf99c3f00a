#include "kvcheck/search.h"

#include <algorithm>
#include <cctype>
#include <chrono>

namespace kvcheck {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

RunResult Runner::run(const Trace& trace, bool every_entry_every_step) const {
    if (before_run) before_run(trace);
    RunOptions run_options = options;
    run_options.every_entry_every_step = options.every_entry_every_step || every_entry_every_step;
    if (!run_options.fresh_engine) run_options.fresh_engine = make;
    if (check) return check(trace, run_options);
    const std::shared_ptr<Engine> engine = make();
    return execute(trace, *engine, run_options);
}

SearchResult search(const Runner& runner, const Budget& budget, const WorkloadOptions& workload) {
    const auto start = std::chrono::steady_clock::now();
    SearchResult result;
    for (;; ++result.cases) {
        const bool spent = budget.seconds > 0 ? seconds_since(start) >= budget.seconds : result.cases >= budget.cases;
        if (spent) break;
        const std::uint64_t seed = trace_seed(budget.seed, budget.stream, budget.first_index + result.cases);
        const Trace trace = trace_for_seed(seed, workload);
        const RunResult run = runner.run(trace);
        result.coverage.add(run.coverage);
        if (!run.failure || (runner.passes_over && runner.passes_over(*run.failure))) continue;
        ++result.cases;
        const double find_seconds = seconds_since(start);
        ShrinkOptions shrinking;
        shrinking.model = workload.capabilities.model;  // what the search drew in, the shrinker keeps to
        Finding finding = shrink_failure(runner, trace, *run.failure, shrinking);
        finding.seed = seed;
        finding.traces_tried = result.cases;
        finding.find_seconds = find_seconds;
        result.finding = std::move(finding);
        break;
    }
    return result;
}

// Failures within this many operations are pinned by one run reading every
// entry after every step, whose cost grows with the square of the length.
constexpr std::size_t pin_every_step_ops_max = 64;

Failure pin_failure(const Runner& runner, const Trace& trace, const Failure& found) {
    const std::size_t length = std::min(found.step + 1, trace.size());
    const auto prefix = [&trace](std::size_t n) { return Trace(trace.begin(), trace.begin() + static_cast<std::ptrdiff_t>(n)); };
    if (length <= pin_every_step_ops_max) {
        const std::optional<Failure> exact = runner.run(prefix(length), true).failure;
        return exact ? *exact : found;
    }
    std::size_t passes = 0;  // the empty prefix passes
    std::size_t fails = length;
    Failure failure = found;
    while (fails - passes > 1) {
        const std::size_t middle = passes + (fails - passes) / 2;
        if (const std::optional<Failure> earlier = runner.run(prefix(middle)).failure) {
            fails = middle;
            failure = *earlier;
        } else {
            passes = middle;
        }
    }
    return failure;
}

Finding shrink_failure(const Runner& runner, const Trace& trace, const Failure& failure, const ShrinkOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    ShrinkOptions shrinking = options;
    // A trace from elsewhere (a file, fuzz input) shrinks within the model the engine declares.
    if (!shrinking.model.declared && runner.make) shrinking.model = runner.make()->capabilities().model;
    Finding finding;
    finding.found = trace;
    finding.found_failure = failure;
    std::size_t shortest = trace.size();
    const Oracle oracle = [&](const Trace& candidate) -> std::optional<Failure> {
        if (runner.shrink_accepts && !runner.shrink_accepts(candidate)) return std::nullopt;
        std::optional<Failure> found = runner.run(candidate).failure;
        const bool same = found && (options.keeps ? options.keeps(*found) : found->property == failure.property);
        if (same && candidate.size() < shortest) {
            shortest = candidate.size();
            if (runner.on_shorter) runner.on_shorter(shortest);
        }
        return found;
    };
    finding.shrunk = shrink(trace, failure, oracle, shrinking);
    finding.reported = pin_failure(runner, finding.shrunk.trace, finding.shrunk.failure);
    finding.shrink_seconds = seconds_since(start);
    return finding;
}

namespace {

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }
bool hex_digit(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }
bool digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// Where a quoted part of `line` that opens at `open` closes, or npos. A
// single quote opens one only after a non-word character (an apostrophe
// follows a letter: "the adapter's"), and closes before one.
std::size_t quote_end(const std::string& line, std::size_t open) {
    const char quote = line[open];
    if (quote == '\'' && open > 0 && word_char(line[open - 1])) return std::string::npos;
    for (std::size_t at = open + 1; at < line.size(); ++at) {
        if (line[at] == '\\') {
            ++at;
        } else if (line[at] == quote && (quote == '"' || at + 1 == line.size() || !word_char(line[at + 1]))) {
            return at;
        }
    }
    return std::string::npos;
}

// Where the bracket that opens at `open` ('[' or '{') closes on the line,
// nested ones skipped, or npos.
std::size_t bracket_end(const std::string& line, std::size_t open) {
    const char opening = line[open];
    const char closing = opening == '[' ? ']' : '}';
    std::size_t depth = 0;
    for (std::size_t at = open; at < line.size(); ++at) {
        if (line[at] == opening) ++depth;
        if (line[at] == closing && --depth == 0) return at;
    }
    return std::string::npos;
}

// The message's first line: an engine's own words come first (a Python
// adapter's error reply is "Type: message", its traceback after it).
std::string first_line(const std::string& message) {
    const std::size_t end = message.find('\n');
    return end == std::string::npos ? message : message.substr(0, end);
}

}  // namespace

std::string message_shape(const std::string& message) {
    const std::string line = first_line(message);
    std::string shape;
    for (std::size_t at = 0; at < line.size() && shape.size() < message_shape_chars_max;) {
        const char c = line[at];
        const bool starts_word = at == 0 || !word_char(line[at - 1]);
        if ((c == '[' || c == '{') && bracket_end(line, at) != std::string::npos) {
            // A list or a mapping (ids, a tensor's shape, tokens, metadata):
            // what it holds varies with the trace.
            shape += c;
            shape += '_';
            shape += line[bracket_end(line, at)];
            at = bracket_end(line, at) + 1;
        } else if ((c == '"' || c == '\'') && quote_end(line, at) != std::string::npos) {
            shape += c;
            shape += '_';
            shape += c;
            at = quote_end(line, at) + 1;
        } else if (c == '0' && at + 2 < line.size() && (line[at + 1] == 'x' || line[at + 1] == 'X') && hex_digit(line[at + 2]) &&
                   starts_word) {
            shape += "0x_";
            for (at += 2; at < line.size() && hex_digit(line[at]);) ++at;
        } else if (c == '/' && starts_word && (at == 0 || line[at - 1] == ' ' || line[at - 1] == '(' || line[at - 1] == '=')) {
            shape += "<path>";  // a path ends at a space, a colon, a comma, a quote or a bracket
            while (at < line.size() && std::string(" :,'\")]").find(line[at]) == std::string::npos) ++at;
        } else if (digit(c)) {
            // A number, with its sign, decimals and exponent; a list of
            // numbers ([2, 4, 5] or 2x4) is one number, whatever its length.
            shape += 'N';
            while (at < line.size() && (digit(line[at]) || line[at] == '.' || line[at] == 'e' || line[at] == '-' ||
                                        ((line[at] == ',' || line[at] == 'x' || line[at] == ' ') && at + 1 < line.size() &&
                                         (digit(line[at + 1]) || (line[at + 1] == ' ' && at + 2 < line.size() && digit(line[at + 2])))))) {
                ++at;
            }
        } else {
            shape += c;
            ++at;
        }
    }
    return shape;
}

std::string failure_shape(const Failure& failure) { return failure.property + ": " + message_shape(failure.message); }

std::string shell_quoted(const std::string& text) {
    const bool plain = !text.empty() && text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                                "0123456789_./:=@%+,-") == std::string::npos;
    if (plain) return text;
    std::string quoted = "'";
    for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return quoted + "'";
}

std::string replay_command(const Adapter& adapter, const std::string& trace_file, std::optional<Property> property) {
    std::string command = "kvcheck replay " + shell_quoted(trace_file) + " --adapter " + shell_quoted(adapter.reference());
    if (property) command += " --property " + std::string(property_id(*property));
    return command;
}

}  // namespace kvcheck
