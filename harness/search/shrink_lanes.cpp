#include "search/shrink_lanes.h"

#include "kvcheck/lanes.h"

#include <algorithm>
#include <set>
#include <utility>

namespace kvcheck::shrink_lanes {
namespace {

// A lane's run of calls: the calls from one switch to the next (the first
// run, lane 0, has no switch before it).
struct Run {
    std::int64_t lane = 0;
    Trace calls;
};

std::vector<Run> runs_of(const Trace& trace) {
    std::vector<Run> runs(1);
    for (const Op& step : trace) {
        if (const auto* to = std::get_if<op::SwitchLane>(&step)) {
            runs.push_back({to->lane, {}});
        } else {
            runs.back().calls.push_back(step);
        }
    }
    return runs;
}

// The runs as a trace: empty runs dropped, neighbouring runs of one lane
// joined (their switch is no switch).
Trace trace_of(const std::vector<Run>& runs) {
    Trace trace;
    std::int64_t lane = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
        if (runs[i].calls.empty()) continue;
        if (runs[i].lane != lane) {
            trace.push_back(op::SwitchLane{runs[i].lane});
            lane = runs[i].lane;
        }
        trace.insert(trace.end(), runs[i].calls.begin(), runs[i].calls.end());
    }
    return trace;
}

std::size_t switches(const Trace& trace) {
    return static_cast<std::size_t>(std::count_if(trace.begin(), trace.end(), [](const Op& step) {
        return std::holds_alternative<op::SwitchLane>(step);
    }));
}

}  // namespace

bool relabels(const Trace& trace, std::size_t start, std::size_t end) {
    if (end >= trace.size() || std::holds_alternative<op::SwitchLane>(trace[end])) return false;
    const std::vector<std::int64_t> lanes = lanes_of(trace);
    const std::int64_t after = start > 0 ? lanes[start - 1] : 0;
    return lanes[end] != after;
}

std::vector<Trace> fewer_lanes(const Trace& trace) {
    std::vector<Trace> fewer;
    const std::vector<Run> runs = runs_of(trace);
    std::set<std::int64_t> lanes;
    for (const Run& run : runs) {
        if (!run.calls.empty()) lanes.insert(run.lane);
    }
    if (lanes.size() < 2) return fewer;
    for (auto lane = lanes.rbegin(); lane != lanes.rend(); ++lane) {
        std::vector<Run> kept;
        for (const Run& run : runs) {
            if (run.lane != *lane) kept.push_back(run);
        }
        fewer.push_back(trace_of(kept));
    }
    return fewer;
}

std::vector<Trace> fewer_switches(const Trace& trace) {
    std::vector<Trace> fewer;
    const std::vector<Run> runs = runs_of(trace);
    const std::size_t now = switches(trace);
    for (std::size_t i = 1; i + 1 < runs.size(); ++i) {
        if (runs[i].lane == runs[i + 1].lane) continue;
        std::vector<Run> swapped = runs;
        std::swap(swapped[i], swapped[i + 1]);
        Trace candidate = trace_of(swapped);
        if (switches(candidate) < now) fewer.push_back(std::move(candidate));
    }
    return fewer;
}

}  // namespace kvcheck::shrink_lanes
