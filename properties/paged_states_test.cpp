// Pool states no sound pool holds (issue 43, item 2): the paged checkers
// read each state an engine reports within that state's own bounds. Each
// way of bending a state (fuzz/bent_pool.h) on paged traces of a few seeds:
// under ASan and UBSan (the asan preset) a read outside a state stops the
// test; in any build, a state that lost or gained blocks is not taken for
// a sound one. The fuzz target fuzz_paged_states explores the same from
// fuzzed bytes.
#include "bent_pool.h"
#include "kvcheck/executor.h"
#include "kvcheck/workload.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace {

using namespace kvcheck;

TEST(PagedStates, EveryBentStateIsReadWithinItsBounds) {
    for (int way = 0; way < fuzz::BentPool::ways; ++way) {
        // The first state of each step as it is, the next bent: the checks
        // compare a sound before with a bent after, and the other way round.
        const std::vector<std::uint8_t> plan{0, static_cast<std::uint8_t>(way)};
        std::size_t failed = 0;
        for (std::uint64_t seed = 1; seed <= 12; ++seed) {
            auto engine = std::make_shared<fuzz::BentPool>(plan);
            WorkloadOptions options;
            options.capabilities = engine->capabilities();
            options.dump_kill = false;
            SeededChooser choose(seed);
            const Swarm swarm = random_swarm(choose, options);
            const Trace trace = generate_trace(choose, swarm, options);
            RunOptions run;
            run.fresh_engine = [plan] { return std::make_shared<fuzz::BentPool>(plan); };
            failed += execute(trace, *engine, run).failure ? 1 : 0;
        }
        if (way == 0) {
            EXPECT_EQ(failed, 0u) << "the paged reference, its states unbent, failed";
        } else if (way <= 3) {
            EXPECT_GT(failed, 0u) << "a pool that changed size (way " << way << ") passed every trace";
        }
    }
}

}  // namespace
