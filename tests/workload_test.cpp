// The workload's scope (kvcheck/workload.h): the default scope reaches the
// size thresholds real code paths switch at (slots of 64 and 256 tokens and
// more, caches of up to 8 layers, other geometries) while most traces stay
// small, so that failures shrink in a few steps; each trace keeps one
// geometry; an engine without other geometries never gets one; the scope
// names parse. Floors, not exact figures: a generator that drifts away
// from what it must reach fails here. And the seeds traces are drawn from
// (kvcheck::trace_seed): runs of neighbouring seeds share no trace.
#include "kvcheck/properties.h"
#include "kvcheck/search.h"
#include "kvcheck/trace.h"
#include "kvcheck/workload.h"

#include <boost/pfr.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace {

using kvcheck::CacheSpec;
using kvcheck::Trace;
using kvcheck::WorkloadOptions;

std::vector<CacheSpec> specs_of(const Trace& trace) {
    std::vector<CacheSpec> specs;
    for (const kvcheck::Op& operation : trace) {
        std::visit(
            [&](const auto& o) {
                boost::pfr::for_each_field(o, [&](const auto& field) {
                    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, CacheSpec>) specs.push_back(field);
                });
            },
            operation);
    }
    return specs;
}

struct Shape {
    std::int64_t tokens_max = 0;  // the most tokens of a layer of any cache of the trace
    std::size_t layers_max = 0;
    bool other_geometry = false;
    bool one_geometry = true;
    bool any_spec = false;
};

Shape shape_of(const Trace& trace) {
    Shape shape;
    const std::vector<CacheSpec> specs = specs_of(trace);
    for (const CacheSpec& spec : specs) {
        shape.any_spec = true;
        shape.layers_max = std::max(shape.layers_max, spec.layers.size());
        for (const kvcheck::LayerSpec& layer : spec.layers) shape.tokens_max = std::max(shape.tokens_max, layer.tokens);
        shape.other_geometry = shape.other_geometry || spec.heads != kvcheck::cache_heads || spec.head_dim != kvcheck::cache_head_dim;
        shape.one_geometry = shape.one_geometry && spec.heads == specs.front().heads && spec.head_dim == specs.front().head_dim;
    }
    return shape;
}

struct Distribution {
    std::size_t traces = 0;
    std::size_t small = 0;  // every layer of every cache at most 5 tokens, 3 layers, 2x4
    std::size_t crossing_64 = 0;
    std::size_t crossing_256 = 0;
    std::size_t with_8_layers = 0;
    std::size_t other_geometry = 0;
    std::size_t mixed_geometry = 0;
};

Distribution distribution(const WorkloadOptions& options, std::uint64_t seeds) {
    Distribution d;
    for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
        const Shape shape = shape_of(kvcheck::trace_for_seed(seed, options));
        if (!shape.any_spec) continue;
        ++d.traces;
        d.small += shape.tokens_max <= 5 && shape.layers_max <= 3 && !shape.other_geometry;
        d.crossing_64 += shape.tokens_max >= 64;
        d.crossing_256 += shape.tokens_max >= 256;
        d.with_8_layers += shape.layers_max >= 8;
        d.other_geometry += shape.other_geometry;
        d.mixed_geometry += !shape.one_geometry;
    }
    return d;
}

double share(std::size_t count, std::size_t total) { return static_cast<double>(count) / static_cast<double>(total); }

TEST(Scope, TheDefaultReachesSizeThresholdsAndStaysMostlySmall) {
    const Distribution d = distribution(WorkloadOptions{}, 4000);
    std::cout << "[ scope    ] default, " << d.traces << " traces with caches: small " << share(d.small, d.traces)
              << ", a layer of >= 64 tokens " << share(d.crossing_64, d.traces) << ", >= 256 tokens "
              << share(d.crossing_256, d.traces) << ", 8 layers " << share(d.with_8_layers, d.traces)
              << ", another geometry " << share(d.other_geometry, d.traces) << "\n";
    EXPECT_EQ(d.mixed_geometry, 0u) << "a trace has one geometry";
    EXPECT_GT(share(d.small, d.traces), 0.5);
    EXPECT_GT(share(d.crossing_64, d.traces), 0.18);
    EXPECT_GT(share(d.crossing_256, d.traces), 0.04);
    EXPECT_GT(share(d.with_8_layers, d.traces), 0.04);
    EXPECT_GT(share(d.other_geometry, d.traces), 0.15);
}

TEST(Scope, SmallIsTheFirstVersionsWorkloadAndLargeGoesFurther) {
    WorkloadOptions small;
    small.scope = kvcheck::scope_named("small");
    const Distribution s = distribution(small, 1000);
    EXPECT_EQ(s.small, s.traces);
    WorkloadOptions large;
    large.scope = kvcheck::scope_named("large");
    const Distribution l = distribution(large, 1000);
    EXPECT_EQ(l.mixed_geometry, 0u);
    EXPECT_GT(share(l.crossing_256, l.traces), 0.1);
    EXPECT_THROW(kvcheck::scope_named("huge"), std::invalid_argument);
    EXPECT_STREQ(kvcheck::scope_named("default").name, "default");
}

TEST(Scope, AnEngineWithoutOtherGeometriesGetsNone) {
    WorkloadOptions options;
    options.capabilities.any_geometry = false;
    const Distribution d = distribution(options, 2000);
    EXPECT_EQ(d.other_geometry, 0u);
    EXPECT_GT(share(d.crossing_64, d.traces), 0.12) << "it still gets long caches";
}

TEST(Scope, SlotsStayWithinTheirValueBudget) {
    const WorkloadOptions options;
    for (std::uint64_t seed = 1; seed <= 2000; ++seed) {
        for (const CacheSpec& spec : specs_of(kvcheck::trace_for_seed(seed, options))) {
            for (const kvcheck::LayerSpec& layer : spec.layers) {
                ASSERT_LE(spec.heads * spec.head_dim * layer.tokens, options.scope.slot_values_max)
                    << "seed " << seed << ": " << kvcheck::format_cache_spec(spec);
            }
        }
    }
}

// ---- trace seeds -------------------------------------------------------------

// Runs seeded S and S + 1 share no trace (issue 27): before, trace i of
// property p was seed + p * 2^32 + i, so the two runs shared all but one
// trace of each property. Nor do two properties of one run.
TEST(Seeds, RunsOfNeighbouringSeedsShareNoTrace) {
    constexpr std::uint64_t seed = 20261202;  // kvcheck run's default
    constexpr std::uint64_t traces_per_property = 5000;
    for (const std::uint64_t other : {seed + 1, seed - 1, seed + (std::uint64_t{1} << 32)}) {
        std::set<std::uint64_t> these, those;
        for (std::uint64_t p = 0; p < kvcheck::property_count; ++p) {
            for (std::uint64_t i = 0; i < traces_per_property; ++i) {
                these.insert(kvcheck::trace_seed(seed, p, i));
                those.insert(kvcheck::trace_seed(other, p, i));
            }
        }
        EXPECT_EQ(these.size(), kvcheck::property_count * traces_per_property) << "two properties of one run share a trace";
        std::vector<std::uint64_t> shared;
        std::set_intersection(these.begin(), these.end(), those.begin(), those.end(), std::back_inserter(shared));
        EXPECT_TRUE(shared.empty()) << shared.size() << " traces of seed " << seed << " are traces of seed " << other;
    }
}

// The traces a search runs, recorded instead of run.
std::vector<std::string> searched(const kvcheck::Budget& budget) {
    std::vector<std::string> traces;
    kvcheck::Runner runner;
    runner.check = [&traces](const Trace& trace, const kvcheck::RunOptions&) {
        traces.push_back(kvcheck::format_trace(trace));
        return kvcheck::RunResult{};
    };
    kvcheck::search(runner, budget, WorkloadOptions{});
    return traces;
}

// A search (kvcheck run's, resumed past a finding at first_index; the
// property suites') runs the traces of trace_seed: the same ones for the
// same seed, others for the next seed.
TEST(Seeds, ASearchRunsTheTracesOfItsSeeds) {
    const std::vector<std::string> traces = searched({7, 3, 10, 40, 0});
    ASSERT_EQ(traces.size(), 40u);
    for (std::size_t i = 0; i < traces.size(); ++i) {
        EXPECT_EQ(traces[i], kvcheck::format_trace(kvcheck::trace_for_seed(kvcheck::trace_seed(7, 3, 10 + i), WorkloadOptions{})));
    }
    EXPECT_EQ(searched({7, 3, 10, 40, 0}), traces);
    const std::vector<std::string> next = searched({8, 3, 10, 40, 0});
    const std::set<std::string> seen(traces.begin(), traces.end());
    const std::size_t shared = static_cast<std::size_t>(
        std::count_if(next.begin(), next.end(), [&seen](const std::string& trace) { return seen.count(trace) != 0; }));
    EXPECT_EQ(shared, 0u);
}

}  // namespace
