#include "report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace kvcheck::cli {
namespace {

std::string json_string(const std::string& text) {
    std::string out = "\"";
    for (const char c : text) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char escaped[8];
                    std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
                    out += escaped;
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

std::string json_or_null(const std::string& text) { return text.empty() ? "null" : json_string(text); }

std::string xml_escape(const std::string& text) {
    std::string out;
    for (const char c : text) {
        switch (c) {
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '&': out += "&amp;"; break;
            case '"': out += "&quot;"; break;
            default: out += c;
        }
    }
    return out;
}

std::string seconds_text(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f", seconds);
    return text;
}

std::string cell(const PropertyResult& result) {
    if (!result.fault.empty()) return "FAULT";
    if (result.verdict == "fail") return "FAIL";
    if (result.verdict == "skipped") return "skip";
    if (result.verdict == "blocked") return "blocked";
    return "pass";
}

std::string json_adapter(const AdapterResult& result, std::uint64_t seed, const std::string& indent) {
    std::ostringstream out;
    out << indent << "{\"adapter\": " << json_string(result.adapter.name) << ", \"source\": " << json_string(result.adapter.source)
        << ", \"seed\": " << seed << ", \"traces\": " << result.traces << ", \"shapes\": {";
    for (std::size_t i = 0; i < shape_count; ++i) {
        out << (i ? ", " : "") << json_string(shape_id(static_cast<Shape>(i))) << ": " << result.coverage.shapes[i];
    }
    out << "}, \"properties\": [";
    for (std::size_t i = 0; i < result.properties.size(); ++i) {
        const PropertyResult& p = result.properties[i];
        out << (i ? "," : "") << "\n" << indent << "  {\"id\": " << json_string(p.id) << ", \"verdict\": " << json_string(p.verdict)
            << ", \"cases\": " << p.cases << ", \"seconds\": " << seconds_text(p.seconds)
            << ", \"trace\": " << json_or_null(p.trace) << ", \"message\": " << json_or_null(p.message)
            << ", \"fault\": " << json_or_null(p.fault) << ", \"reproduce\": " << json_or_null(p.reproduce)
            << ", \"output\": " << json_or_null(p.output) << "}";
    }
    out << "\n" << indent << "]}";
    return out.str();
}

std::string render_json(const std::vector<AdapterResult>& results, std::uint64_t seed) {
    if (results.size() == 1) return json_adapter(results.front(), seed, "") + "\n";
    std::string out = "[\n";
    for (std::size_t i = 0; i < results.size(); ++i) out += (i ? ",\n" : "") + json_adapter(results[i], seed, "  ");
    return out + "\n]\n";
}

std::string render_junit(const std::vector<AdapterResult>& results) {
    std::ostringstream out;
    out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"kvcheck\">\n";
    for (const AdapterResult& result : results) {
        std::size_t failures = 0;
        std::size_t skipped = 0;
        double time = 0;
        for (const auto& p : result.properties) {
            failures += p.verdict == "fail";
            skipped += p.verdict == "skipped";
            time += p.seconds;
        }
        out << "  <testsuite name=\"" << xml_escape(result.adapter.name) << "\" tests=\"" << result.properties.size()
            << "\" failures=\"" << failures << "\" skipped=\"" << skipped << "\" time=\"" << seconds_text(time) << "\">\n";
        for (const auto& p : result.properties) {
            out << "    <testcase classname=\"kvcheck." << xml_escape(result.adapter.name) << "\" name=\"" << xml_escape(p.id)
                << "\" time=\"" << seconds_text(p.seconds) << "\">";
            if (p.verdict == "fail") {
                out << "\n      <failure message=\"" << xml_escape(p.message) << "\" type=\""
                    << (p.fault.empty() ? "property" : "fault") << "\">" << xml_escape(p.trace)
                    << (p.reproduce.empty() ? "" : "reproduce: " + xml_escape(p.reproduce)) << "</failure>\n    ";
            } else if (p.verdict == "skipped") {
                out << "\n      <skipped message=\"" << xml_escape(p.message) << "\"/>\n    ";
            }
            out << "</testcase>\n";
        }
        out << "  </testsuite>\n";
    }
    out << "</testsuites>\n";
    return out.str();
}

// Rows: properties; columns: adapters.
std::string matrix(const std::vector<AdapterResult>& results, bool markdown) {
    std::ostringstream out;
    const std::size_t first = 24;
    std::size_t width = 10;
    for (const auto& r : results) width = std::max(width, r.adapter.name.size() + 2);
    auto pad = [](std::string text, std::size_t n) {
        if (text.size() < n) text.append(n - text.size(), ' ');
        return text;
    };
    if (markdown) {
        out << "| property |";
        for (const auto& r : results) out << " " << r.adapter.name << " |";
        out << "\n|---|";
        for (std::size_t i = 0; i < results.size(); ++i) out << "---|";
        out << "\n";
    } else {
        out << pad("property", first);
        for (const auto& r : results) out << pad(r.adapter.name, width);
        out << "\n";
    }
    for (std::size_t row = 0; row < results.front().properties.size(); ++row) {
        const std::string id = results.front().properties[row].id;
        out << (markdown ? "| " + id + " |" : pad(id, first));
        for (const auto& r : results) {
            const std::string text = cell(r.properties[row]);
            out << (markdown ? " " + text + " |" : pad(text, width));
        }
        out << "\n";
    }
    return out.str();
}

std::string details(const std::vector<AdapterResult>& results, bool markdown) {
    std::ostringstream out;
    for (const AdapterResult& result : results) {
        for (const PropertyResult& p : result.properties) {
            if (p.verdict != "fail") continue;
            out << (markdown ? "\n### " : "\n== ") << result.adapter.name << " / " << p.id << "\n";
            out << (markdown ? "" : "") << "ERROR: " << p.id << ": " << p.message << "\n";
            for (const std::string& other : p.also) out << "also: " << other << "\n";
            if (!p.trace.empty()) {
                out << (markdown ? "```\n" : "") << p.trace << (markdown ? "```\n" : "");
                out << "shrunk from " << p.found_length << " to "
                    << std::count(p.trace.begin(), p.trace.end(), '\n') << " operations, found after " << p.cases << " traces\n";
            }
            if (!p.reproduce.empty()) out << "reproduce: " << p.reproduce << "\n";
            if (!p.output.empty()) {
                out << "the engine's output ended with:\n" << (markdown ? "```\n" : "") << p.output << "\n"
                    << (markdown ? "```\n" : "");
            }
        }
    }
    return out.str();
}

}  // namespace

ReportFormat parse_report_format(const std::string& name) {
    if (name == "table") return ReportFormat::table;
    if (name == "json") return ReportFormat::json;
    if (name == "junit") return ReportFormat::junit;
    if (name == "markdown") return ReportFormat::markdown;
    throw UsageError("unknown report format '" + name + "': table, json, junit or markdown");
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

std::string render_report(const std::vector<AdapterResult>& results, ReportFormat format, std::uint64_t seed) {
    if (results.empty()) return "";
    switch (format) {
        case ReportFormat::json: return render_json(results, seed);
        case ReportFormat::junit: return render_junit(results);
        case ReportFormat::markdown:
            return "## kvcheck conformance (seed " + std::to_string(seed) + ")\n\n" + matrix(results, true) + details(results, true);
        case ReportFormat::table: break;
    }
    std::ostringstream out;
    out << "kvcheck conformance, seed " << seed << "\n\n" << matrix(results, false);
    out << "\npass: no violation in the cases run; FAIL: a violation (trace below); FAULT: the engine crashed, hung or\n"
           "leaked; skip: the adapter lacks a capability the property needs; blocked: an engine error cut the search\n"
           "short. Each property searches traces of its own, with every property checked on each: a trace is\n"
           "counted against the property it breaks first.\n";
    out << details(results, false);
    return out.str();
}

}  // namespace kvcheck::cli
