// The stateful property: random traces (swarm testing, both layouts, all
// dtypes, odd layers, repeated and missing ids) through the reference, every
// property checked after every step. The run must also cover every
// operation kind and both layouts, or the generator is broken.
#include "run_util.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <iostream>

namespace kvcheck::props {
namespace {

const Adapter& reference() { return *adapters::find_bundled("reference"); }

TEST(Stateful, ReferenceKeepsEveryPropertyAfterEveryStep) {
    Coverage total;
    std::size_t cases = 0;
    const bool ok = rc::check("every property holds after every step of a random trace", [&] {
        const auto seed = *rc::gen::noShrink(rc::gen::arbitrary<std::uint64_t>());
        const int size = *rc::gen::withSize([](int s) { return rc::gen::just(s); });
        WorkloadOptions options;
        options.trace_ops_max = 4 + static_cast<std::size_t>(size) / 3;
        options.capabilities.returned_caches = true;  // the reference's: turn and extract are drawn
        options.capabilities.trim = true;             // and trim
        options.capabilities.batch = true;            // and batch
        const Trace trace = trace_for_seed(seed, options);
        const RunResult result = run_on(reference(), trace);
        ++cases;
        for (std::size_t k = 0; k < op_kind_count; ++k) total.ops_run[k] += result.coverage.ops_run[k];
        total.ops_skipped += result.coverage.ops_skipped;
        total.modern_caches += result.coverage.modern_caches;
        total.legacy_caches += result.coverage.legacy_caches;
        total.merges += result.coverage.merges;
        total.generations_owned += result.coverage.generations_owned;
        RC_CLASSIFY(result.coverage.legacy_caches > 0, "legacy caches");
        RC_CLASSIFY(result.coverage.merges > 0, "merges");
        RC_CLASSIFY(result.coverage.generations_owned > 0, "generation on an owned copy");
        if (result.failure) {
            const Oracle oracle = [](const Trace& t) { return run_on(reference(), t).failure; };
            const ShrinkResult shrunk = shrink(trace, *result.failure, oracle);
            RC_FAIL(format_failure(shrunk.failure, shrunk.trace, reproduce_command(reference(), shrunk.trace)));
        }
    });
    EXPECT_TRUE(ok);
    // Distribution: a generator that stops producing a kind, or one layout,
    // makes every property above vacuous for it.
    // (The paged family's kinds are PagedStateful's: the reference is no paged engine.)
    for (std::size_t k = 0; k < op_kind_count; ++k) {
        if ((op_needs(k) & needs_paged) != 0) continue;
        if (k == op_kind<op::SwitchLane>()) continue;  // one client's traces have none (properties/lanes_test.cpp)
        // The clock and leases: drawn for an engine with leases only
        // (reference-leases: ReferenceLeases.PassesATenthOfTheBudget).
        if ((op_needs(k) & needs_leases) != 0) continue;
        EXPECT_GT(total.ops_run[k], 0u) << op_kind_name(k) << " never ran in " << cases << " cases";
    }
    EXPECT_GT(total.modern_caches, 0u);
    EXPECT_GT(total.legacy_caches, 0u);
    EXPECT_GT(total.merges, 0u);
    EXPECT_GT(total.generations_owned, 0u);
    std::uint64_t run = 0;
    for (auto count : total.ops_run) run += count;
    const double skipped = static_cast<double>(total.ops_skipped) / static_cast<double>(run + total.ops_skipped);
    EXPECT_LT(skipped, 0.3) << "most generated operations should apply; " << total.ops_skipped << " of "
                            << run + total.ops_skipped << " were skipped";
    std::cout << "[ coverage ] " << cases << " cases, " << run << " operations run, " << total.ops_skipped
              << " skipped; per kind:";
    for (std::size_t k = 0; k < op_kind_count; ++k) std::cout << " " << op_kind_name(k) << "=" << total.ops_run[k];
    std::cout << "\n";
}

// Merges of caches of different dtypes: the default workload makes them in
// a few traces in a hundred, and the reference promotes every one (it
// never refuses).
TEST(Stateful, MergesOfMixedDtypesOccurAndTheReferencePromotesThem) {
    Coverage total;
    constexpr std::uint64_t seeds = 1000;
    std::size_t traces_mixing = 0;
    for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
        const RunResult result = run_on(reference(), trace_for_seed(seed, WorkloadOptions{}));
        ASSERT_FALSE(result.failure) << "seed " << seed << ": " << result.failure->message;
        total.merges += result.coverage.merges;
        total.mixed_merges += result.coverage.mixed_merges;
        total.refused_merges += result.coverage.refused_merges;
        traces_mixing += result.coverage.mixed_merges > 0 ? 1 : 0;
    }
    std::cout << "[ coverage ] " << seeds << " traces: " << total.merges << " merges, " << total.mixed_merges
              << " of mixed dtypes (in " << traces_mixing << " traces), " << total.refused_merges << " refused\n";
    EXPECT_GE(traces_mixing, seeds / 100);
    EXPECT_EQ(total.refused_merges, 0u);
}

// The paged reference, over seeded traces of a paged engine: every
// property holds after every step, and every paged kind runs.
TEST(PagedStateful, PagedReferenceKeepsEveryPropertyAndRunsEveryPagedKind) {
    const Adapter& paged = *adapters::find_bundled("paged-reference");
    WorkloadOptions options;
    options.capabilities = paged.make()->capabilities();
    Coverage total;
    for (std::uint64_t seed = 1; seed <= 200; ++seed) {
        const Trace trace = trace_for_seed(seed, options);
        const RunResult result = run_on(paged, trace);
        ASSERT_FALSE(result.failure) << "seed " << seed << ":\n"
                                     << format_failure(*result.failure, trace, reproduce_command(paged, trace));
        for (std::size_t k = 0; k < op_kind_count; ++k) total.ops_run[k] += result.coverage.ops_run[k];
    }
    for (std::size_t k = 0; k < op_kind_count; ++k) {
        if ((op_needs(k) & needs_paged) == 0) continue;
        EXPECT_GT(total.ops_run[k], 0u) << op_kind_name(k) << " never ran in 200 traces";
    }
}

}  // namespace
}  // namespace kvcheck::props
