// Entry versions (Engine::entry_version): the executor re-reads a stored
// entry only when its version moves, so the reference's versions must move
// on every change a check could see, and the executor must still catch a
// change: when the entry is next read (or at its step, reading everything
// every step), or, for an engine whose versions miss it, at the end of the
// run.
#include "reference/reference_engine.h"
#include "reference/cache_views.h"
#include "run_util.h"

#include <ATen/ops/ones.h>

#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace kvcheck::props {
namespace {

// The reference, with a way to reach into a stored cache as a bug would.
class Tampering : public adapters::ReferenceEngine {
  public:
    kv::Cache& stored_cache(const std::string& id) { return *std::const_pointer_cast<kv::Cache>(stored(id)); }
};

CacheContent two_layers(Layout layout) {
    return expand(parse_cache_spec(std::string(layout_name(layout)) + "/f32/3:[kv2 kv3]"));
}

// Each change made through `change` moves the version to a new value.
void expect_moves(Layout layout, const char* what, const std::function<void(kv::Cache&)>& change) {
    SCOPED_TRACE(what);
    Tampering engine;
    engine.add("a", two_layers(layout), {});
    const std::uint64_t before = engine.entry_version("a");
    EXPECT_EQ(engine.entry_version("a"), before) << "unchanged: the version stays";
    change(engine.stored_cache("a"));
    const std::uint64_t after = engine.entry_version("a");
    EXPECT_NE(after, before);
    EXPECT_EQ(engine.entry_version("a"), after);
}

at::Tensor& keys0(kv::Cache& cache) {
    return cache.layout() == kv::Layout::modern ? (*cache.layers())[0]->keys : (*cache.key_cache())[0];
}

TEST(EntryVersions, MoveOnEveryChangeACheckCouldSee) {
    for (const Layout layout : {Layout::modern, Layout::legacy}) {
        expect_moves(layout, "in-place write", [](kv::Cache& c) { keys0(c).add_(1); });
        expect_moves(layout, "in-place write through a view", [](kv::Cache& c) { keys0(c).narrow(2, 0, 1).mul_(2); });
        expect_moves(layout, "slot rebound to an equal tensor", [](kv::Cache& c) { keys0(c) = keys0(c).clone(); });
        expect_moves(layout, "metadata changed in place", [](kv::Cache& c) { keys0(c).transpose_(2, 3); });
        expect_moves(layout, "a model's append", [](kv::Cache& c) {
            c.update(at::ones({1, cache_heads, 1, cache_head_dim}), at::ones({1, cache_heads, 1, cache_head_dim}), 1);
        });
        expect_moves(layout, "owned marker", [](kv::Cache& c) { c.set_owned(true); });
    }
    expect_moves(Layout::modern, "initialized flag", [](kv::Cache& c) { (*c.layers())[1]->is_initialized = false; });
    expect_moves(Layout::modern, "a one-sided layer", [](kv::Cache& c) { (*c.layers())[1]->values = at::Tensor(); });
    expect_moves(Layout::modern, "a legacy-named slot", [](kv::Cache& c) { (*c.layers())[0]->key_cache = at::ones({1}); });
    expect_moves(Layout::modern, "a layer object replaced", [](kv::Cache& c) {
        (*c.layers())[0] = std::make_shared<kv::Layer>(*(*c.layers())[0]);
    });
    expect_moves(Layout::legacy, "keys moved between lists", [](kv::Cache& c) {
        c.value_cache()->push_back(c.key_cache()->back());
        c.key_cache()->pop_back();
    });
}

TEST(EntryVersions, NeverReturnToAnEarlierValue) {
    Tampering engine;
    engine.add("a", two_layers(Layout::modern), {});
    const std::uint64_t first = engine.entry_version("a");
    const at::Tensor original = keys0(engine.stored_cache("a"));
    keys0(engine.stored_cache("a")) = original.clone();
    const std::uint64_t second = engine.entry_version("a");
    keys0(engine.stored_cache("a")) = original;  // back to the very tensor of the first version
    const std::uint64_t third = engine.entry_version("a");
    EXPECT_NE(second, first);
    EXPECT_NE(third, first);
    EXPECT_NE(third, second);
}

TEST(EntryVersions, StayThroughReadsAndCopies) {
    Tampering engine;
    engine.add("a", two_layers(Layout::modern), {});
    const std::uint64_t before = engine.entry_version("a");
    engine.get("a", 1);
    engine.get_cache({"a"}, 2);
    engine.clone(1, 3);
    engine.generate(2, {5, 7}, 3, false);
    engine.view_entry("a");
    engine.storage_of_entry("a");
    EXPECT_EQ(engine.entry_version("a"), before);
}

// The reference's observations keep the stored item they found last while
// the store's items stay (Store::changes()): what they report must follow
// every change of what an id holds, made through the adapter (add,
// add_handle, remove, remove_all) or behind its back (a use after free
// here is what the AddressSanitizer runs catch).
class ChangedBehindItsBack : public Tampering {
  public:
    void store_directly(const std::string& id, const CacheContent& content) {
        store_.add({{id, adapters::materialize(content), {}}});
    }
};

TEST(EntryVersions, FollowWhatAnIdHoldsThroughEveryChange) {
    ChangedBehindItsBack engine;
    const CacheContent one = two_layers(Layout::modern);
    const CacheContent other = expand(parse_cache_spec("legacy/f32/2:[kv1]"));
    const auto holds = [&engine](const std::string& id, const CacheContent& content) {
        return engine.entry_digest(id) == view_digest(expected_view(content)) &&
               view_difference(engine.view_entry(id), expected_view(content)).empty();
    };
    engine.add("a", one, {});
    engine.add("b", one, {});
    std::uint64_t a = engine.entry_version("a");
    std::uint64_t b = engine.entry_version("b");
    EXPECT_TRUE(holds("a", one));

    engine.add("a", other, {});
    EXPECT_NE(engine.entry_version("a"), a);
    EXPECT_TRUE(holds("a", other));
    EXPECT_EQ(engine.entry_version("b"), b);
    EXPECT_TRUE(holds("b", one));

    engine.store_directly("b", other);
    engine.add("c", one, {});  // a change made here after one behind its back
    EXPECT_NE(engine.entry_version("b"), b);
    EXPECT_TRUE(holds("b", other));
    a = engine.entry_version("a");
    EXPECT_TRUE(holds("a", other));

    engine.remove({"a"});
    engine.add("a", one, {});
    EXPECT_NE(engine.entry_version("a"), a);
    EXPECT_TRUE(holds("a", one));

    b = engine.entry_version("b");
    engine.make(one, 1);
    engine.add_handle("b", 1);
    EXPECT_NE(engine.entry_version("b"), b);
    EXPECT_TRUE(holds("b", one));

    engine.remove_all();
    EXPECT_THROW(engine.entry_version("a"), std::out_of_range);
    engine.store_directly("a", other);
    EXPECT_TRUE(holds("a", other));
}

// An engine whose generation writes into the stored entry in place (the
// tensors keep their objects and storage: only the version counter shows).
template <bool honest_versions>
class WritesIntoTheStore : public Tampering {
  public:
    std::uint64_t entry_version(const std::string& id) override {
        return honest_versions ? Tampering::entry_version(id) : 1;
    }

  protected:
    std::vector<std::int64_t> run_generation(const kv::ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream,
                                             kv::GenerationStats& stats) override {
        keys0(stored_cache("a")).add_(1);
        return Tampering::run_generation(past, prompt, max_new_tokens, stream, stats);
    }
};

const Trace write_trace = {op::Add{"a", parse_cache_spec("modern/f32/3:[kv2 kv3]")}, op::GetCache{{1}, {"a"}},
                           op::Generate{{1}, {5, 7}, 2}, op::Get{{2}, "a"}, op::GetAll{}};

RunOptions every_step() {
    RunOptions options;
    options.every_entry_every_step = true;
    return options;
}

// The write at step 2 reaches no handle (the generation ran on an owned
// copy): the default schedule reads "a" when step 3 names it; reading every
// entry after every step pins it to step 2.
TEST(EntryVersions, AnInPlaceWriteIsCaughtWhenTheEntryIsNextReadOrAtItsStep) {
    WritesIntoTheStore<true> engine;
    const RunResult focused = execute(write_trace, engine);
    ASSERT_TRUE(focused.failure);
    EXPECT_EQ(focused.failure->property, "stored-immutable");
    EXPECT_EQ(focused.failure->step, 3u);
    EXPECT_EQ(focused.failure->message.find("end of the run"), std::string::npos) << focused.failure->message;

    WritesIntoTheStore<true> again;
    const RunResult strict = execute(write_trace, again, every_step());
    ASSERT_TRUE(strict.failure);
    EXPECT_EQ(strict.failure->property, "stored-immutable");
    EXPECT_EQ(strict.failure->step, 2u);
    EXPECT_EQ(strict.failure->message.find("end of the run"), std::string::npos) << strict.failure->message;
}

// A delete would wipe the evidence: the entries it names are read before it.
TEST(EntryVersions, AWriteIsFoundBeforeTheEntryIsDeleted) {
    const Trace trace = {op::Add{"a", parse_cache_spec("modern/f32/3:[kv2 kv3]")}, op::GetCache{{1}, {"a"}},
                         op::Generate{{1}, {5, 7}, 2}, op::Delete{{"a"}}, op::GetAll{}};
    WritesIntoTheStore<true> engine;
    const RunResult result = execute(trace, engine);
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "stored-immutable");
    EXPECT_EQ(result.failure->step, 3u);
    EXPECT_NE(result.failure->message.find("before this operation replaced or removed it"), std::string::npos)
        << result.failure->message;
}

// The write a WritesIntoTheStore engine makes at step `write` (a
// generation) is found by the periodic read of every entry, within
// `period` steps.
void expect_found_by_the_periodic_read(const Trace& trace, std::size_t write, std::size_t period) {
    WritesIntoTheStore<true> engine;
    const RunResult result = execute(trace, engine);
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "stored-immutable");
    EXPECT_GT(result.failure->step, write);
    EXPECT_LE(result.failure->step, write + period);
    EXPECT_NE(result.failure->message.find("periodic read of every entry"), std::string::npos) << result.failure->message;
}

// Nothing names "a" again: the periodic read of every entry finds the write,
// within sweep_steps_min (16) steps.
TEST(EntryVersions, AWriteNothingReachesIsFoundAtTheNextFullRead) {
    Trace trace = {op::Add{"a", parse_cache_spec("modern/f32/3:[kv2 kv3]")},
                   op::Add{"b", parse_cache_spec("modern/f32/3:[kv2 kv3]")}, op::GetCache{{1}, {"b"}},
                   op::Generate{{1}, {5, 7}, 2}};
    for (int i = 0; i < 30; ++i) trace.push_back(op::GetAll{});
    expect_found_by_the_periodic_read(trace, 3, 16);
}

// In a store of 40 entries, every entry is read at least once every 40
// steps, however often the steps read the others: the write into "a" at
// step 41 (which nothing names again) is found by step 81.
TEST(EntryVersions, AWriteNothingReachesIsFoundWithinAPeriodInABigStore) {
    Trace trace = {op::Add{"a", parse_cache_spec("modern/f32/3:[kv2 kv3]")}};
    for (int i = 1; i < 40; ++i) trace.push_back(op::Add{"e" + std::to_string(i), parse_cache_spec("modern/f32/2:[kv1]")});
    trace.push_back(op::GetCache{{1}, {"e1"}});
    trace.push_back(op::Generate{{1}, {5, 7}, 2});  // step 41
    for (int i = 0; i < 100; ++i) trace.push_back(op::Get{{2}, "e" + std::to_string(1 + i % 39)});
    expect_found_by_the_periodic_read(trace, 41, 40);
}

TEST(EntryVersions, AChangeTheVersionsMissIsCaughtAtTheEnd) {
    for (const bool strict : {false, true}) {
        SCOPED_TRACE(strict ? "every entry every step" : "default schedule");
        WritesIntoTheStore<false> engine;
        const RunResult result = execute(write_trace, engine, strict ? every_step() : RunOptions{});
        ASSERT_TRUE(result.failure);
        EXPECT_EQ(result.failure->property, "stored-immutable");
        EXPECT_EQ(result.failure->step, write_trace.size() - 1);
        EXPECT_NE(result.failure->message.find("end of the run"), std::string::npos) << result.failure->message;
    }
}

}  // namespace
}  // namespace kvcheck::props
