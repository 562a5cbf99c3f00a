#include "search_job.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <system_error>

namespace kvcheck::cli {
namespace {

namespace fs = std::filesystem;

// A message on one line of the child's report and back: an engine's error
// may span lines (a Python traceback), and keeps them.
std::string escape_lines(const std::string& text) {
    std::string out;
    for (const char c : text) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
    return out;
}

std::string unescape_lines(const std::string& text) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) {
            out += text[i + 1] == 'n' ? '\n' : text[i + 1];
            ++i;
        } else {
            out += text[i];
        }
    }
    return out;
}

}  // namespace

std::string one_line(std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    return text;
}

// ---- what a child sends about a failure ---------------------------------------


std::string encode(const FoundFailure& found) {
    std::ostringstream out;
    out << "cases " << found.cases << "\nfound " << found.found_length << "\nstep " << found.failure.step
        << "\nproperty " << found.failure.property << "\nmessage " << escape_lines(found.failure.message) << "\n";
    for (const std::string& other : found.failure.also) out << "also " << escape_lines(other) << "\n";
    out << "trace\n" << found.trace;
    return out.str();
}

FoundFailure decode(const std::string& payload) {
    FoundFailure found;
    std::istringstream in(payload);
    std::string line;
    while (std::getline(in, line) && line != "trace") {
        const std::size_t space = line.find(' ');
        const std::string key = line.substr(0, space);
        const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
        if (key == "cases") found.cases = std::stoul(value);
        if (key == "found") found.found_length = std::stoul(value);
        if (key == "step") found.failure.step = std::stoul(value);
        if (key == "property") found.failure.property = value;
        if (key == "message") found.failure.message = unescape_lines(value);
        if (key == "also") found.failure.also.push_back(unescape_lines(value));
    }
    found.trace.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return found;
}

// ---- the child's work -------------------------------------------------------------

// Runs traces of `adapter` checking `properties` on fresh engines, each
// announced to the parent first ("begin": when the child dies, the parent
// knows which trace killed it) and each operation marked on the channel
// (the parent's silence limit, and the step a crash is pinned to); dumps go
// under the job's own directory, emptied first, which the parent removes
// however the child ends.
Runner runner_for(const Adapter& adapter, PropertySet properties, Channel& out) {
    Runner runner;
    runner.make = adapter.make;
    runner.options.properties = properties;
    runner.options.on_step = [&out](std::size_t step) { out.step(step); };
    if (!out.work_dir().empty()) runner.options.work_dir = out.work_dir() + "/run";
    runner.before_run = [&out, dir = runner.options.work_dir](const Trace& trace) {
        out.send("begin", format_trace(trace));
        std::error_code ignored;
        if (!dir.empty()) fs::remove_all(dir, ignored);
    };
    // For the parent's progress lines.
    runner.on_shorter = [&out](std::size_t operations) { out.send("shrunk", std::to_string(operations)); };
    return runner;
}

void send_finding(const Finding& finding, std::size_t cases, Channel& out) {
    out.send("fail", encode({cases, finding.found.size(), finding.reported, format_trace(finding.shrunk.trace)}));
}

std::string encode_stats(std::size_t cases, const Coverage& coverage) {
    std::ostringstream out;
    out << "cases " << cases << "\n";
    for (std::size_t i = 0; i < shape_count; ++i) out << shape_id(static_cast<Shape>(i)) << " " << coverage.shapes[i] << "\n";
    for (std::size_t i = 0; i < op_kind_count; ++i) out << "op:" << op_kind_name(i) << " " << coverage.ops_run[i] << "\n";
    return out.str();
}

void decode_stats(const std::string& payload, std::size_t* cases, Coverage* coverage) {
    std::istringstream in(payload);
    std::string key;
    std::uint64_t value = 0;
    while (in >> key >> value) {
        if (key == "cases") *cases += value;
        for (std::size_t i = 0; i < shape_count; ++i) {
            if (key == shape_id(static_cast<Shape>(i))) coverage->shapes[i] += static_cast<std::uint32_t>(value);
        }
        for (std::size_t i = 0; i < op_kind_count; ++i) {
            if (key == std::string("op:") + op_kind_name(i)) coverage->ops_run[i] += static_cast<std::uint32_t>(value);
        }
    }
}

// Searches seeded traces for a violation of one property: the property's
// own traces (stream `index` of the run's seed: kvcheck::trace_seed), with every property the engine can be judged
// on checked on each, so that a trace is blamed on what it breaks first.
// Another property found broken is reported as such ("other"), and the
// search goes on for this one, passing over the traces that break a
// property already found broken first (what follows such a break proves
// nothing); an engine error ends it ("blocked": the property could not be
// judged past it).
void search_property(const Adapter& adapter, Property property, std::size_t index, const ConformanceOptions& options,
                     Channel& out) {
    const std::shared_ptr<Engine> probe = adapter.make();
    const Capabilities capabilities = probe->capabilities();
    if (!checkable(capabilities).has(property)) {
        out.send("skipped", "the adapter does not report what this property needs (see Capabilities)");
        return;
    }
    WorkloadOptions workload = options.workload;
    workload.capabilities = capabilities;
    if (options.model) workload.capabilities.model = *options.model;
    const std::string fault = capabilities_fault(workload.capabilities);
    if (!fault.empty()) {
        out.send("error", (options.model ? "--model does not fit the engine: " : "the engine's capabilities: ") + fault);
        return;
    }
    out.send("domain", domain_text(workload.capabilities.model));
    workload.dump_kill = property == Property::dump_safe;
    const PropertySet checked = checkable(capabilities);
    std::vector<std::string> known;  // the properties found broken so far
    const double start = monotonic_seconds();
    std::size_t cases = 0;
    Coverage coverage;
    const auto finish = [&](const std::string& kind, const std::string& payload) {
        out.send("stats", encode_stats(cases, coverage));
        out.send(kind, payload);
    };
    for (;;) {
        Budget budget{options.seed, index, cases, options.cases > cases ? options.cases - cases : 0, 0};
        if (options.seconds > 0) {
            budget.seconds = options.seconds - (monotonic_seconds() - start);
            if (budget.seconds <= 0) break;
        } else if (budget.cases == 0) {
            break;
        }
        Runner runner = runner_for(adapter, checked, out);
        runner.passes_over = [&known](const Failure& failure) {
            return std::find(known.begin(), known.end(), failure.property) != known.end();
        };
        const SearchResult result = search(runner, budget, workload);
        cases += result.cases;
        coverage.add(result.coverage);
        if (!result.finding) break;
        const Finding& finding = *result.finding;
        const FoundFailure found{cases, finding.found.size(), finding.reported, format_trace(finding.shrunk.trace)};
        const std::optional<Property> broken = parse_property(finding.reported.property);
        if (broken == property) {
            finish("fail", encode(found));
            return;
        }
        out.send("other", encode(found));
        if (!broken) {
            finish("blocked", "the engine errors (see engine-error) at trace " + std::to_string(cases) +
                                  " of the search; this property was not judged past it");
            return;
        }
        known.push_back(finding.reported.property);
    }
    finish("pass", std::to_string(cases));
}

}  // namespace kvcheck::cli
