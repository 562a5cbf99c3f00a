// The paged reference reads a block's K/V digest from the pool's rows
// (PagedReference::paged_state, issue 39 item 2: the pool is read around
// every paged operation, and a tensor per block was nearly all of a checked
// operation's time). That fast reading must report exactly what the slow
// one (through a tensor per block, Pool::block_kv, as a subclass is always
// read) does: the same pool states after every operation, and the same
// verdicts, over the same seeded traces, on pools of several shapes, and
// with a block's K/V changed under the pool where published-immutable must
// FAIL the same way read either way.
#include "run_util.h"

#include "kvcheck/executor.h"
#include "kvcheck/workload.h"
#include "reference/paged_reference.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvcheck::props {
namespace {

using adapters::PagedReference;

// The paged reference whose every reading is made both ways and compared;
// what it reports is the fast reading.
class BothReadings final : public PagedReference {
  public:
    explicit BothReadings(kv::paged::PoolConfig config) : PagedReference(nullptr, config) {}

    PagedState paged_state() override {
        read_rows(false);
        const PagedState slow = PagedReference::paged_state();
        read_rows(true);
        PagedState fast = PagedReference::paged_state();
        ++readings;
        for (const PagedBlock& block : fast.blocks) blocks_with_kv += block.tokens.empty() ? 0 : 1;
        if (!(fast == slow) && difference.empty()) difference = first_difference(slow, fast);
        return fast;
    }

    std::size_t readings = 0;
    std::size_t blocks_with_kv = 0;
    std::string difference;  // the first reading that differed, in words

  private:
    static std::string first_difference(const PagedState& slow, const PagedState& fast) {
        for (std::size_t b = 0; b < slow.blocks.size() && b < fast.blocks.size(); ++b) {
            if (!(slow.blocks[b] == fast.blocks[b])) {
                return "block " + std::to_string(b) + ": digest " + std::to_string(slow.blocks[b].digest) + " through block_kv, " +
                       std::to_string(fast.blocks[b].digest) + " from the rows";
            }
        }
        return "the pool's lists differ";
    }
};

// After each step, the written keys of the first published block are
// changed under the pool (a bug no pool seam makes: the rows written
// directly), once.
class ChangesAPublishedBlock final : public PagedReference {
  public:
    ChangesAPublishedBlock(kv::paged::PoolConfig config, bool rows) : PagedReference(nullptr, config) { read_rows(rows); }

    void paged_step() override {
        PagedReference::paged_step();
        if (changed_) return;
        const auto& blocks = pool().blocks();
        for (std::size_t b = 1; b < blocks.size(); ++b) {
            if (!blocks[b].key || blocks[b].written < 1) continue;
            pool().written_keys()[0][static_cast<std::int64_t>(b)].add_(1.0);
            changed_ = true;
            return;
        }
    }

  private:
    bool changed_ = false;
};

struct Shape {
    const char* name;
    kv::paged::PoolConfig config;
};

std::vector<Shape> shapes() {
    kv::paged::PoolConfig lifo = PagedReference::default_config();
    lifo.free_to_front = true;
    kv::paged::PoolConfig big = PagedReference::default_config();
    big.blocks = 64;
    kv::paged::PoolConfig wide = PagedReference::default_config();
    wide.block_tokens = 3;
    wide.heads = 3;
    wide.head_dim = 2;
    return {{"the default pool", PagedReference::default_config()}, {"a LIFO pool", lifo}, {"64 blocks", big}, {"3-token blocks", wide}};
}

WorkloadOptions paged_options() {
    WorkloadOptions options;
    options.capabilities = PagedReference().capabilities();
    return options;
}

void expect_same_verdict(const RunResult& slow, const RunResult& fast, const std::string& where) {
    ASSERT_EQ(slow.failure.has_value(), fast.failure.has_value()) << where;
    EXPECT_EQ(slow.steps_run, fast.steps_run) << where;
    if (!slow.failure) return;
    EXPECT_EQ(slow.failure->property, fast.failure->property) << where;
    EXPECT_EQ(slow.failure->step, fast.failure->step) << where;
    EXPECT_EQ(slow.failure->message, fast.failure->message) << where;
    EXPECT_EQ(slow.failure->also, fast.failure->also) << where;
}

TEST(PagedReadings, RowsAndTensorsReadTheSamePoolAfterEveryOperation) {
    const WorkloadOptions options = paged_options();
    for (const Shape& shape : shapes()) {
        std::size_t readings = 0, blocks_with_kv = 0;
        for (std::uint64_t seed = 1; seed <= 25; ++seed) {
            const Trace trace = trace_for_seed(seed, options);
            BothReadings both(shape.config);
            const RunResult run = execute(trace, both, RunOptions{});
            const std::string where = std::string(shape.name) + ", seed " + std::to_string(seed);
            ASSERT_EQ(both.difference, "") << where;
            EXPECT_FALSE(run.failure) << where << ": " << run.failure->property << ": " << run.failure->message;
            readings += both.readings;
            blocks_with_kv += both.blocks_with_kv;
        }
        EXPECT_GT(readings, 250u) << shape.name;  // the traces reach the pool (about 300 readings)
        EXPECT_GT(blocks_with_kv, readings) << shape.name;  // and its blocks hold K/V
    }
}

TEST(PagedReadings, EveryVerdictIsTheSameReadEitherWay) {
    const WorkloadOptions options = paged_options();
    for (const Shape& shape : shapes()) {
        for (std::uint64_t seed = 1; seed <= 10; ++seed) {
            const Trace trace = trace_for_seed(seed, options);
            PagedReference slow(nullptr, shape.config), fast(nullptr, shape.config);
            slow.read_rows(false);
            expect_same_verdict(execute(trace, slow, RunOptions{}), execute(trace, fast, RunOptions{}),
                                std::string(shape.name) + ", seed " + std::to_string(seed));
        }
    }
}

// A published block's K/V changed under the pool: published-immutable
// FAILs, at the same step with the same words, read either way.
TEST(PagedReadings, AChangedPublishedBlockFailsTheSameWayReadEitherWay) {
    const WorkloadOptions options = paged_options();
    std::size_t failed = 0;
    for (std::uint64_t seed = 1; seed <= 30; ++seed) {
        const Trace trace = trace_for_seed(seed, options);
        ChangesAPublishedBlock slow(PagedReference::default_config(), false), fast(PagedReference::default_config(), true);
        const RunResult by_tensors = execute(trace, slow, RunOptions{});
        const RunResult by_rows = execute(trace, fast, RunOptions{});
        expect_same_verdict(by_tensors, by_rows, "seed " + std::to_string(seed));
        if (by_rows.failure && by_rows.failure->property == property_id(Property::published_immutable)) ++failed;
    }
    EXPECT_GE(failed, 5u) << "the changed block is caught where a trace publishes a block (9 of these 30)";
}

}  // namespace
}  // namespace kvcheck::props
