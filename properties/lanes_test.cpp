// Concurrent clients at the operation level (kvcheck/lanes.h,
// docs/semantics.md#concurrent-clients): lanes traces are seeded and replay
// from their text; one client's traces are unchanged; each concurrency
// mutant is found with lanes, under a property it breaks, shrunk to at most
// 3 lanes, and the sequential search of the same budget does not find it;
// the references pass the lanes search.
#include "run_util.h"

#include "kvcheck/lanes.h"
#include "search/shrink_lanes.h"

#include <gtest/gtest.h>

#include <iostream>
#include <set>

namespace kvcheck::props {
namespace {

constexpr std::size_t traces_max = 300;  // per search: the lanes find LM1 in a few dozen
constexpr std::uint64_t first_seed = 1;

WorkloadOptions lanes_options(const Adapter& adapter, std::int64_t lanes) {
    WorkloadOptions options;
    options.capabilities = adapter.make()->capabilities();
    options.lanes = lanes;
    return options;
}

std::size_t switches_in(const Trace& trace) {
    return static_cast<std::size_t>(std::count_if(trace.begin(), trace.end(), [](const Op& step) {
        return std::holds_alternative<op::SwitchLane>(step);
    }));
}

TEST(Lanes, OneClientDrawsTheSequentialTraces) {
    const Adapter* adapter = adapters::find_bundled("paged-reference");
    ASSERT_NE(adapter, nullptr);
    WorkloadOptions one = lanes_options(*adapter, 1);
    for (std::uint64_t seed = 1; seed <= 200; ++seed) {
        const Trace trace = trace_for_seed(seed, one);
        EXPECT_EQ(switches_in(trace), 0u) << format_trace(trace);
        EXPECT_EQ(lane_count(trace), 1u);
    }
}

TEST(Lanes, TracesAreSeededAndReplayFromText) {
    for (const char* name : {"reference", "paged-reference"}) {
        const Adapter* adapter = adapters::find_bundled(name);
        ASSERT_NE(adapter, nullptr);
        const WorkloadOptions options = lanes_options(*adapter, 3);
        for (std::uint64_t seed = 1; seed <= 50; ++seed) {
            const Trace trace = trace_for_seed(seed, options);
            EXPECT_EQ(trace, trace_for_seed(seed, options));
            EXPECT_EQ(parse_trace(format_trace(trace)), trace);
            EXPECT_GE(switches_in(trace), 1u) << format_trace(trace);
            EXPECT_LE(lane_count(trace), 3u);
            // Each lane's calls name handles and sequences of its own.
            const std::vector<std::int64_t> lanes = lanes_of(trace);
            for (std::size_t i = 0; i < trace.size(); ++i) {
                if (lanes[i] == 0) continue;
                const std::int64_t made = created_handle(trace[i]);
                if (made != 0) {
                    EXPECT_EQ(made / 100, lanes[i]) << format_trace(trace);
                }
                if (const auto* alloc = std::get_if<op::PagedAlloc>(&trace[i])) {
                    EXPECT_EQ(alloc->seq / 100, lanes[i]) << format_trace(trace);
                }
            }
        }
    }
}

// The shrinker's lane moves: a lane dropped whole, runs swapped only where
// that joins runs of one lane, and no cut that moves a call to another lane.
TEST(Lanes, ShrinkingDropsLanesAndSwitchesButNeverMovesACall) {
    const Op a1 = op::PagedStep{}, b1 = op::PagedEvict{}, a2 = op::GetAll{}, c1 = op::DeleteAll{};
    const Trace trace = {op::SwitchLane{1}, a1, op::SwitchLane{2}, b1, op::SwitchLane{1}, a2, op::SwitchLane{3}, c1};
    EXPECT_TRUE(shrink_lanes::relabels(trace, 2, 3));   // b1 would join lane 1
    EXPECT_FALSE(shrink_lanes::relabels(trace, 2, 4));  // lane 2's switch and its call: none moves
    EXPECT_FALSE(shrink_lanes::relabels(trace, 1, 2));  // a call alone
    const std::vector<Trace> fewer = shrink_lanes::fewer_lanes(trace);
    ASSERT_EQ(fewer.size(), 3u);
    EXPECT_EQ(fewer[0], (Trace{op::SwitchLane{1}, a1, op::SwitchLane{2}, b1, op::SwitchLane{1}, a2}));
    EXPECT_EQ(fewer[1], (Trace{op::SwitchLane{1}, a1, a2, op::SwitchLane{3}, c1}));
    EXPECT_EQ(fewer[2], (Trace{op::SwitchLane{2}, b1, op::SwitchLane{3}, c1}));
    const std::vector<Trace> joined = shrink_lanes::fewer_switches(trace);
    ASSERT_EQ(joined.size(), 2u);  // b1 after a2, or a1 after b1: lane 1 in one run either way
    EXPECT_EQ(joined[0], (Trace{op::SwitchLane{2}, b1, op::SwitchLane{1}, a1, a2, op::SwitchLane{3}, c1}));
    EXPECT_EQ(joined[1], (Trace{op::SwitchLane{1}, a1, a2, op::SwitchLane{2}, b1, op::SwitchLane{3}, c1}));
    for (const Trace& candidate : joined) EXPECT_EQ(lane_count(candidate), 3u);
    EXPECT_TRUE(shrink_lanes::fewer_lanes(Trace{a1, b1}).empty());  // one client: nothing to do
    EXPECT_TRUE(shrink_lanes::fewer_switches(Trace{a1, b1}).empty());
}

// A failure's requests and conflicting steps, and the lanes side by side:
// the calls of the request open at the failure and the other lanes' calls
// inside it are marked, the finished requests before it are not.
TEST(Lanes, AFailureMarksTheOpenRequestsAndTheCallsInsideThem) {
    const Trace trace = parse_trace(
        "add a modern/f32/3:[kv2]\n"  // 0: lane 0 sets up
        "add b modern/f32/3:[kv1]\n"
        "switch lane=1\n"
        "h101 = get_cache a\n"       // 3: a read starts
        "switch lane=2\n"
        "add a modern/f32/3:[kv1]\n"  // 5: inside it
        "switch lane=1\n"
        "generate h101 prompt=5 max=2\n"  // 7: the failure
        "release h101\n");
    const std::vector<RequestSpan> spans = requests_of(trace);
    EXPECT_EQ(spans[3].first, 3u);
    EXPECT_EQ(spans[3].last, 8u);
    EXPECT_EQ(spans[7].first, 3u);
    EXPECT_EQ(spans[5].first, 5u);
    EXPECT_EQ(spans[5].last, 5u);
    EXPECT_EQ(conflicting_steps(trace, 7), (std::vector<std::size_t>{3, 5, 7}));
    EXPECT_EQ(conflicting_steps(trace, 5), (std::vector<std::size_t>{3, 5}));  // the read is open at the add
    const std::string drawn = swimlanes(trace, 7, "generation-equivalent");
    EXPECT_NE(drawn.find("| * h101 = get_cache a"), std::string::npos) << drawn;
    EXPECT_NE(drawn.find("| * add a modern/f32/3:[kv1]"), std::string::npos) << drawn;
    const std::size_t failing = drawn.find("* generate h101 prompt=5 max=2");
    ASSERT_NE(failing, std::string::npos) << drawn;
    EXPECT_EQ(drawn.substr(failing, drawn.find('\n', failing) - failing).rfind("<- generation-equivalent"),
              drawn.find('\n', failing) - failing - std::string("<- generation-equivalent").size())
        << drawn;  // the failing call's line ends with its property
    EXPECT_NE(drawn.find("|   add a modern/f32/3:[kv2]"), std::string::npos) << drawn;  // lane 0's, finished: not marked
    EXPECT_NE(drawn.find("|   release h101"), std::string::npos) << drawn;                // after the failure
    // Comments only: a failure pasted into a trace file still parses as the trace.
    EXPECT_EQ(parse_trace(format_trace(trace) + drawn), trace);
    // A pin: the lookup and its alloc are one request, another lane's evict inside it.
    const Trace pin = parse_trace(
        "switch lane=1\npaged_lookup tokens=1,2,3,1,2 salt=0\nswitch lane=2\npaged_evict\nswitch lane=1\n"
        "paged_alloc seq=101 tokens=1,2,3,1,2 salt=0\npaged_free seq=101\n");
    EXPECT_EQ(conflicting_steps(pin, 5), (std::vector<std::size_t>{1, 3, 5}));
    EXPECT_EQ(swimlanes(Trace{op::PagedStep{}, op::PagedEvict{}}, 1, "x"), "");  // one lane: nothing drawn
}

TEST(Lanes, ReferencesPassTheLanesSearch) {
    for (const char* name : {"reference", "paged-reference"}) {
        const Adapter* adapter = adapters::find_bundled(name);
        ASSERT_NE(adapter, nullptr);
        const std::optional<Finding> finding = find_and_shrink(*adapter, first_seed, traces_max, lanes_options(*adapter, 3));
        EXPECT_FALSE(finding) << format_failure(finding->shrunk.failure, finding->shrunk.trace,
                                                reproduce_command(*adapter, finding->shrunk.trace));
    }
}

std::vector<std::string> lane_mutant_names() {
    std::vector<std::string> names;
    for (const auto& adapter : adapters::bundled()) {
        if (adapter.lanes > 1) names.push_back(adapter.name);
    }
    return names;
}

class LaneMutant : public ::testing::TestWithParam<std::string> {};

// Found with 6 lanes under a property it breaks, shrunk to at most 3 lanes,
// replayed from text; the sequential search of the same budget and seeds
// (the same engine, one client) does not find it.
TEST_P(LaneMutant, IsFoundWithLanesAndNotByOneClient) {
    const Adapter* adapter = adapters::find_bundled(GetParam());
    ASSERT_NE(adapter, nullptr);
    // 6 clients: the shrinker takes it down to the few the bug needs.
    const std::optional<Finding> finding = find_and_shrink(*adapter, first_seed, traces_max, lanes_options(*adapter, 6));
    ASSERT_TRUE(finding) << adapter->name << " survived " << traces_max << " lanes traces";
    const ShrinkResult& shrunk = finding->shrunk;
    const std::optional<Property> reported = parse_property(shrunk.failure.property);
    const auto& breaks = adapter->breaks;
    EXPECT_TRUE(reported && std::find(breaks.begin(), breaks.end(), *reported) != breaks.end())
        << adapter->name << " was reported under " << shrunk.failure.property << ":\n"
        << format_failure(shrunk.failure, shrunk.trace, reproduce_command(*adapter, shrunk.trace));
    EXPECT_LE(lane_count(shrunk.trace), 3u) << format_trace(shrunk.trace);
    const RunResult again = run_on(*adapter, parse_trace(format_trace(shrunk.trace)));
    ASSERT_TRUE(again.failure);
    EXPECT_EQ(again.failure->property, shrunk.failure.property);
    EXPECT_EQ(again.failure->step, shrunk.failure.step);
    // The conflict drawn spans two lanes at least: the race, not one client's calls.
    const std::vector<std::int64_t> lanes = lanes_of(shrunk.trace);
    std::set<std::int64_t> conflicting_lanes;
    for (const std::size_t step : conflicting_steps(shrunk.trace, shrunk.failure.step)) conflicting_lanes.insert(lanes[step]);
    EXPECT_GE(conflicting_lanes.size(), 2u) << swimlanes(shrunk.trace, shrunk.failure.step, shrunk.failure.property);
    std::cout << "[ lanes    ] " << adapter->name << ": " << shrunk.failure.property << " after " << finding->traces_tried
              << " traces (seed " << finding->seed << "), shrunk " << finding->found.size() << " -> "
              << shrunk.trace.size() << " ops, " << lane_count(shrunk.trace) << " lanes, " << switches_in(shrunk.trace)
              << " switches\n"
              << format_trace(shrunk.trace) << swimlanes(shrunk.trace, shrunk.failure.step, shrunk.failure.property);

    // One client: the pool mutants (LM1, LM3: a lookup's answer or loaded
    // counts used by the alloc of the same request) are not found in the
    // budget. The store mutants (LM2, LM4: a copy tied to its entry until
    // first used) are reachable by one client's own calls as well (get_cache,
    // then an overwrite or a delete and add of its entry, then the
    // generation: docs/semantics.md#concurrent-clients), and since the batch
    // draws joined the reference's traces one client finds them in a few
    // dozen traces: for them the lanes must find it no later.
    const std::optional<Finding> alone = find_and_shrink(*adapter, first_seed, traces_max, lanes_options(*adapter, 1));
    std::cout << "[ lanes    ] " << adapter->name << " with one client: "
              << (alone ? "found after " + std::to_string(alone->traces_tried) + " traces" : std::string("not found"))
              << " in " << traces_max << "\n";
    const bool one_client_reaches = adapter->name == "LM2" || adapter->name == "LM4";
    EXPECT_TRUE(!alone || (one_client_reaches && alone->traces_tried >= finding->traces_tried))
        << adapter->name << " was found by one client after " << (alone ? alone->traces_tried : 0) << " traces, with lanes after "
        << finding->traces_tried << ":\n"
        << (alone ? format_failure(alone->shrunk.failure, alone->shrunk.trace, reproduce_command(*adapter, alone->shrunk.trace))
                  : std::string());
}

// Each property it is listed under catches it alone, with lanes.
TEST_P(LaneMutant, BreaksEachListedPropertyOnItsOwn) {
    const Adapter* adapter = adapters::find_bundled(GetParam());
    ASSERT_NE(adapter, nullptr);
    for (const Property property : adapter->breaks) {
        const std::optional<Finding> finding =
            find_and_shrink(*adapter, first_seed, traces_max, lanes_options(*adapter, 3), PropertySet::only(property));
        ASSERT_TRUE(finding) << adapter->name << " never breaks " << property_id(property) << " alone";
        EXPECT_EQ(finding->shrunk.failure.property, property_id(property))
            << format_failure(finding->shrunk.failure, finding->shrunk.trace, reproduce_command(*adapter, finding->shrunk.trace));
        EXPECT_LE(lane_count(finding->shrunk.trace), 3u) << format_trace(finding->shrunk.trace);
        std::cout << "[ alone    ] " << adapter->name << " / " << property_id(property) << ": "
                  << finding->shrunk.trace.size() << " ops after " << finding->traces_tried << " traces\n";
    }
}

INSTANTIATE_TEST_SUITE_P(Bundled, LaneMutant, ::testing::ValuesIn(lane_mutant_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvcheck::props
