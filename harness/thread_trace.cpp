// A thread-level finding as a trace file (kvcheck/threads.h,
// docs/semantics.md#the-thread-level): the calls in the order they returned,
// as a lanes trace, under a `threads lanes=N schedule=...` line.
#include "kvcheck/threads.h"

#include <sstream>

namespace kvcheck {
namespace {

constexpr const char* header_word = "threads";

void add_call(Trace& trace, std::int64_t& lane_now, std::int64_t lane, const Op& call) {
    if (lane != lane_now) trace.push_back(op::SwitchLane{lane});
    lane_now = lane;
    trace.push_back(call);
}

std::string choices_text(const std::vector<std::int64_t>& schedule) {
    std::string text;
    for (std::size_t i = 0; i < schedule.size(); ++i) text += (i == 0 ? "" : ",") + std::to_string(schedule[i]);
    return text;
}

// A whole number within [0, high], for the header's fields.
std::int64_t header_number(const std::string& text, std::int64_t high, const std::string& what) {
    const bool digits = !text.empty() && text.size() <= 18 && text.find_first_not_of("0123456789") == std::string::npos;
    const long long value = digits ? std::stoll(text) : -1;
    if (value < 0 || value > high) {
        throw TraceParseError("line 1: " + what + " must be a whole number from 0 to " + std::to_string(high) + ", not '" +
                              text.substr(0, 40) + "'");
    }
    return value;
}

}  // namespace

Trace ran_trace(const LanePlan& plan, const ThreadRunResult& result, std::size_t* failing_step) {
    Trace trace;
    std::int64_t lane_now = 0;
    std::vector<std::size_t> next(plan.lanes.size(), 0);
    for (std::size_t call = 0; call < result.returned.size(); ++call) {
        const auto lane = static_cast<std::size_t>(result.returned[call]);
        if (lane >= plan.lanes.size() || next[lane] >= plan.lanes[lane].size()) continue;  // not this plan's run
        add_call(trace, lane_now, result.returned[call], plan.lanes[lane][next[lane]++]);
        if (failing_step != nullptr && call == result.failing_call) *failing_step = trace.size() - 1;
    }
    for (std::size_t lane = 0; lane < plan.lanes.size(); ++lane) {
        while (next[lane] < plan.lanes[lane].size()) add_call(trace, lane_now, static_cast<std::int64_t>(lane), plan.lanes[lane][next[lane]++]);
    }
    return trace;
}

std::string thread_trace_text(const LanePlan& plan, const ThreadRunResult& result) {
    return std::string(header_word) + " lanes=" + std::to_string(plan.lanes.size()) + " schedule=" + choices_text(result.schedule) +
           "\n" + format_trace(ran_trace(plan, result));
}

std::optional<ThreadTrace> parse_thread_trace(const std::string& text) {
    // The header is the first line that is neither blank nor a comment.
    std::istringstream lines(text);
    std::string line;
    std::size_t header_end = 0;
    std::string header;
    while (std::getline(lines, line)) {
        header_end += line.size() + 1;
        const std::string code = line.substr(0, line.find('#'));
        if (code.find_first_not_of(" \t\r") == std::string::npos) continue;
        header = code;
        break;
    }
    std::istringstream words(header);
    std::string word;
    if (!(words >> word) || word != header_word) return std::nullopt;
    std::optional<std::int64_t> lanes;
    std::optional<std::vector<std::int64_t>> schedule;
    while (words >> word) {
        const std::size_t eq = word.find('=');
        const std::string key = word.substr(0, eq);
        const std::string value = eq == std::string::npos ? "" : word.substr(eq + 1);
        if (key == "lanes" && !lanes) {
            lanes = header_number(value, op::SwitchLane::lanes_max, "lanes");
        } else if (key == "schedule" && !schedule) {
            schedule.emplace();
            std::istringstream choices(value);
            std::string choice;
            while (std::getline(choices, choice, ',')) schedule->push_back(header_number(choice, op::SwitchLane::lanes_max - 1, "a schedule choice"));
        } else {
            throw TraceParseError("line 1: a thread-level trace's first line is 'threads lanes=N schedule=A,B,...', not '" +
                                  header.substr(0, 80) + "'");
        }
    }
    if (!lanes || !schedule || *lanes < 2) {
        throw TraceParseError("line 1: a thread-level trace's first line is 'threads lanes=N schedule=A,B,...' with N at least 2, not '" +
                              header.substr(0, 80) + "'");
    }
    const Trace trace = parse_trace(text.substr(std::min(header_end, text.size())));
    ThreadTrace found;
    found.plan.lanes.resize(static_cast<std::size_t>(*lanes));
    const std::vector<std::int64_t> lane_of = lanes_of(trace);
    for (std::size_t step = 0; step < trace.size(); ++step) {
        if (std::holds_alternative<op::SwitchLane>(trace[step])) continue;
        if (lane_of[step] >= *lanes) {
            throw TraceParseError("step " + std::to_string(step + 1) + " is a call of lane " + std::to_string(lane_of[step]) +
                                  ", and the trace has lanes=" + std::to_string(*lanes));
        }
        found.plan.lanes[static_cast<std::size_t>(lane_of[step])].push_back(trace[step]);
    }
    for (const std::int64_t choice : *schedule) {
        if (choice >= *lanes) {
            throw TraceParseError("line 1: the schedule names lane " + std::to_string(choice) + ", and the trace has lanes=" +
                                  std::to_string(*lanes));
        }
    }
    found.schedule = std::move(*schedule);
    return found;
}

}  // namespace kvcheck
