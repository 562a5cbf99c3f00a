// The lanes workload: client requests (docs/semantics.md#concurrent-clients)
// and the schedule that interleaves them (kvcheck/lanes.h).
#include "kvcheck/lanes.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <set>

namespace kvcheck {
namespace {

// Lane k names handles and sequences k * lane_names_stride + 1, 2, ...:
// no two lanes share one, as no two clients share a private object.
constexpr std::int64_t lane_names_stride = 100;
constexpr std::int64_t requests_per_lane_max = 3;
// The ids every store request names: few, so that lanes meet on them; at
// the thread level, one more for a store with a capacity, so that its
// adds evict.
const Ids& lane_ids(const WorkloadOptions& options) {
    static const Ids few = {"a", "b"};
    static const Ids evicting = {"a", "b", "c"};
    return options.threads && options.capabilities.policy.capacity_items > 0 ? evicting : few;
}

struct LaneDraft {
    std::int64_t lane = 0;
    std::int64_t next_name = 1;
    std::int64_t name() { return lane * lane_names_stride + next_name++; }
};

// ---- the contiguous store's requests ----

Tokens prompt_of(Chooser& choose, const WorkloadOptions& options) {
    Tokens prompt;
    const std::int64_t count = choose.between(1, options.prompt_tokens_max);
    for (std::int64_t i = 0; i < count; ++i) prompt.push_back(choose.between(1, 31));
    return prompt;
}

// A reader: a copy of an entry, a generation from it, its release.
void store_reader(Chooser& choose, const WorkloadOptions& options, LaneDraft& draft, Trace& calls) {
    const HandleName handle{draft.name()};
    const Ids& ids = lane_ids(options);
    calls.push_back(op::GetCache{handle, {ids[choose.below(ids.size())]}});
    calls.push_back(op::Generate{handle, prompt_of(choose, options), choose.between(1, options.new_tokens_max)});
    calls.push_back(op::Release{handle});
}

void store_request(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options, LaneDraft& draft, Trace& calls) {
    const Ids& ids = lane_ids(options);
    const std::string& id = ids[choose.below(ids.size())];
    // The thread level draws dumps too (one racing other clients' adds may tear).
    const bool dumps = options.threads && options.capabilities.dump;
    switch (choose.below(dumps ? 7 : 6)) {
        case 0: case 1: case 2: store_reader(choose, options, draft, calls); break;
        case 3: case 4:
            if (dumps && choose.one_in(2)) {
                // A client replacing entries that belong together, one
                // call each: a dump between its adds is torn if it takes
                // one entry before and the other after.
                for (const std::string& each : ids) calls.push_back(op::Add{each, random_cache_spec(choose, swarm, options), {}});
            } else {
                calls.push_back(op::Add{id, random_cache_spec(choose, swarm, options), {}});
            }
            break;
        case 5: calls.push_back(op::Delete{{id}}); break;
        default: calls.push_back(op::Dump{0}); break;
    }
}

// ---- the paged family's requests ----

// A request's tokens: one of the trace's prompts, now and then a token longer.
Tokens request_tokens(Chooser& choose, const std::vector<Tokens>& prompts) {
    Tokens tokens = prompts[choose.below(prompts.size())];
    if (choose.one_in(3)) tokens.push_back(choose.between(1, 3));
    return tokens;
}

// A scheduler's request: look its prefix up, then allocate it (pinning the
// hits), decode, and end it.
// With `fork` (the thread level), now and then a fork of it, freed first.
void paged_pin(Chooser& choose, const std::vector<Tokens>& prompts, bool fork, LaneDraft& draft, Trace& calls) {
    const Tokens tokens = request_tokens(choose, prompts);
    const std::int64_t seq = draft.name();
    calls.push_back(op::PagedLookup{tokens, 0});
    calls.push_back(op::PagedAlloc{seq, tokens, 0});
    if (choose.one_in(2)) calls.push_back(op::PagedAppend{seq, choose.between(1, 2)});
    if (fork && choose.one_in(2)) {
        const std::int64_t child = draft.name();
        calls.push_back(op::PagedFork{seq, child});
        calls.push_back(op::PagedFree{child});
    }
    calls.push_back(op::PagedFree{seq});
}

// Another request's churn: an evict, a worker step, or fresh tokens taking
// free blocks (cached ones among them).
void paged_churn(Chooser& choose, LaneDraft& draft, Trace& calls) {
    switch (choose.below(3)) {
        case 0: calls.push_back(op::PagedEvict{}); break;
        case 1: calls.push_back(op::PagedStep{}); break;
        default: {
            Tokens fresh;
            const std::int64_t length = choose.between(3, 6);
            for (std::int64_t i = 0; i < length; ++i) fresh.push_back(choose.between(4, 6));
            const std::int64_t seq = draft.name();
            calls.push_back(op::PagedAlloc{seq, std::move(fresh), 0});
            calls.push_back(op::PagedFree{seq});
        }
    }
}

std::vector<Tokens> paged_prompts(Chooser& choose) {
    std::vector<Tokens> prompts(2);
    for (Tokens& tokens : prompts) {
        const std::int64_t length = choose.between(3, 6);
        for (std::int64_t i = 0; i < length; ++i) tokens.push_back(choose.between(1, 3));
    }
    return prompts;
}

// ---- schedules ----

std::size_t pick_random(Chooser& choose, const std::vector<std::size_t>& left) {
    std::vector<std::size_t> ready;
    for (std::size_t lane = 0; lane < left.size(); ++lane) {
        if (left[lane] > 0) ready.push_back(lane);
    }
    return ready[choose.below(ready.size())];
}

}  // namespace

LanePlan draw_lanes(Chooser& choose, const WorkloadOptions& options) {
    const Capabilities& c = options.capabilities;
    const std::int64_t clients = std::clamp<std::int64_t>(options.lanes, 2, op::SwitchLane::lanes_max - 1);
    LanePlan plan;
    plan.kind = choose.one_in(2) ? ScheduleKind::random : ScheduleKind::pct;
    plan.depth = choose.between(1, 3);
    const bool paged = c.paged && (!c.store || choose.one_in(2));
    // Caches a read's generation can continue: no one-sided, legacy-named
    // or uninitialized layers (the model refuses those).
    Swarm swarm = random_swarm(choose, options);
    swarm.odd_layers = false;
    const std::vector<Tokens> prompts = paged ? paged_prompts(choose) : std::vector<Tokens>{};
    // Lane 0 runs alone first: what the requests meet (stored entries, a
    // cached prefix).
    plan.lanes.resize(static_cast<std::size_t>(clients) + 1);
    Trace& setup = plan.lanes[0];
    if (paged) {
        const std::int64_t seq = lane_names_stride - 1;
        setup = {op::PagedAlloc{seq, prompts[0], 0}, op::PagedStep{}, op::PagedFree{seq}};
    } else {
        for (const std::string& id : lane_ids(options)) setup.push_back(op::Add{id, random_cache_spec(choose, swarm, options), {}});
    }
    for (std::int64_t lane = 1; lane <= clients; ++lane) {
        LaneDraft draft{lane};
        Trace& calls = plan.lanes[static_cast<std::size_t>(lane)];
        const std::int64_t requests = choose.between(1, requests_per_lane_max);
        for (std::int64_t r = 0; r < requests; ++r) {
            if (!paged) {
                store_request(choose, swarm, options, draft, calls);
            } else if (choose.below(3) < 2) {
                paged_pin(choose, prompts, options.threads, draft, calls);
            } else {
                paged_churn(choose, draft, calls);
            }
        }
    }
    return plan;
}

Trace schedule_lanes(Chooser& choose, const LanePlan& plan) {
    Trace trace = plan.lanes.at(0);
    const std::size_t lanes = plan.lanes.size();
    std::vector<std::size_t> left(lanes, 0);
    std::vector<std::size_t> next(lanes, 0);
    std::size_t total = 0;
    for (std::size_t lane = 1; lane < lanes; ++lane) total += left[lane] = plan.lanes[lane].size();
    // pct: distinct priorities depth..depth+lanes-1 in a random order, and
    // depth - 1 change points among the steps; at change point j the
    // running lane drops to priority j (below every initial one).
    std::vector<std::int64_t> priority(lanes, 0);
    std::vector<std::size_t> change_at;
    if (plan.kind == ScheduleKind::pct) {
        std::vector<std::size_t> order(lanes - 1);
        std::iota(order.begin(), order.end(), std::size_t{1});
        for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[choose.below(i)]);
        for (std::size_t rank = 0; rank < order.size(); ++rank) {
            priority[order[rank]] = plan.depth + static_cast<std::int64_t>(rank);
        }
        for (std::int64_t j = 1; j < plan.depth && total > 1; ++j) {
            change_at.push_back(1 + static_cast<std::size_t>(choose.below(total - 1)));
        }
    }
    std::int64_t current = -1;
    for (std::size_t step = 0; step < total; ++step) {
        std::size_t lane = 0;
        if (plan.kind == ScheduleKind::random) {
            lane = pick_random(choose, left);
        } else {
            for (std::size_t candidate = 1; candidate < lanes; ++candidate) {
                if (left[candidate] > 0 && (lane == 0 || priority[candidate] > priority[lane])) lane = candidate;
            }
            for (std::size_t j = 0; j < change_at.size(); ++j) {
                if (change_at[j] != step) continue;
                priority[lane] = static_cast<std::int64_t>(j) + 1;
                std::size_t best = 0;
                for (std::size_t candidate = 1; candidate < lanes; ++candidate) {
                    if (left[candidate] > 0 && (best == 0 || priority[candidate] > priority[best])) best = candidate;
                }
                lane = best;
            }
        }
        if (static_cast<std::int64_t>(lane) != current) {
            trace.push_back(op::SwitchLane{static_cast<std::int64_t>(lane)});
            current = static_cast<std::int64_t>(lane);
        }
        trace.push_back(plan.lanes[lane][next[lane]++]);
        --left[lane];
    }
    return trace;
}

Trace concurrent_trace(Chooser& choose, const WorkloadOptions& options) {
    const LanePlan plan = draw_lanes(choose, options);
    return schedule_lanes(choose, plan);
}

std::vector<std::int64_t> lanes_of(const Trace& trace) {
    std::vector<std::int64_t> lanes;
    lanes.reserve(trace.size());
    std::int64_t lane = 0;
    for (const Op& step : trace) {
        if (const auto* to = std::get_if<op::SwitchLane>(&step)) lane = to->lane;
        lanes.push_back(lane);
    }
    return lanes;
}

std::size_t lane_count(const Trace& trace) {
    std::set<std::int64_t> calling;
    const std::vector<std::int64_t> lanes = lanes_of(trace);
    for (std::size_t i = 0; i < trace.size(); ++i) {
        if (lanes[i] > 0 && !std::holds_alternative<op::SwitchLane>(trace[i])) calling.insert(lanes[i]);
    }
    return std::max<std::size_t>(calling.size(), 1);
}


// ---- requests, conflicts and the side-by-side drawing ----

namespace {

// A lane's request in progress: what its next calls name.
struct OpenRequest {
    std::size_t first = 0;
    std::int64_t handle = 0;          // a read's
    std::int64_t seq = 0;             // a pin's or churn's sequence
    std::optional<Tokens> looked_up;  // a pin's tokens, before its alloc
};

// Whether `step` continues `open` (a call of the same lane), and whether it ends it.
std::pair<bool, bool> continues(const Op& step, const OpenRequest& open) {
    if (const auto* o = std::get_if<op::Generate>(&step)) return {open.handle != 0 && o->source.value == open.handle, false};
    if (const auto* o = std::get_if<op::Release>(&step)) return {open.handle != 0 && o->handle.value == open.handle, true};
    if (const auto* o = std::get_if<op::PagedAlloc>(&step)) {
        return {open.seq == 0 && open.looked_up && *open.looked_up == o->tokens, false};
    }
    if (const auto* o = std::get_if<op::PagedAppend>(&step)) return {open.seq != 0 && o->seq == open.seq, false};
    if (const auto* o = std::get_if<op::PagedFree>(&step)) return {open.seq != 0 && o->seq == open.seq, true};
    return {false, false};
}

// A request that `step` starts, and whether it is open after it.
std::pair<OpenRequest, bool> starts(const Op& step, std::size_t index) {
    OpenRequest request;
    request.first = index;
    if (const auto* o = std::get_if<op::GetCache>(&step)) request.handle = o->out.value;
    if (const auto* o = std::get_if<op::PagedLookup>(&step)) request.looked_up = o->tokens;
    if (const auto* o = std::get_if<op::PagedAlloc>(&step)) request.seq = o->seq;
    return {request, request.handle != 0 || request.looked_up || request.seq != 0};
}

std::string cut_to(const std::string& text, std::size_t width) {
    return text.size() <= width ? text : text.substr(0, width - 3) + "...";
}

}  // namespace

std::vector<RequestSpan> requests_of(const Trace& trace) {
    std::vector<RequestSpan> spans(trace.size());
    const std::vector<std::int64_t> lanes = lanes_of(trace);
    std::map<std::int64_t, OpenRequest> open;  // by lane
    std::map<std::size_t, std::vector<std::size_t>> members;  // by first call
    for (std::size_t i = 0; i < trace.size(); ++i) {
        if (std::holds_alternative<op::SwitchLane>(trace[i])) {
            spans[i] = {i, i};
            continue;
        }
        const auto lane_open = open.find(lanes[i]);
        if (lane_open != open.end()) {
            const auto [goes_on, ends] = continues(trace[i], lane_open->second);
            if (goes_on) {
                if (const auto* alloc = std::get_if<op::PagedAlloc>(&trace[i])) lane_open->second.seq = alloc->seq;
                members[lane_open->second.first].push_back(i);
                if (ends) open.erase(lane_open);
                continue;
            }
        }
        const auto [request, stays_open] = starts(trace[i], i);
        members[i].push_back(i);
        if (!stays_open) {
            open.erase(lanes[i]);
        } else {
            open[lanes[i]] = request;
        }
    }
    std::set<std::size_t> still_open;
    for (const auto& [lane, request] : open) still_open.insert(request.first);
    for (const auto& [first, calls] : members) {
        const std::size_t last = still_open.count(first) != 0 ? trace.size() : calls.back();
        for (const std::size_t call : calls) spans[call] = {first, last};
    }
    return spans;
}

std::vector<std::size_t> conflicting_steps(const Trace& trace, std::size_t step) {
    std::set<std::size_t> marked;
    if (step >= trace.size()) return {};
    const std::vector<RequestSpan> spans = requests_of(trace);
    const std::vector<std::int64_t> lanes = lanes_of(trace);
    marked.insert(step);
    for (std::size_t i = 0; i <= step; ++i) {
        const bool is_switch = std::holds_alternative<op::SwitchLane>(trace[i]);
        if (is_switch || spans[i].first != i || spans[i].last < step) continue;  // not a request open at the failure
        for (std::size_t j = i; j <= step; ++j) {
            if (std::holds_alternative<op::SwitchLane>(trace[j])) continue;
            if (spans[j].first == i || lanes[j] != lanes[i]) marked.insert(j);
        }
    }
    return {marked.begin(), marked.end()};
}

std::string swimlanes(const Trace& trace, std::size_t step, const std::string& property) {
    if (lane_count(trace) < 2) return "";
    constexpr std::size_t column_chars_max = 40;
    const std::vector<std::int64_t> lanes = lanes_of(trace);
    const std::vector<std::size_t> conflicts = conflicting_steps(trace, step);
    std::vector<std::int64_t> columns;  // the lanes that call, in order
    for (std::size_t i = 0; i < trace.size(); ++i) {
        if (std::holds_alternative<op::SwitchLane>(trace[i])) continue;
        if (std::find(columns.begin(), columns.end(), lanes[i]) == columns.end()) columns.push_back(lanes[i]);
    }
    std::sort(columns.begin(), columns.end());
    std::map<std::int64_t, std::size_t> width;
    for (const std::int64_t lane : columns) width[lane] = ("lane " + std::to_string(lane)).size();
    for (std::size_t i = 0; i < trace.size(); ++i) {
        if (std::holds_alternative<op::SwitchLane>(trace[i])) continue;
        width[lanes[i]] = std::max(width[lanes[i]], std::min(column_chars_max, format_op(trace[i]).size() + 2));
    }
    const auto row = [&](const std::string& first, const std::map<std::int64_t, std::string>& cells) {
        std::string line = "# " + std::string(first.size() < 5 ? 5 - first.size() : 0, ' ') + first;
        for (const std::int64_t lane : columns) {
            const auto cell = cells.find(lane);
            const std::string text = cell == cells.end() ? "" : cell->second;
            line += " | " + text + std::string(width[lane] - std::min(width[lane], text.size()), ' ');
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();
        return line + "\n";
    };
    std::map<std::int64_t, std::string> heads;
    for (const std::int64_t lane : columns) heads[lane] = "lane " + std::to_string(lane);
    std::string out = "# the lanes side by side, in schedule order (* a conflicting step: a call of a request still open at the "
                      "failure, or another lane's call inside one):\n";
    out += row("step", heads);
    for (std::size_t i = 0; i < trace.size(); ++i) {
        if (std::holds_alternative<op::SwitchLane>(trace[i])) continue;
        const bool conflict = std::binary_search(conflicts.begin(), conflicts.end(), i);
        const std::string text = (conflict ? "* " : "  ") + cut_to(format_op(trace[i]), column_chars_max - 2);
        std::string line = row(std::to_string(i + 1), {{lanes[i], text}});
        if (i == step) line.insert(line.size() - 1, "  <- " + property);
        out += line;
    }
    return out;
}

}  // namespace kvcheck
