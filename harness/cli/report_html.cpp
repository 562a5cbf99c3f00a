#include "report_html.h"

#include "interrupt.h"
#include "text.h"
#include "kvcheck/trace.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <cctype>
#include <set>
#include <sstream>

namespace kvcheck::cli {
namespace {

// The picture's geometry, in SVG pixels: boxes stacked in a column, the
// links between them drawn as arcs in the margin on their left.
constexpr int column_width = 286;
constexpr int box_left = 44;
constexpr int box_width = 230;
constexpr int box_height = 50;
constexpr int box_gap = 14;
constexpr int link_spacing = 9;  // how much further left each nested link bends

std::string html(const std::string& text) { return xml_text(printable(text, 4000, true)); }
std::string attribute(const std::string& text) { return xml_text(printable(text, 400), true); }

std::string seconds_text(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, seconds < 10 ? "%.2f s" : "%.0f s", seconds);
    return text;
}

std::string verdict_class(const PropertyResult& p) {
    if (p.verdict == "fail") return p.fault.empty() ? "fail" : "fault";
    // A property of the other cache family (search_job.cpp says "n/a: ...").
    if (p.verdict == "skipped") return p.message.rfind("n/a", 0) == 0 ? "n/a" : "skip";
    return p.verdict;  // pass, blocked, not-run
}

// A row every adapter of the report has as n/a (a property of the other
// cache family) says nothing: the table leaves it out and says so.
bool row_shown(const std::vector<AdapterResult>& results, std::size_t row) {
    return std::any_of(results.begin(), results.end(),
                       [row](const AdapterResult& r) { return verdict_class(r.properties[row]) != "n/a"; });
}

std::string anchor_of(const AdapterResult& result, const PropertyResult& p) {
    return attribute(result.adapter.name + "-" + p.id);
}

const char* style_sheet() {
    // Nothing is clipped at any width: long words wrap, a table wider than
    // the window scrolls inside its own box, box text is cut to fit with the
    // whole of it in the box's tooltip (box_svg).
    return R"(body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d232b;background:#fbfbfc;overflow-wrap:anywhere}
.scroll{overflow-x:auto;max-width:100%}ul.summary{padding-left:20px}ul.summary li{margin:3px 0}
ul.summary .verdict{font-weight:600;color:#c62828}
h1{font-size:22px}h2{font-size:18px;margin-top:32px}h3{font-size:15px;margin:24px 0 6px}
table.verdicts{border-collapse:collapse}table.verdicts th,table.verdicts td{border:1px solid #d5d9df;padding:4px 10px;text-align:left}
td small{color:#4a5260}td.pass{background:#dff3e3}td.fail{background:#f8d4d4;font-weight:600}td.fault{background:#fbe1c6;font-weight:600}
td.skip,td.not-run,td.n\/a{background:#eceef1;color:#596170}td.blocked{background:#fbf0bf}
.note{color:#596170}.message{border-left:4px solid #c62828;padding:4px 10px;background:#fff;white-space:pre-wrap}
pre.replay{background:#1d232b;color:#f3f5f7;padding:8px 12px;user-select:all;white-space:pre-wrap;cursor:text}
pre.trace{background:#f0f2f5;padding:6px 10px;white-space:pre-wrap}
table.lanes{border-collapse:collapse;font-family:monospace;font-size:12px;margin:6px 0}
table.lanes th,table.lanes td{border:1px solid #d5d9df;padding:2px 8px;text-align:left;white-space:pre}
table.lanes td.conflict{background:#fbe1c6}table.lanes td.failing{background:#f8d4d4;outline:2px solid #c62828}
.steps{display:flex;flex-wrap:wrap;gap:10px;padding-bottom:8px;align-items:flex-start}
.step{flex:none;width:286px;border:1px solid #d5d9df;border-radius:6px;background:#fff}
.step.failing{border:2px solid #c62828;box-shadow:0 0 0 3px #f8d4d4}
.step header{font:12px ui-monospace,monospace;padding:6px 8px;border-bottom:1px solid #e4e7eb;background:#f5f6f8;border-radius:6px 6px 0 0}
.step.failing header{background:#f8d4d4}
.step .check{margin:6px 8px 8px;padding:4px 8px;background:#fff3f3;border-left:4px solid #c62828;font-size:12px;white-space:pre-wrap}
svg text{font:11px ui-monospace,monospace}
rect.box.entry{fill:#e8f0fe;stroke:#3b6fd6}rect.box.handle{fill:#fff8e1;stroke:#b7860b}
rect.box.culprit{stroke:#c62828;stroke-width:3;fill:#fde2e2}
path.link{fill:none;stroke:#7b3fb8;stroke-width:2}path.link.culprit{stroke:#c62828;stroke-width:3}
text.owned{fill:#1b7a35;font-weight:700}text.error{fill:#c62828}
.legend span{display:inline-block;margin-right:14px}
.bars{display:grid;grid-template-columns:200px 60px 1fr;gap:3px 10px;align-items:center;max-width:760px}
.bars .bar{height:12px;background:#3b6fd6;border-radius:2px}.bars .zero{color:#c62828})";
}

// ---- the table ---------------------------------------------------------------------------------

std::string table(const std::vector<AdapterResult>& results) {
    std::ostringstream out;
    out << "<div class=\"scroll\"><table class=\"verdicts\"><thead><tr><th>property</th>";
    for (const AdapterResult& r : results) out << "<th>" << html(r.adapter.name) << "</th>";
    out << "</tr></thead><tbody>\n";
    std::size_t left_out = 0;
    for (std::size_t row = 0; row < results.front().properties.size(); ++row) {
        if (!row_shown(results, row)) {
            ++left_out;
            continue;
        }
        out << "<tr><th>" << html(results.front().properties[row].id) << "</th>";
        for (const AdapterResult& r : results) {
            const PropertyResult& p = r.properties[row];
            const std::string verdict = verdict_class(p);
            out << "<td class=\"" << verdict << "\" title=\"" << attribute(p.message) << "\">"
                << (verdict == "fail" ? "FAIL" : verdict == "fault" ? "FAULT" : verdict) << "<br><small>" << p.cases
                << " traces · " << seconds_text(p.seconds) << "</small></td>";
        }
        out << "</tr>\n";
    }
    out << "<tr><th>counts</th>";
    for (const AdapterResult& r : results) {
        std::map<std::string, std::size_t> counts;
        for (const PropertyResult& p : r.properties) ++counts[verdict_class(p)];
        std::string text;
        for (const auto& [verdict, count] : counts) text += (text.empty() ? "" : ", ") + std::to_string(count) + " " + verdict;
        out << "<td><small>" << html(text) << "</small></td>";
    }
    out << "</tr></tbody></table></div>\n";
    if (left_out > 0) {
        out << "<p class=\"note left-out\">" << left_out << (left_out == 1 ? " property" : " properties")
            << " of the other cache family left out: n/a for every adapter here (the JSON report lists them)</p>\n";
    }
    return out.str();
}

// ---- the failures first: a line per failing property, linking to its drawing ----------------------

std::string summary_html(const std::vector<AdapterResult>& results) {
    std::ostringstream out;
    for (const AdapterResult& r : results) {
        for (const PropertyResult& p : r.properties) {
            const std::string verdict = verdict_class(p);
            if (verdict != "fail" && verdict != "fault" && verdict != "blocked") continue;
            const std::string first = p.failures.empty() ? p.message : p.failures.front().message;
            out << "<li><a href=\"#" << anchor_of(r, p) << "\">" << html(r.adapter.name) << " / " << html(p.id)
                << "</a> <span class=\"verdict\">" << (verdict == "blocked" ? "BLOCKED" : verdict == "fail" ? "FAIL" : "FAULT")
                << "</span>: " << html(printable(first, 160)) << "</li>";
        }
    }
    const std::string items = out.str();
    return items.empty() ? "" : "<ul class=\"summary\">" + items + "</ul>\n";
}

// ---- a failure's picture ---------------------------------------------------------------------

// The boxes a check's message names: entries as `"id"`, handles as `hN`.
// (No <regex>: g++ 12 warns inside it under -O1 with sanitizers.)
std::set<std::string> named_in(const std::string& message) {
    std::set<std::string> names;
    for (std::size_t open = message.find('"'); open != std::string::npos;) {
        const std::size_t close = message.find('"', open + 1);
        if (close == std::string::npos) break;
        if (close - open - 1 <= 64) names.insert(message.substr(open + 1, close - open - 1));
        open = message.find('"', close + 1);
    }
    const auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    for (std::size_t i = 0; i + 1 < message.size(); ++i) {
        if (message[i] != 'h' || (i > 0 && word(message[i - 1]))) continue;
        std::size_t end = i + 1;
        while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
        if (end > i + 1 && (end == message.size() || !word(message[end]))) names.insert(message.substr(i, end - i));
    }
    return names;
}

// At most `chars` characters of `text` made printable (a cut one ends in
// "…"): box text never runs past its box. Characters are counted as UTF-8
// code points, of the monospace font's width (box_chars_max).
std::string fitted(const std::string& text, std::size_t chars) {
    const std::string shown = printable(text, 4000);
    std::size_t count = 0;
    for (std::size_t i = 0; i < shown.size(); ++i) {
        if ((static_cast<unsigned char>(shown[i]) & 0xC0) == 0x80) continue;  // inside a character
        if (++count == chars) {
            std::size_t end = i + 1;
            while (end < shown.size() && (static_cast<unsigned char>(shown[end]) & 0xC0) == 0x80) ++end;
            return end == shown.size() ? shown : shown.substr(0, i) + "…";
        }
    }
    return shown;
}

// How many characters of 11 px monospace (6.6 px each in the usual fonts;
// 6.7 counted) a box line holds, with 8 px of margin on each side; the
// "owned" label takes 8 more. tests/report_html_test.py measures it.
constexpr std::size_t box_chars_max = (box_width - 16) * 10 / 67;
constexpr std::size_t owned_chars = 8;

std::string box_svg(const BoxPicture& box, int top, bool culprit) {
    std::ostringstream out;
    const std::string kind = box.entry ? "entry" : "handle";
    const std::string title = box.entry ? "entry \"" + box.name + "\"" : "handle " + box.name;
    const std::string detail =
        !box.error.empty() ? "unreadable: " + box.error
                           : std::to_string(box.layers) + (box.layers == 1 ? " layer × " : " layers × ") + box.tokens + " tok" +
                                 (box.dtype.empty() ? "" : " · " + box.dtype) + " · " + box.layout;
    // The tooltip holds all of both lines.
    out << "<g><title>" << html(title + (box.storage.empty() ? "" : ", " + std::to_string(box.storage.size()) + " storages") +
                                "\n" + detail)
        << "</title><rect class=\"box " << kind << (culprit ? " culprit" : "") << "\" data-name=\"" << attribute(box.name)
        << "\" x=\"" << box_left << "\" y=\"" << top << "\" width=\"" << box_width << "\" height=\"" << box_height
        << "\" rx=\"5\"/>";
    out << "<text x=\"" << box_left + 8 << "\" y=\"" << top + 18 << "\">"
        << xml_text(fitted(title, box.owned ? box_chars_max - owned_chars : box_chars_max)) << "</text>";
    if (box.owned) out << "<text class=\"owned\" x=\"" << box_left + box_width - 50 << "\" y=\"" << top + 18 << "\">owned</text>";
    out << "<text x=\"" << box_left + 8 << "\" y=\"" << top + 38 << "\"" << (box.error.empty() ? "" : " class=\"error\"") << ">"
        << xml_text(fitted(detail, box_chars_max)) << "</text></g>";
    return out.str();
}

std::string step_svg(const StepPicture& step, const std::set<std::string>& culprits) {
    const auto& boxes = step.boxes;
    const int height = 8 + static_cast<int>(boxes.size()) * (box_height + box_gap) + 4;
    const auto middle = [](std::size_t i) { return 8 + static_cast<int>(i) * (box_height + box_gap) + box_height / 2; };
    std::ostringstream out;
    out << "<svg width=\"" << column_width - 4 << "\" height=\"" << std::max(height, 30) << "\" role=\"img\">";
    if (boxes.empty()) out << "<text x=\"12\" y=\"20\" class=\"note\">nothing stored, no handle</text>";
    int depth = 0;
    for (std::size_t i = 0; i < boxes.size(); ++i) {
        for (std::size_t j = i + 1; j < boxes.size(); ++j) {
            if (!boxes[i].shares_storage_with(boxes[j])) continue;
            const bool culprit = culprits.count(boxes[i].name) && culprits.count(boxes[j].name);
            const int bend = std::max(4, box_left - 16 - link_spacing * (depth++ % 3));
            out << "<path class=\"link" << (culprit ? " culprit" : "") << "\" data-from=\"" << attribute(boxes[i].name)
                << "\" data-to=\"" << attribute(boxes[j].name) << "\" d=\"M" << box_left << "," << middle(i) << " C" << bend
                << "," << middle(i) << " " << bend << "," << middle(j) << " " << box_left << "," << middle(j)
                << "\"><title>" << html(boxes[i].name + " and " + boxes[j].name + " share storage") << "</title></path>";
        }
    }
    for (std::size_t i = 0; i < boxes.size(); ++i) {
        out << box_svg(boxes[i], 8 + static_cast<int>(i) * (box_height + box_gap), culprits.count(boxes[i].name) > 0);
    }
    out << "</svg>";
    return out.str();
}

std::string picture_html(const FailurePicture& picture, const std::string& message) {
    std::ostringstream out;
    const std::string check = picture.message.empty() ? message : picture.message;
    const std::set<std::string> culprits = named_in(check);
    out << "<div class=\"steps\">";
    for (std::size_t i = 0; i < picture.steps.size(); ++i) {
        const bool failing = picture.failing_step == i;
        out << "<section class=\"step" << (failing ? " failing" : "") << "\" data-step=\"" << i << "\"><header>step " << i
            << ": " << html(picture.steps[i].op) << "</header>"
            << step_svg(picture.steps[i], failing ? culprits : std::set<std::string>{});
        if (failing) out << "<div class=\"check\">" << html(check) << "</div>";
        out << "</section>";
    }
    out << "</div>";
    if (!picture.error.empty()) out << "<p class=\"note\">the picture is cut short: " << html(picture.error) << "</p>";
    return out.str();
}

// A failure in a trace of several lanes: a column per lane, a row per
// call in schedule order; the conflicting calls shaded, the failing one
// outlined (kvcheck/lanes.h, conflicting_steps).
std::string lanes_html(const FailureReport& f) {
    if (f.lanes.empty()) return "";
    const Trace trace = parse_trace(f.trace);
    std::vector<std::int64_t> columns;
    for (std::size_t i = 0; i < trace.size() && i < f.lanes.size(); ++i) {
        if (!std::holds_alternative<op::SwitchLane>(trace[i])) columns.push_back(f.lanes[i]);
    }
    std::sort(columns.begin(), columns.end());
    columns.erase(std::unique(columns.begin(), columns.end()), columns.end());
    std::ostringstream out;
    out << "<p>the lanes side by side, in schedule order (shaded: a call of a request still open at the failure, or "
           "another lane's call inside one):</p><div class=\"scroll\"><table class=\"lanes\"><tr><th>step</th>";
    for (const std::int64_t lane : columns) out << "<th>lane " << lane << "</th>";
    out << "</tr>";
    for (std::size_t i = 0; i < trace.size() && i < f.lanes.size(); ++i) {
        if (std::holds_alternative<op::SwitchLane>(trace[i])) continue;
        const bool conflict = std::binary_search(f.conflicts.begin(), f.conflicts.end(), i);
        out << "<tr data-step=\"" << i << "\"><td>" << i << "</td>";  // numbered as the step pictures are
        for (const std::int64_t lane : columns) {
            if (lane != f.lanes[i]) {
                out << "<td></td>";
                continue;
            }
            const char* cls = i == f.step ? " class=\"failing\"" : conflict ? " class=\"conflict\"" : "";
            out << "<td" << cls << ">" << html(format_op(trace[i])) << "</td>";
        }
        out << "</tr>";
    }
    out << "</table></div>";  // a wide schedule scrolls in its own box
    return out.str();
}

std::string failure_html(const PropertyResult& p, const FailureReport& f, const FailurePicture* picture) {
    std::ostringstream out;
    out << "<div class=\"message\">ERROR: " << html(p.id) << ": " << html(f.message)
        << (f.count > 1 ? " (" + std::to_string(f.count) + " traces)" : "") << "</div>";
    for (const std::string& other : f.also) out << "<p class=\"note\">also: " << html(other) << "</p>";
    if (!f.fault.empty()) out << "<p>fault: " << html(f.fault) << "</p>";
    if (picture != nullptr) {
        out << picture_html(*picture, f.message);
    } else if (!f.trace.empty()) {
        out << "<pre class=\"trace\">" << html(f.threads + f.trace) << "</pre>";
    }
    out << lanes_html(f);
    if (!f.reproduction.prefix.empty()) {
        out << "<p>after this prefix, run first in the same engine process" << (f.prefix_file.empty() ? "" : " (" + html(f.prefix_file) + ")")
            << ":</p><pre class=\"trace\">" << html(f.reproduction.prefix) << "</pre>";
    }
    if (!f.reproduce.empty()) out << "<p>replay it (select to copy):</p><pre class=\"replay\">" << html(f.reproduce) << "</pre>";
    return out.str();
}

std::string failures_html(const std::vector<AdapterResult>& results, const Pictures& pictures) {
    std::ostringstream out;
    for (std::size_t a = 0; a < results.size(); ++a) {
        for (std::size_t i = 0; i < results[a].properties.size(); ++i) {
            const PropertyResult& p = results[a].properties[i];
            if (p.verdict != "fail" && p.verdict != "blocked") continue;
            out << "<h3 id=\"" << anchor_of(results[a], p) << "\">" << html(results[a].adapter.name)
                << " / " << html(p.id) << "</h3>\n";
            if (p.verdict == "blocked") out << "<p class=\"message\">BLOCKED: " << html(p.message) << "</p>";
            for (std::size_t f = 0; f < p.failures.size(); ++f) {
                const auto found = pictures.find({a, i, f});
                out << failure_html(p, p.failures[f], found == pictures.end() ? nullptr : &found->second) << "\n";
            }
            if (p.verdict == "fail" && p.failures.empty()) out << "<div class=\"message\">" << html(p.message) << "</div>";
        }
    }
    return out.str();
}

// ---- coverage -----------------------------------------------------------------------------------

std::string coverage_html(const std::vector<AdapterResult>& results) {
    Coverage total;
    std::size_t traces = 0;
    for (const AdapterResult& r : results) {
        total.add(r.coverage);
        traces += r.traces;
    }
    std::uint32_t most = 1;
    for (std::size_t i = 0; i < shape_count; ++i) most = std::max(most, total.shapes[i]);
    std::ostringstream out;
    // Only shapes of operations some adapter here claims (Coverage::claimed):
    // a red 0 is a shape the search could have met and did not.
    std::string not_drawn;
    for (std::size_t i = 0; i < shape_count; ++i) {
        const Shape shape = static_cast<Shape>(i);
        if (total.claimed[i] == 0) not_drawn += (not_drawn.empty() ? "" : ", ") + std::string(shape_id(shape));
    }
    out << "<p class=\"note\">shapes of interest in " << traces << " traces (all adapters; kvcheck run --stats)</p>"
        << "<div class=\"bars\">";
    for (std::size_t i = 0; i < shape_count; ++i) {
        const Shape shape = static_cast<Shape>(i);
        if (total.claimed[i] == 0) continue;
        const std::uint32_t count = total.count_of(shape);
        out << "<span title=\"" << attribute(shape_summary(shape)) << "\">" << shape_id(shape) << "</span><span"
            << (count == 0 ? " class=\"zero\"" : "") << ">" << count << "</span><div class=\"bar\" style=\"width:"
            << 100.0 * count / most << "%\"></div>";
    }
    out << "</div>";
    if (!not_drawn.empty()) {
        out << "<p class=\"note not-drawn\">left out, of operations no adapter here claims: " << html(not_drawn)
            << "</p>";
    }
    return out.str();
}

}  // namespace

Pictures picture_failures(const std::vector<AdapterResult>& results, const ConformanceOptions& options,
                          std::size_t per_property_max) {
    // A property's failure with a shrunk trace; not a fault, nor an
    // engine-error group.
    std::vector<PictureKey> drawn;
    for (std::size_t a = 0; a < results.size(); ++a) {
        for (std::size_t i = 0; i < results[a].properties.size(); ++i) {
            const PropertyResult& p = results[a].properties[i];
            for (std::size_t f = 0; f < std::min(p.failures.size(), per_property_max); ++f) {
                const FailureReport& failure = p.failures[f];
                // A thread-level finding is not drawn step by step: its calls overlap.
                if (parse_property(p.id) && !failure.trace.empty() && failure.fault.empty() && failure.threads.empty()) {
                    drawn.emplace_back(a, i, f);
                }
            }
        }
    }
    if (options.progress && !drawn.empty()) {
        std::cerr << "kvcheck run: drawing " << drawn.size() << (drawn.size() == 1 ? " failure" : " failures")
                  << " for the HTML report (each trace replayed once per step)\n";
    }
    // A test's hook: $KVCHECK_TEST_SIGNAL_AT_DRAWING=N raises signal N as
    // the drawing begins. A drawing takes about 90 ms, too short to land a
    // Ctrl-C in from outside at will (Cli.CtrlCWhileThePicturesAreDrawnMarksTheReportIncomplete).
    if (const char* signal = std::getenv("KVCHECK_TEST_SIGNAL_AT_DRAWING"); signal != nullptr && !drawn.empty()) {
        std::raise(std::atoi(signal));
    }
    Pictures pictures;
    for (const auto& [a, i, f] : drawn) {
        if (interrupted_by() != 0) break;
        const PropertyResult& p = results[a].properties[i];
        if (auto picture = picture_failure(results[a].adapter, p.id, p.failures[f], options)) {
            pictures.emplace(PictureKey{a, i, f}, std::move(*picture));
        }
    }
    return pictures;
}

std::string render_html(const std::vector<AdapterResult>& results, std::uint64_t seed, int interrupted_by,
                        const Pictures& pictures) {
    std::ostringstream out;
    out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kvcheck report, seed " << seed
        << "</title><style>" << style_sheet() << "</style></head><body>\n"
        << "<h1>kvcheck conformance, seed " << seed << "</h1>\n";
    if (interrupted_by != 0) {
        out << "<p class=\"message\">INCOMPLETE: interrupted by " << html(signal_name(interrupted_by))
            << "; the properties marked not-run did not finish</p>\n";
    }
    if (results.empty()) return out.str() + "</body></html>\n";
    // The failures first: a line per failing property linking to its
    // drawing, the drawings, then the whole table.
    const std::string failures = failures_html(results, pictures);
    if (!failures.empty()) {
        out << "<h2>Failures</h2>\n" << summary_html(results)
            << "<p class=\"note\">Each step shows what the engine holds after it: stored entries "
               "(blue) and live handles (yellow), layers × tokens, dtype and layout, <b>owned</b> when marked an owned "
               "copy; a purple arc links two boxes that share storage. The failing step is framed in red, with the "
               "boxes its check names; hover a box for all of its text.</p>\n"
            << failures;
    }
    out << "<h2>Verdicts</h2>\n" << table(results)
        << "<p class=\"legend note\"><span>pass: no violation in the traces run</span><span>FAIL: a violation</span>"
           "<span>FAULT: the engine crashed, hung, leaked or exited</span><span>skip: a capability the property needs is "
           "missing</span><span>n/a: a property of the other cache family</span><span>blocked: too many traces ended in engine errors</span><span>shared-state FAIL: engines share state across "
           "instances (each finding with its two-part reproducer)</span></p>\n";
    out << "<h2>Coverage</h2>\n" << coverage_html(results) << "\n</body></html>\n";
    return out.str();
}

}  // namespace kvcheck::cli
