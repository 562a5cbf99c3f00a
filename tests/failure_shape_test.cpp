// A failure's identity (kvcheck/search.h): the shape of its message, which
// groups engine errors and tells a property's distinct failures apart, and
// the shrinker keeping that identity (ShrinkOptions::keeps).
#include "kvcheck/executor.h"
#include "kvcheck/search.h"
#include "kvcheck/shrink.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using namespace kvcheck;

TEST(MessageShape, NumbersAddressesQuotesAndPathsAreMadeAlike) {
    EXPECT_EQ(message_shape("ValueError: planted: a merge of 2 ids"), "ValueError: planted: a merge of N ids");
    EXPECT_EQ(message_shape("ValueError: planted: a merge of 13 ids"), message_shape("ValueError: planted: a merge of 2 ids"));
    EXPECT_EQ(message_shape("entry \"a7\" layer 3 keys differ"), "entry \"_\" layer N keys differ");
    EXPECT_EQ(message_shape("cannot add 'b' (3) at 0x7f3a9c001234"), "cannot add '_' (N) at 0x_");
    EXPECT_EQ(message_shape("shape [2, 4, 5, 4] is not [2, 4, 6]"), "shape [_] is not [_]");
    EXPECT_EQ(message_shape("the store lists [b c], expected [c b] (insertion order)"),
              message_shape("the store lists [a b d], expected [b d a] (insertion order)"));
    EXPECT_EQ(message_shape("entry \"c\" has metadata {}, expected {note=k=v, \"q\"; 0, turn=[2]}"),
              "entry \"_\" has metadata {_}, expected {_}");
    EXPECT_EQ(message_shape("off by 1.5e-3 at 7"), "off by N at N");
    EXPECT_EQ(message_shape("at steps 7, 9 and 12"), "at steps N and N");
    EXPECT_EQ(message_shape("cannot open /tmp/kvcheck-job-12-AbC/run/slot-0/x.pt: no such file"), "cannot open <path>: no such file");
    EXPECT_EQ(message_shape("handle h12 of kv300 in float16"), "handle hN of kvN in floatN");
}

TEST(MessageShape, AnApostropheIsNoQuote) {
    EXPECT_EQ(message_shape("the adapter's read_entries and view_entry disagree on entry \"a\""),
              "the adapter's read_entries and view_entry disagree on entry \"_\"");
    EXPECT_EQ(message_shape("don't stop at 'x'"), "don't stop at '_'");
}

// A Python adapter's error reply: "Type: message" first, then the
// traceback, whose file names and line numbers differ between callers.
TEST(MessageShape, ATracebackIsLeftOutAndTheErrorLineKept) {
    const std::string one = "the engine threw: the adapter raised KeyError: 'c'\nTraceback (most recent call last):\n"
                            "  File \"/home/u/store.py\", line 17, in get\nKeyError: 'c'";
    const std::string two = "the engine threw: the adapter raised KeyError: 'zz'\nTraceback (most recent call last):\n"
                            "  File \"/srv/other.py\", line 230, in lookup\n    raise\nKeyError: 'zz'";
    EXPECT_EQ(message_shape(one), "the engine threw: the adapter raised KeyError: '_'");
    EXPECT_EQ(message_shape(one), message_shape(two));
    EXPECT_NE(message_shape(one), message_shape("the engine threw: the adapter raised IndexError: list index out of range"));
}

TEST(MessageShape, WordsMakeADifferenceAndTheLengthIsBounded) {
    EXPECT_NE(message_shape("cannot add a single-head cache 'a'"), message_shape("no single-head legacy caches, refusing 'a'"));
    EXPECT_EQ(message_shape(std::string(5000, 'x')).size(), message_shape_chars_max);
    const Failure failure{"single-copy", 3, "generate from h1 made 2 copies of the K/V, expected 1", {}};
    EXPECT_EQ(failure_shape(failure), "single-copy: generate from hN made N copies of the K/V, expected N");
}

Trace adds(const std::vector<std::string>& ids) {
    Trace trace;
    for (const std::string& id : ids) trace.push_back(parse_op("add " + id + " modern/f32/1:[kv1]"));
    return trace;
}

bool has_id(const Trace& trace, const std::string& id) {
    return format_trace(trace).find("add " + id + " ") != std::string::npos;
}

// An engine that errs one way on any trace and another way on a trace
// that adds "x": shrinking the second error keeps it the second, where
// "any engine error" would shrink it into the first.
TEST(ShrinkKeeps, AnEngineErrorShrinksKeepingItsShape) {
    const Oracle oracle = [](const Trace& trace) -> std::optional<Failure> {
        if (has_id(trace, "x")) return Failure{engine_error_id, trace.size() - 1, "cannot add 'x' (" + std::to_string(trace.size()) + ")", {}};
        return Failure{engine_error_id, 0, "the store is locked", {}};
    };
    const Trace found = adds({"a", "b", "x", "c", "d"});
    const Failure failure = *oracle(found);
    ShrinkOptions keeping;
    const std::string shape = failure_shape(failure);
    keeping.keeps = [shape](const Failure& candidate) { return failure_shape(candidate) == shape; };
    const ShrinkResult kept = shrink(found, failure, oracle, keeping);
    ASSERT_EQ(kept.trace.size(), 1u) << format_trace(kept.trace);
    EXPECT_TRUE(has_id(kept.trace, "x")) << format_trace(kept.trace);
    EXPECT_EQ(failure_shape(kept.failure), shape);
    const ShrinkResult any = shrink(found, failure, oracle);
    EXPECT_FALSE(has_id(any.trace, "x")) << "without keeps, any engine error will do:\n" << format_trace(any.trace);
}

// A failure that needs 5 tokens appended to a sequence and a rewind of at
// least 4: the two appends become one and the rewind's count comes down
// to the least that still fails (1 alone would pass).
TEST(ShrinkCounts, AppendsJoinAndACountComesDownStepByStep) {
    const Oracle oracle = [](const Trace& trace) -> std::optional<Failure> {
        std::int64_t appended = 0;
        for (const Op& operation : trace) {
            if (const auto* append = std::get_if<op::PagedAppend>(&operation); append && append->seq == 1) {
                appended += append->count;
            }
            const auto* rewind = std::get_if<op::PagedRewind>(&operation);
            if (rewind != nullptr && appended >= 5 && rewind->count >= 4) {
                return Failure{"lookup-exact", trace.size() - 1, "planted", {}};
            }
        }
        return std::nullopt;
    };
    Trace found;
    for (const char* line : {"paged_alloc seq=1 tokens=1,3 salt=0", "paged_append seq=1 count=3", "paged_append seq=1 count=2",
                             "paged_alloc seq=2 tokens=2,2 salt=0", "paged_rewind seq=1 count=7 token=1"}) {
        found.push_back(parse_op(line));
    }
    const ShrinkResult shrunk = shrink(found, *oracle(found), oracle);
    EXPECT_EQ(format_trace(shrunk.trace), "paged_append seq=1 count=5\npaged_rewind seq=1 count=4 token=1\n");
}

}  // namespace

// The coverage chart shows a shape only where an adapter claims the
// operations that make it (kvcheck/executor.h, shape_claimed).
namespace {

TEST(ShapeClaimed, AShapeIsClaimedOnlyByAnEngineWithItsOperations) {
    const Capabilities all;
    Capabilities returning;
    returning.returned_caches = true;
    EXPECT_TRUE(shape_claimed(Shape::merge, all));
    EXPECT_TRUE(shape_claimed(Shape::metadata_item, all));
    EXPECT_FALSE(shape_claimed(Shape::returned_cache_reused, all));  // returned caches are off unless claimed
    EXPECT_TRUE(shape_claimed(Shape::returned_cache_reused, returning));
    Capabilities no_dump;
    no_dump.dump = false;
    EXPECT_FALSE(shape_claimed(Shape::corrupted_dump, no_dump));
    EXPECT_FALSE(shape_claimed(Shape::failed_load, no_dump));
    EXPECT_TRUE(shape_claimed(Shape::merge, no_dump));
    Capabilities paged_only;
    paged_only.paged = true;
    paged_only.store = false;
    for (std::size_t i = 0; i < shape_count; ++i) {
        EXPECT_FALSE(shape_claimed(static_cast<Shape>(i), paged_only)) << shape_id(static_cast<Shape>(i));
    }
}

}  // namespace
