#include "report.h"
#include "kvcheck/limits.h"

#include "interrupt.h"
#include "report_html.h"
#include "search_job.h"
#include "text.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace kvcheck::cli {
namespace {

// Lines of an engine's stderr a table or Markdown report shows (JSON and
// JUnit carry the last CapturedOutput::tail_bytes_max bytes).
constexpr std::size_t engine_lines_max = 8;

std::string json_or_null(const std::string& text) { return text.empty() ? "null" : json_string(text); }

// Text that may quote an engine (a message, a fault, output): at most
// failure_message_bytes_max bytes of it in any format (kvcheck/executor.h).
std::string json_engine_text(const std::string& text) { return json_or_null(cut_text(text)); }
std::string xml_engine_text(const std::string& text, bool attribute = false) { return xml_text(cut_text(text), attribute); }

// " (12 traces)" for an engine-error group of several traces.
std::string count_note(const FailureReport& f) {
    return f.count > 1 ? " (" + std::to_string(f.count) + " traces)" : "";
}

std::string seconds_text(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f", seconds);
    return text;
}

bool is_fault(const PropertyResult& result) { return result.verdict == "fail" && !result.fault.empty(); }

std::string cell(const PropertyResult& result) {
    if (is_fault(result)) return "FAULT";
    if (result.verdict == "fail") return "FAIL";
    // A property of the other cache family (search_job.cpp says "n/a: ...").
    if (result.verdict == "skipped") return result.message.rfind("n/a", 0) == 0 ? "n/a" : "skip";
    if (result.verdict == "not-run") return "-";
    if (result.verdict == "blocked") return "blocked";
    return result.not_applied.empty() ? "pass" : "pass*";
}

bool not_applicable(const PropertyResult& result) { return cell(result) == "n/a"; }

}  // namespace

std::string not_applicable_note(const std::vector<PropertyResult>& rows, const std::string& whom) {
    std::size_t family = 0;
    std::size_t capacity = 0;
    std::size_t lanes = 0;
    std::size_t threads = 0;
    std::string threads_why;  // the thread level's reason (kvcheck run --threads), as its rows say it
    for (const PropertyResult& row : rows) {
        if (row.message.find("--lanes") != std::string::npos) {
            ++lanes;
        } else if (row.message.find("the thread level") != std::string::npos) {
            ++threads;
            threads_why = row.message.substr(row.message.rfind("n/a: ", 0) == 0 ? 5 : 0);
        } else {
            (row.message.find("capacity") != std::string::npos ? capacity : family) += 1;
        }
    }
    const std::size_t count = family + capacity + lanes + threads;
    if (count == 0) return "";
    std::string why;
    if (family != 0) why = std::to_string(family) + " of the other cache family (paged or contiguous)";
    if (capacity != 0) why += (why.empty() ? "" : ", ") + std::to_string(capacity) + " judging a capacity, and none is declared";
    if (lanes != 0) why += (why.empty() ? "" : ", ") + std::to_string(lanes) + " judged with --lanes only";
    if (threads != 0) why += (why.empty() ? "" : ", ") + std::to_string(threads) + " at the thread level: " + threads_why;
    return std::to_string(count) + (count == 1 ? " property" : " properties") + " left out, n/a " + whom + ": " + why;
}

namespace {

struct Counts {
    std::size_t pass = 0, fail = 0, fault = 0, skipped = 0, not_run = 0, blocked = 0, properties = 0;
    void add(const PropertyResult& p) {
        ++properties;
        if (is_fault(p)) {
            ++fault;
        } else if (p.verdict == "fail") {
            ++fail;
        } else if (p.verdict == "skipped") {
            ++skipped;
        } else if (p.verdict == "not-run") {
            ++not_run;
        } else if (p.verdict == "blocked") {
            ++blocked;
        } else {
            ++pass;
        }
    }
    std::string json() const {
        return "\"properties\": " + std::to_string(properties) + ", \"pass\": " + std::to_string(pass) +
               ", \"fail\": " + std::to_string(fail) + ", \"fault\": " + std::to_string(fault) +
               ", \"skipped\": " + std::to_string(skipped) + ", \"not_run\": " + std::to_string(not_run) +
               ", \"blocked\": " + std::to_string(blocked) + ", \"all_pass\": " + (all_pass() ? "true" : "false");
    }
    // Every property finished and none failed: a property not run (an
    // interrupted run) or blocked (an engine error cut its search short)
    // was not shown to hold. A skipped one holds vacuously: the adapter
    // does not report what it needs.
    bool all_pass() const { return fail + fault + not_run + blocked == 0; }
};

Counts counts_of(const AdapterResult& result) {
    Counts counts;
    for (const PropertyResult& p : result.properties) counts.add(p);
    return counts;
}

std::string json_output(const std::array<CapturedOutput, 2>& output) {
    if (output[0].bytes == 0 && output[1].bytes == 0) return "null";
    return "{\"stdout\": " + json_string(output[0].tail) + ", \"stdout_bytes\": " + std::to_string(output[0].bytes) +
           ", \"stderr\": " + json_string(output[1].tail) + ", \"stderr_bytes\": " + std::to_string(output[1].bytes) + "}";
}

std::string json_list(const std::vector<std::string>& texts) {
    std::string list;
    for (const std::string& text : texts) list += (list.empty() ? "" : ", ") + json_string(cut_text(text));
    return "[" + list + "]";
}

// How a finding's replays went (docs/semantics.md#reproduction); null when
// it was not verified.
std::string json_reproduction(const Reproduction& r, const std::string& prefix_file) {
    if (r.kind.empty()) return "null";
    std::ostringstream out;
    out << "{\"kind\": " << json_string(r.kind) << ", \"replays\": " << r.replays << ", \"failed\": " << r.failed
        << ", \"prefix\": " << json_or_null(r.prefix) << ", \"prefix_file\": " << json_or_null(prefix_file)
        << ", \"prefix_replays\": " << r.prefix_replays << ", \"prefix_failed\": " << r.prefix_failed << "}";
    return out.str();
}

// A failure's lanes (null for a trace of one lane): the lane of each step,
// the failing step and the conflicting ones, numbered from 1 as the text
// reports number steps.
std::string json_lanes(const FailureReport& f) {
    if (f.lanes.empty()) return "null";
    std::ostringstream out;
    out << "{\"lane_of_step\": [";
    for (std::size_t i = 0; i < f.lanes.size(); ++i) out << (i ? ", " : "") << f.lanes[i];
    out << "], \"failing_step\": " << f.step + 1 << ", \"conflicting_steps\": [";
    for (std::size_t i = 0; i < f.conflicts.size(); ++i) out << (i ? ", " : "") << f.conflicts[i] + 1;
    out << "]}";
    return out.str();
}

std::string json_failure(const FailureReport& f) {
    std::ostringstream out;
    out << "{\"message\": " << json_engine_text(f.message) << ", \"also\": " << json_list(f.also)
        << ", \"fault\": " << json_engine_text(f.fault) << ", \"trace\": " << json_or_null(f.trace)
        << ", \"found_length\": " << f.found_length << ", \"found_after\": " << f.found_after << ", \"seed\": " << f.seed
        << ", \"count\": " << f.count << ", \"found_while_searching\": " << json_engine_text(f.searching)
        << ", \"trace_file\": " << json_or_null(f.trace_file) << ", \"trace_file_error\": " << json_or_null(f.trace_file_error)
        << ", \"reproduce\": " << json_or_null(f.reproduce) << ", \"output\": " << json_engine_text(f.output)
        << ", \"reproduction\": " << json_reproduction(f.reproduction, f.prefix_file) << ", \"lanes\": " << json_lanes(f)
        << ", \"threads\": " << json_or_null(f.threads) << "}";
    return out.str();
}

std::string json_adapter(const AdapterResult& result, std::uint64_t seed) {
    std::ostringstream out;
    out << "    {\"adapter\": " << json_string(result.adapter.name) << ", \"source\": " << json_string(result.adapter.source)
        << ", \"seed\": " << seed << ", \"domain\": " << json_or_null(result.domain) << ", \"summary\": {"
        << counts_of(result).json() << "}, \"traces\": " << result.traces
        << ", \"shapes\": {";
    for (std::size_t i = 0; i < shape_count; ++i) {
        out << (i ? ", " : "") << json_string(shape_id(static_cast<Shape>(i))) << ": " << result.coverage.shapes[i];
    }
    out << "}, \"properties\": [";
    for (std::size_t i = 0; i < result.properties.size(); ++i) {
        const PropertyResult& p = result.properties[i];
        out << (i ? "," : "") << "\n      {\"id\": " << json_string(p.id) << ", \"verdict\": " << json_string(p.verdict)
            << ", \"cases\": " << p.cases << ", \"judged\": " << p.judged << ", \"repeats\": " << p.repeats
            << ", \"seconds\": " << seconds_text(p.seconds)
            << ", \"trace\": " << json_or_null(p.trace) << ", \"found_length\": " << p.found_length
            << ", \"message\": " << json_engine_text(p.message) << ", \"also\": " << json_list(p.also)
            << ", \"fault\": " << json_engine_text(p.fault) << ", \"trace_file\": " << json_or_null(p.trace_file)
            << ", \"trace_file_error\": " << json_or_null(p.trace_file_error)
            << ", \"reproduce\": " << json_or_null(p.reproduce) << ", \"engine_output\": " << json_output(p.engine_output)
            << ", \"output\": " << json_engine_text(p.output) << ", \"not_applied\": " << json_engine_text(p.not_applied)
            << ", \"not_applicable\": " << (not_applicable(p) ? "true" : "false")
            << ", \"failures\": [";
        for (std::size_t f = 0; f < p.failures.size(); ++f) out << (f ? ", " : "") << json_failure(p.failures[f]);
        out << "]}";
    }
    out << "\n    ]}";
    return out.str();
}

std::string render_json(const std::vector<AdapterResult>& results, std::uint64_t seed, int interrupted_by) {
    Counts total;
    for (const AdapterResult& result : results) {
        for (const PropertyResult& p : result.properties) total.add(p);
    }
    std::ostringstream out;
    out << "{\"format\": \"kvcheck-report\", \"format_version\": " << report_format_version
        << ", \"kvcheck_version\": " << json_string(KVCHECK_VERSION) << ",\n \"seed\": " << seed
        << ", \"complete\": " << (interrupted_by == 0 ? "true" : "false")
        << ", \"interrupted_by\": " << (interrupted_by == 0 ? "null" : json_string(signal_name(interrupted_by)))
        << ",\n \"summary\": {\"adapters\": " << results.size() << ", " << total.json() << "},\n \"adapters\": [";
    for (std::size_t i = 0; i < results.size(); ++i) out << (i ? "," : "") << "\n" << json_adapter(results[i], seed);
    out << "\n ]}\n";
    return out.str();
}

// A failing testcase's text: every failure (the first is the message's),
// each with its trace and the command that replays it.
std::string junit_body(const PropertyResult& p) {
    if (p.failures.size() <= 1) return p.trace + (p.reproduce.empty() ? "" : "reproduce: " + p.reproduce);
    std::string body;
    for (std::size_t i = 0; i < p.failures.size(); ++i) {
        const FailureReport& f = p.failures[i];
        body += "failure " + std::to_string(i + 1) + " of " + std::to_string(p.failures.size()) + count_note(f) + ": " +
                printable(f.message, 2000) + "\n" + f.trace + (f.reproduce.empty() ? "" : "reproduce: " + f.reproduce + "\n");
    }
    return body;
}

std::string render_junit(const std::vector<AdapterResult>& results, int interrupted_by) {
    std::ostringstream out;
    out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"kvcheck\">\n";
    for (const AdapterResult& result : results) {
        const Counts counts = counts_of(result);
        double time = 0;
        for (const auto& p : result.properties) time += p.seconds;
        // JUnit has no "not run": those count as skipped, with a message.
        out << "  <testsuite name=\"" << xml_text(result.adapter.name, true) << "\" tests=\"" << result.properties.size()
            << "\" failures=\"" << counts.fail + counts.fault << "\" errors=\"" << counts.blocked
            << "\" skipped=\"" << counts.skipped + counts.not_run
            << "\" time=\"" << seconds_text(time) << "\">\n";
        if (interrupted_by != 0) {
            out << "    <properties><property name=\"kvcheck.complete\" value=\"false\"/><property name=\"kvcheck.interrupted_by\" "
                   "value=\"" << signal_name(interrupted_by) << "\"/></properties>\n";
        }
        for (const auto& p : result.properties) {
            out << "    <testcase classname=\"kvcheck." << xml_text(result.adapter.name, true) << "\" name=\"" << xml_text(p.id, true)
                << "\" time=\"" << seconds_text(p.seconds) << "\">";
            if (p.verdict == "fail") {
                out << "\n      <failure message=\"" << xml_engine_text(p.message, true) << "\" type=\""
                    << (p.fault.empty() ? "property" : "fault") << "\">" << xml_text(junit_body(p)) << "</failure>";
            } else if (p.verdict == "blocked") {
                out << "\n      <error message=\"" << xml_engine_text(p.message, true) << "\" type=\"blocked\"/>";
            } else if (p.verdict == "skipped" || p.verdict == "not-run") {
                out << "\n      <skipped message=\"" << xml_engine_text(p.message, true) << "\"/>";
            }
            if (p.engine_output[0].bytes > 0) out << "\n      <system-out>" << xml_text(p.engine_output[0].tail) << "</system-out>";
            if (p.engine_output[1].bytes > 0) out << "\n      <system-err>" << xml_text(p.engine_output[1].tail) << "</system-err>";
            out << (p.verdict == "pass" && p.engine_output[0].bytes + p.engine_output[1].bytes == 0 ? "" : "\n    ")
                << "</testcase>\n";
        }
        out << "  </testsuite>\n";
    }
    out << "</testsuites>\n";
    return out.str();
}

// Markdown punctuation that would format a name or message, escaped.
std::string markdown_text(const std::string& text) {
    std::string out;
    for (const char c : printable(text, 2000)) {
        if (std::string("\\`*_[]<>|#").find(c) != std::string::npos) out += '\\';
        out += c;
    }
    return out;
}

// A fence longer than any run of backticks in `text`.
std::string fence_for(const std::string& text) {
    std::size_t longest = 0;
    std::size_t run = 0;
    for (const char c : text) {
        run = c == '`' ? run + 1 : 0;
        longest = std::max(longest, run);
    }
    return std::string(std::max<std::size_t>(3, longest + 1), '`');
}

std::string pad(std::string text, std::size_t width) {
    if (text.size() < width) text.append(width - text.size(), ' ');
    return text;
}

// Rows: properties; columns: adapters, each as wide as its name.
// A row n/a for every adapter of the run (a property of the other cache
// family, or of a capacity none declares) is left out of the table.
bool left_out(const std::vector<AdapterResult>& results, std::size_t row) {
    return std::all_of(results.begin(), results.end(),
                       [row](const AdapterResult& r) { return not_applicable(r.properties[row]); });
}

// One line saying how many rows the table leaves out, and why; "" for none.
std::string left_out_note(const std::vector<AdapterResult>& results) {
    std::vector<PropertyResult> rows;
    for (std::size_t row = 0; row < results.front().properties.size(); ++row) {
        if (left_out(results, row)) rows.push_back(results.front().properties[row]);
    }
    const std::string note = not_applicable_note(rows, "for every adapter");
    return note.empty() ? "" : note + " (the JSON report lists them, \"not_applicable\": true)\n";
}

std::string matrix(const std::vector<AdapterResult>& results, bool markdown) {
    std::ostringstream out;
    std::size_t first = std::string("property").size();
    for (const auto& p : results.front().properties) first = std::max(first, p.id.size());
    first += 2;
    std::vector<std::size_t> widths;
    for (const auto& r : results) widths.push_back(std::max<std::size_t>(printable(r.adapter.name, 40).size(), 5) + 2);
    if (markdown) {
        out << "| property |";
        for (const auto& r : results) out << " " << markdown_text(printable(r.adapter.name, 40)) << " |";
        out << "\n|---|";
        for (std::size_t i = 0; i < results.size(); ++i) out << "---|";
        out << "\n";
    } else {
        out << pad("property", first);
        for (std::size_t i = 0; i < results.size(); ++i) out << pad(printable(results[i].adapter.name, 40), widths[i]);
        out << "\n";
    }
    for (std::size_t row = 0; row < results.front().properties.size(); ++row) {
        if (left_out(results, row)) continue;
        const std::string id = results.front().properties[row].id;
        out << (markdown ? "| " + id + " |" : pad(id, first));
        for (std::size_t i = 0; i < results.size(); ++i) {
            const std::string text = cell(results[i].properties[row]);
            out << (markdown ? " " + text + " |" : pad(text, widths[i]));
        }
        out << "\n";
    }
    out << (markdown ? "\n" : "") << left_out_note(results);
    return out.str();
}

// Its lines that are no comment (a thread-level trace holds what ran as comments).
std::size_t operations_in(const std::string& trace) {
    std::size_t operations = 0;
    for (std::size_t line = 0; line < trace.size(); line = trace.find('\n', line) + 1) {
        if (trace[line] != '#') ++operations;
        if (trace.find('\n', line) == std::string::npos) break;
    }
    return operations;
}

// The details' heading words after "adapter / property".
std::string heading(const PropertyResult& p) {
    if (p.id == engine_error_id && !p.failures.empty()) {
        return " (" + std::to_string(p.failures.size()) + (p.failures.size() == 1 ? " group" : " groups") + " by message, " +
               std::to_string(p.cases) + " traces)";
    }
    if (p.id == shared_state_id && !p.failures.empty()) {
        return " (engines share state across instances: " + std::to_string(p.failures.size()) +
               (p.failures.size() == 1 ? " finding" : " findings") + ", each with its two-part reproducer)";
    }
    if (p.failures.size() > 1) return " (" + std::to_string(p.failures.size()) + " distinct failures)";
    return "";
}

// What the search judged, when engine errors or repeats are worth a line.
std::string judged_note(const PropertyResult& p) {
    std::string note;
    if (p.id != engine_error_id && p.verdict != "blocked" && p.judged < p.cases) {
        note += "judged on " + std::to_string(p.judged) + " of " + std::to_string(p.cases) +
                " traces: the others ended in an engine error (see engine-error)";
    }
    if (p.repeats > 0) {
        note += std::string(note.empty() ? "" : "; ") + std::to_string(p.repeats) +
                (p.repeats == 1 ? " more trace" : " more traces") + " failed as one above (passed over)";
    }
    return note;
}

std::string shrunk_note(const FailureReport& f) {
    if (f.trace.empty()) {
        return "not shrunk (only the first " + std::to_string(error_groups_shrunk_max) + " groups of a search are): seed " +
               std::to_string(f.seed) + ", trace " + std::to_string(f.found_after) + " of the search";
    }
    std::string note = "shrunk from " + std::to_string(f.found_length) + " to " + std::to_string(operations_in(f.trace)) +
                       " operations, found after " + std::to_string(f.found_after) + " traces";
    return f.seed != 0 ? note + " (seed " + std::to_string(f.seed) + ")" : note;
}

// A shared-state finding's first part, run before its trace.
std::string prefix_note(const FailureReport& f) {
    if (f.reproduction.prefix.empty()) return "";
    return "after this prefix, run first in the same engine process" +
           (f.prefix_file.empty() ? std::string() : " (" + f.prefix_file + ")") + ":\n" + f.reproduction.prefix;
}

std::string failure_text(const PropertyResult& p, const FailureReport& f) {
    std::ostringstream out;
    out << "ERROR: " << p.id << ": " << printable(f.message, 2000) << count_note(f) << "\n";
    for (const std::string& other : f.also) out << "also: " << printable(other, 2000) << "\n";
    out << f.threads << f.trace << f.swimlanes << prefix_note(f);
    if (!f.trace.empty() || f.seed != 0) out << shrunk_note(f) << "\n";
    if (!f.reproduce.empty()) out << "reproduce: " << f.reproduce << "\n";
    if (!f.trace_file_error.empty()) out << "the trace was not written: " << printable(f.trace_file_error, 400) << "\n";
    return out.str();
}

std::string details_text(const AdapterResult& result, const PropertyResult& p) {
    std::ostringstream out;
    out << "\n== " << printable(result.adapter.name, 200) << " / " << p.id << heading(p) << "\n";
    if (p.verdict == "blocked") out << "BLOCKED: " << p.id << ": " << printable(p.message, 2000) << "\n";
    for (std::size_t i = 0; i < p.failures.size(); ++i) out << (i ? "\n" : "") << failure_text(p, p.failures[i]);
    if (p.verdict == "fail" && p.failures.empty()) out << "ERROR: " << p.id << ": " << printable(p.message, 2000) << "\n";
    const std::string note = judged_note(p);
    if (!note.empty()) out << note << "\n";
    if (!p.not_applied.empty()) out << "NOT APPLIED: " << p.id << ": " << p.not_applied << "\n";
    out << engine_output_text(p.engine_output, p.output, engine_lines_max);
    return out.str();
}

std::string failure_markdown(const PropertyResult& p, const FailureReport& f) {
    std::ostringstream out;
    out << "- **ERROR**: " << p.id << ": " << markdown_text(f.message) << count_note(f) << "\n";
    for (const std::string& other : f.also) out << "- also: " << markdown_text(other) << "\n";
    if (!f.trace.empty() || f.seed != 0) out << "- " << shrunk_note(f) << "\n";
    if (!f.reproduce.empty()) out << "- reproduce: `" << f.reproduce << "`\n";
    if (!f.trace_file_error.empty()) out << "- the trace was not written: " << markdown_text(f.trace_file_error) << "\n";
    if (!f.trace.empty()) out << "\n```\n" << f.threads << f.trace << f.swimlanes << "```\n";
    if (!f.reproduction.prefix.empty()) out << "\n```\n" << prefix_note(f) << "```\n";
    return out.str();
}

std::string details_markdown(const AdapterResult& result, const PropertyResult& p) {
    std::ostringstream out;
    out << "\n### " << markdown_text(result.adapter.name) << " / " << p.id << markdown_text(heading(p)) << "\n\n";
    if (p.verdict == "blocked") out << "- **BLOCKED**: " << p.id << ": " << markdown_text(p.message) << "\n";
    for (std::size_t i = 0; i < p.failures.size(); ++i) out << (i ? "\n" : "") << failure_markdown(p, p.failures[i]);
    if (p.verdict == "fail" && p.failures.empty()) out << "- **ERROR**: " << p.id << ": " << markdown_text(p.message) << "\n";
    const std::string note = judged_note(p);
    if (!note.empty()) out << "\n" << markdown_text(note) << "\n";
    if (!p.not_applied.empty()) out << "\n- **NOT APPLIED**: " << p.id << ": " << markdown_text(p.not_applied) << "\n";
    const CapturedOutput& err = p.engine_output[1];
    if (err.bytes > 0) {
        const std::string text = last_lines(err.tail, engine_lines_max);
        const std::string fence = fence_for(text);
        out << "\nengine stderr (" << err.bytes << " bytes; the last lines):\n\n" << fence << "\n" << text << (text.empty() || text.back() == '\n' ? "" : "\n") << fence << "\n";
    }
    return out.str();
}

// A property's details: its failures, why it is blocked, or how much of
// its search could be judged when not all of it could.
bool has_details(const PropertyResult& p) {
    return p.verdict == "fail" || p.verdict == "blocked" ||
           (p.verdict == "pass" && (!judged_note(p).empty() || !p.not_applied.empty()));
}

std::string details(const std::vector<AdapterResult>& results, bool markdown) {
    std::string out;
    for (const AdapterResult& result : results) {
        for (const PropertyResult& p : result.properties) {
            if (has_details(p)) out += markdown ? details_markdown(result, p) : details_text(result, p);
        }
    }
    return out;
}

std::string incomplete_note(int interrupted_by) {
    if (interrupted_by == 0) return "";
    return "INCOMPLETE: interrupted by " + signal_name(interrupted_by) +
           "; the properties marked - did not finish (the others did)\n\n";
}

}  // namespace

std::string engine_output_text(const std::array<CapturedOutput, 2>& captured, const std::string& output,
                               std::size_t lines_max) {
    const auto lines = [](const std::string& text) { return text.empty() || text.back() == '\n' ? text : text + "\n"; };
    std::string out;
    const CapturedOutput& err = captured[1];
    if (err.bytes > 0) {
        out += "engine stderr (" + std::to_string(err.bytes) + " bytes; the last lines):\n" + lines(last_lines(err.tail, lines_max));
    }
    if (!output.empty()) out += "the engine's output ended with:\n" + lines(last_lines(output, lines_max));
    return out;
}

ReportFormat parse_report_format(const std::string& name) {
    if (name == "table") return ReportFormat::table;
    if (name == "json") return ReportFormat::json;
    if (name == "junit") return ReportFormat::junit;
    if (name == "markdown") return ReportFormat::markdown;
    if (name == "html") return ReportFormat::html;
    throw UsageError("unknown report format '" + printable(name, 40) + "': table, json, junit, markdown or html");
}

std::string render_stats(const std::vector<AdapterResult>& results) {
    std::ostringstream out;
    Coverage total;
    std::size_t traces = 0;
    for (const AdapterResult& result : results) {
        total.add(result.coverage);
        traces += result.traces;
    }
    out << "shapes of interest in " << traces << " traces (all adapters):\n";
    for (std::size_t i = 0; i < shape_count; ++i) {
        const Shape shape = static_cast<Shape>(i);
        char line[160];
        std::snprintf(line, sizeof line, "  %-22s %8u  %s\n", shape_id(shape), total.count_of(shape), shape_summary(shape));
        out << line;
    }
    return out.str();
}

// The model domains searched (kvcheck/domain.h): one line when every
// adapter's is the same, else a line each.
std::string domains_text(const std::vector<AdapterResult>& results) {
    const bool one = std::all_of(results.begin(), results.end(),
                                 [&](const AdapterResult& r) { return r.domain == results.front().domain; });
    if (one) return results.front().domain.empty() ? "" : "domain: " + results.front().domain + "\n";
    std::string text;
    for (const AdapterResult& r : results) {
        text += "domain of " + r.adapter.name + ": " + (r.domain.empty() ? std::string("(not searched)") : r.domain) + "\n";
    }
    return text;
}

std::string render_report(const std::vector<AdapterResult>& results, ReportFormat format, std::uint64_t seed,
                          int interrupted_by) {
    if (format == ReportFormat::json) return render_json(results, seed, interrupted_by);
    if (format == ReportFormat::junit) return render_junit(results, interrupted_by);
    if (format == ReportFormat::html) return render_html(results, seed, interrupted_by, {});  // no pictures: see report_html.h
    if (results.empty()) return incomplete_note(interrupted_by);
    if (format == ReportFormat::markdown) {
        const std::string domains = domains_text(results);
        return "## kvcheck conformance (seed " + std::to_string(seed) + ")\n\n" + (domains.empty() ? "" : domains + "\n") +
               incomplete_note(interrupted_by) +
               matrix(results, true) + details(results, true);
    }
    std::ostringstream out;
    out << "kvcheck conformance, seed " << seed << "\n" << domains_text(results) << "\n" << incomplete_note(interrupted_by)
        << matrix(results, false);
    out << "\npass: no violation in the cases run; FAIL: a violation (trace below); FAULT: the engine crashed, hung,\n"
           "leaked, ran out of time or exited; skip: the adapter lacks a capability the property needs; n/a: a\n"
           "property of the other cache family (paged or contiguous), or of a capacity the adapter does not declare"
        << (interrupted_by != 0 ? "; -: not finished" : "")
        << ";\nblocked: fewer than 90 % of the traces could be judged (the others ended in an engine error, grouped\n"
           "by message under engine-error). Each property searches traces of its own, with every property checked\n"
           "on each: a trace is counted against the property it breaks first; a failing property lists up to\n"
           "--failures distinct failures. pass*: passed the checks that could be applied (NOT APPLIED below says\n"
           "which could not, and why). shared-state: an engine-level verdict, as engine-error is; it fails when a\n"
           "finding needs an earlier engine of its process, or a trace answered otherwise after other traces ran.\n";
    out << details(results, false);
    return out.str();
}

}  // namespace kvcheck::cli
