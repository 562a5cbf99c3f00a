// Focused properties, one per row of the property table that a short
// trace of a known shape exercises best: round trips, clone independence,
// merge correctness.
#include "generators.h"
#include "reference/cache_views.h"
#include "reference/paged_reference.h"
#include "reference/reference_engine.h"
#include "run_util.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <functional>
#include <stdexcept>

namespace kvcheck::props {
namespace {

const Adapter& reference() { return *adapters::find_bundled("reference"); }

void expect_passes(const Trace& trace, PropertySet properties) {
    const RunResult result = run_on(reference(), trace, properties);
    if (result.failure) RC_FAIL(format_failure(*result.failure, trace, reproduce_command(reference(), trace)));
    RC_ASSERT(result.coverage.ops_skipped == 0u);
}

TEST(LayoutRoundtrip, ConversionsCloneAndDumpAreIdentities) {
    EXPECT_TRUE(rc::check("modern->legacy->modern, legacy->modern->legacy, clone, dump/load", [] {
        const CacheSpec spec = any_spec(any_dtype());
        PropertySet properties = PropertySet::only(Property::layout_roundtrip);
        properties.add(Property::dump_safe);
        Trace trace{op::Make{{1}, spec}, op::Clone{{2}, {1}}};
        if (spec.layout == Layout::modern) {
            trace.push_back(op::ToLegacy{{3}, {1}});
            trace.push_back(op::FromLegacy{{4}, {3}});
        } else {
            trace.push_back(op::FromLegacy{{3}, {1}});
            trace.push_back(op::ToLegacy{{4}, {3}});
        }
        trace.push_back(op::Add{"a", spec});
        trace.push_back(op::Dump{0});
        trace.push_back(op::DeleteAll{});
        trace.push_back(op::Load{0});
        expect_passes(trace, properties);
        // Canonical caches (what from_legacy makes) come back exactly.
        adapters::ReferenceEngine engine;
        const CacheContent content = expand(spec);
        engine.make(content, 1);
        const bool legacy = spec.layout == Layout::legacy;
        if (legacy) {
            engine.from_legacy(1, 2);
            engine.to_legacy(2, 3);
        } else {
            engine.to_legacy(1, 2);
            engine.from_legacy(2, 3);
        }
        const CacheContent once = legacy ? expected_from_legacy(content) : expected_to_legacy(content);
        const CacheContent twice = legacy ? expected_to_legacy(once) : expected_from_legacy(once);
        RC_ASSERT(view_difference(engine.view_handle(3), expected_view(twice)).empty());
        if (legacy) RC_ASSERT(view_difference(engine.view_handle(3), expected_view(content)).empty());
    }));
}

TEST(CloneIndependent, AModelFillingTheCloneNeverReachesTheSource) {
    EXPECT_TRUE(rc::check("clone shares nothing, even empty and odd layers", [] {
        const CacheSpec spec = any_spec(any_dtype());
        const CacheContent content = expand(spec);
        adapters::ReferenceEngine engine;
        engine.make(content, 1);
        engine.clone(1, 2);
        const auto source = engine.storage_of_handle(1);
        for (std::uint64_t id : engine.storage_of_handle(2)) {
            RC_ASSERT(std::find(source.begin(), source.end(), id) == source.end());
        }
        RC_ASSERT(engine.handle_facts(2).owned);
        bool compatible = true;
        for (std::size_t i = 0; i < content.layers.size(); ++i) {
            compatible = compatible && logical_slot(content, i, keys).tokens() == logical_slot(content, i, values).tokens();
        }
        if (compatible) engine.generate(2, {3, 4}, 2, false);  // the model writes into the clone
        RC_ASSERT(view_difference(engine.view_handle(1), expected_view(content)).empty());
    }));
}

TEST(MergeCorrect, GetCacheOfSeveralIdsConcatenatesInRequestOrder) {
    EXPECT_TRUE(rc::check("merge: true length, request order, initialized, owned, sources unchanged", [] {
        const auto count = *rc::gen::inRange(2, 5);
        const Dtype dtype = any_dtype();  // merged caches share one dtype
        Trace trace;
        Ids ids;
        for (int i = 0; i < count; ++i) {
            const std::string id(1, static_cast<char>('a' + i));
            trace.push_back(op::Add{id, any_spec(dtype)});
            ids.push_back(id);
        }
        if (*rc::gen::arbitrary<bool>()) std::reverse(ids.begin(), ids.end());
        trace.push_back(op::GetCache{{1}, ids});
        trace.push_back(op::Generate{{1}, {5}, 2});
        PropertySet properties = PropertySet::only(Property::merge_correct);
        properties.add(Property::stored_immutable);
        const RunResult result = run_on(reference(), trace, properties);
        if (result.failure) RC_FAIL(format_failure(*result.failure, trace, reproduce_command(reference(), trace)));
    }));
}

// Caches of different dtypes merge as torch.cat promotes them (float16 with
// bfloat16, or anything with float32: float32), each part's values as they
// were; the store is untouched and a model decodes on the merge exactly as
// on a fresh copy of it.
TEST(MergeCorrect, MixedDtypesPromoteAsTorchCatDoes) {
    EXPECT_TRUE(rc::check("get_cache and concat of caches of any dtypes", [] {
        const auto count = *rc::gen::inRange(2, 4);
        Trace trace;
        Ids ids;
        HandleNames parts;
        for (int i = 0; i < count; ++i) {
            const std::string id(1, static_cast<char>('a' + i));
            const CacheSpec spec = any_spec(any_dtype());
            trace.push_back(op::Add{id, spec});
            trace.push_back(op::Make{{10 + i}, spec});
            ids.push_back(id);
            parts.push_back({10 + i});
        }
        trace.push_back(op::GetCache{{1}, ids});
        trace.push_back(op::Concat{{2}, parts});
        trace.push_back(op::Generate{{1}, {5}, 2});
        PropertySet properties = PropertySet::only(Property::merge_correct);
        properties.add(Property::stored_immutable);
        properties.add(Property::generation_equivalent);
        const RunResult result = run_on(reference(), trace, properties);
        if (result.failure) RC_FAIL(format_failure(*result.failure, trace, reproduce_command(reference(), trace)));
    }));
}

// Engines that answer a merge of mixed dtypes otherwise than the reference.
enum class Answer { refuse_cleanly, refuse_after_binding, keep_the_first_dtype };

class MixingEngine final : public adapters::ReferenceEngine {
  public:
    explicit MixingEngine(Answer answer) : answer_(answer) {}

    void get_cache(const std::vector<std::string>& ids, Handle out) override {
        std::vector<Dtype> dtypes;
        for (const std::string& id : ids) {
            const std::vector<std::string> stored = stored_ids();
            if (std::find(stored.begin(), stored.end(), id) == stored.end()) continue;
            const CacheView view = view_entry(id);
            if (!view.layers.empty() && view.layers[0].slots[keys].present) dtypes.push_back(view.layers[0].slots[keys].dtype);
        }
        const bool mixed = std::adjacent_find(dtypes.begin(), dtypes.end(), std::not_equal_to<>()) != dtypes.end();
        if (!mixed) return ReferenceEngine::get_cache(ids, out);
        switch (answer_) {
            case Answer::refuse_cleanly: throw std::invalid_argument("mixed dtypes");
            case Answer::refuse_after_binding:
                ReferenceEngine::get_cache(ids, out);
                throw std::invalid_argument("mixed dtypes");
            case Answer::keep_the_first_dtype: {
                // The promotion "fixed" by casting the merge to the first part's dtype.
                ReferenceEngine::get_cache(ids, out);
                kv::ConstCachePtr merged = handle(out);
                auto cast = std::const_pointer_cast<kv::Cache>(merged);
                for (const kv::LayerPtr& layer : *cast->layers()) {
                    const at::ScalarType first = dtypes.front() == Dtype::f16 ? at::kHalf : dtypes.front() == Dtype::bf16 ? at::kBFloat16 : at::kFloat;
                    layer->keys = layer->keys.to(first);
                    layer->values = layer->values.to(first);
                }
                return;
            }
        }
    }

  private:
    Answer answer_;
};

// An engine may refuse a merge of mixed dtypes, if the refusal leaves no
// cache behind and the store as it was; a refusal that binds its handle, a
// wrong promotion, and a refusal that changed the store first (M16) fail.
TEST(MergeCorrect, ARefusedMixOfDtypesLeavesNothingBehind) {
    const Trace trace = parse_trace("add a modern/f16/1:[kv2]\nadd b modern/bf16/2:[kv3 kv1]\nh1 = get_cache a b\nh2 = clone h1\n");
    MixingEngine clean(Answer::refuse_cleanly);
    const RunResult refused = execute(trace, clean);
    EXPECT_FALSE(refused.failure) << refused.failure->message;
    EXPECT_EQ(refused.coverage.refused_merges, 1u);
    EXPECT_EQ(refused.coverage.ops_skipped, 1u) << "the clone of nothing";
    MixingEngine bound(Answer::refuse_after_binding);
    const RunResult bound_result = execute(trace, bound);
    ASSERT_TRUE(bound_result.failure);
    EXPECT_EQ(bound_result.failure->property, "merge-correct");
    EXPECT_NE(bound_result.failure->message.find("holds a cache"), std::string::npos) << bound_result.failure->message;
    MixingEngine first(Answer::keep_the_first_dtype);
    const RunResult first_result = execute(trace, first);
    ASSERT_TRUE(first_result.failure);
    EXPECT_EQ(first_result.failure->property, "merge-correct");
    EXPECT_NE(first_result.failure->message.find("dtype f16, expected f32"), std::string::npos) << first_result.failure->message;
    const RunResult m16 = run_on(*adapters::find_bundled("M16"), trace);
    ASSERT_TRUE(m16.failure);
    EXPECT_EQ(m16.failure->property, "stored-immutable");
    // A refusal of a merge of one dtype is an error of the engine, as before.
    const Trace same = parse_trace("add a modern/f16/1:[kv2]\nadd b modern/f16/2:[kv3]\nh1 = get_cache a b\n");
    class Refusing final : public adapters::ReferenceEngine {
        void get_cache(const std::vector<std::string>&, Handle) override { throw std::invalid_argument("no merges"); }
    } refusing;
    const RunResult error = execute(same, refusing);
    ASSERT_TRUE(error.failure);
    EXPECT_EQ(error.failure->property, engine_error_id);
}

// A store that keeps a cache's dtype tag but passes its values through a
// narrower type loses bits, and the view, compared in the claimed dtype,
// shows it: float32 through float16, bfloat16 through float16 (values
// below float16's normal range).
class LossyStore final : public adapters::ReferenceEngine {
  public:
    explicit LossyStore(at::ScalarType through) : through_(through) {}
    void add(const std::string& id, const CacheContent& content, const Metadata& metadata) override {
        kv::CachePtr cache = adapters::materialize(content);
        for (const kv::LayerPtr& layer : *cache->layers()) {
            for (at::Tensor* t : {&layer->keys, &layer->values}) {
                if (t->defined()) *t = t->to(through_).to(t->scalar_type());
            }
        }
        store_add(id, cache, metadata);
    }

  private:
    at::ScalarType through_;
};

TEST(StoredImmutable, ALossyCastThatKeepsTheDtypeTagIsCaught) {
    const std::vector<std::pair<std::string, at::ScalarType>> cases = {
        {"add a modern/f32/1:[kv2]\n", at::kHalf}, {"add a modern/bf16/1:[kv8]\n", at::kHalf}, {"add a modern/f32/1:[kv2]\n", at::kBFloat16}};
    for (const auto& [text, through] : cases) {
        LossyStore engine(through);
        const RunResult result = execute(parse_trace(text), engine);
        ASSERT_TRUE(result.failure) << text << " through " << c10::toString(through);
        EXPECT_EQ(result.failure->property, "stored-immutable");
        EXPECT_NE(result.failure->message.find("content differs"), std::string::npos) << result.failure->message;
    }
    // A cast to the same type is no loss.
    LossyStore same(at::kFloat);
    EXPECT_FALSE(execute(parse_trace("add a modern/f32/1:[kv2]\n"), same).failure);
}

// A correct pool whose free list is LIFO (a freed block joins the front,
// as vLLM's unhashed freed blocks do): a rewind releases the block it
// empties, and its copy of the shared last block takes that block straight
// back. Nothing else held it: it is a new block, not a table-held block
// rewritten (issue 41's false published-immutable FAIL, shrunk).
TEST(PublishedImmutable, ABlockARewindReleasesAndTakesBackForItsCopyIsANewBlock) {
    kv::paged::PoolConfig lifo = adapters::PagedReference::default_config();
    lifo.free_to_front = true;
    adapters::PagedReference engine(nullptr, lifo);
    ASSERT_EQ(engine.capabilities().paged_free_order, PagedFreeOrder::front);
    const Trace trace = parse_trace(
        "paged_import seq=2 modern/f32/0:[kv2 kv2]\n"
        "paged_fork parent=2 child=3\n"
        "paged_append seq=3 count=1\n"
        "paged_rewind seq=3 count=2 token=3\n");
    const RunResult result = execute(trace, engine);
    EXPECT_FALSE(result.failure) << format_failure(*result.failure, trace, "(a LIFO paged reference)");
    // The case is the one meant: block 2, dropped by the rewind, is the
    // copy's target of the shared block 1.
    const PagedState state = engine.paged_state();
    EXPECT_EQ(state.tables.at(3), std::vector<std::int64_t>{2});
    EXPECT_EQ(state.copies, (std::vector<PagedCopy>{{1, 2}}));
}

// A correct pool whose free list is least recently used first (declared
// lru): every paged property holds on searched traces, free-order included;
// the same pool declaring the back (PM26 is the converse) is caught.
Adapter paged_lru_reference() {
    return {"paged-reference-lru", "the paged reference, free blocks least recently used first", "bundled", {}, [] {
                kv::paged::PoolConfig lru = adapters::PagedReference::default_config();
                lru.free_by_last_use = true;
                return std::shared_ptr<Engine>(std::make_shared<adapters::PagedReference>(nullptr, lru));
            }};
}

TEST(FreeOrder, AnLruPoolPassesEverySearchedTrace) {
    ASSERT_EQ(paged_lru_reference().make()->capabilities().paged_free_order, PagedFreeOrder::lru);
    const std::optional<Finding> finding = find_and_shrink(paged_lru_reference(), 42, 300, WorkloadOptions{});
    EXPECT_FALSE(finding) << format_failure(finding->reported, finding->shrunk.trace, "(an LRU paged reference)");
}

TEST(FreeOrder, AnLruPoolPutsASequenceUsedLongAgoAheadOfOneUsedSince) {
    const Trace trace = parse_trace(
        "paged_alloc seq=1 tokens=1,2,3 salt=0\n"
        "paged_alloc seq=2 tokens=3,1,2 salt=0\n"
        "paged_append seq=2 count=1\n"
        "paged_free seq=2\n"
        "paged_free seq=1\n");
    const RunResult lru = run_on(paged_lru_reference(), trace);
    EXPECT_FALSE(lru.failure) << format_failure(*lru.failure, trace, "(an LRU paged reference)");
    const RunResult fifo = run_on(*adapters::find_bundled("PM26"), trace);
    ASSERT_TRUE(fifo.failure);
    EXPECT_EQ(fifo.failure->property, "free-order");
}

// PM28, a lookup that keeps counting hits past the first miss, on the
// shape it needs: a rewind cuts a published block (its key dropped) while
// the block after it, released, keeps its key.
TEST(LookupExact, ALookupCountingPastAMissIsCaught) {
    const Trace trace = parse_trace(
        "paged_alloc seq=1 tokens=1,2,3,1 salt=0\n"
        "paged_step\n"
        "paged_rewind seq=1 count=3 token=1\n"
        "paged_lookup tokens=1,2,3,1,2 salt=0\n");
    const RunResult reference = run_on(*adapters::find_bundled("paged-reference"), trace);
    EXPECT_FALSE(reference.failure) << format_failure(*reference.failure, trace, "(the paged reference)");
    const RunResult found = run_on(*adapters::find_bundled("PM28"), trace);
    ASSERT_TRUE(found.failure);
    EXPECT_EQ(found.failure->property, "lookup-exact");
    EXPECT_EQ(found.failure->step, 3u);
}

// docs/semantics.md#declared-store-contracts: the reference bounded at 4
// items, evicting as `eviction` says (lru; lrs: a hand-out is no use, an
// overwrite moves an entry to the back, as mlx-lm's LRUPromptCache does).
Adapter bounded_reference(Eviction eviction) {
    const std::string policy = eviction_name(eviction);
    return {"reference-" + policy + "4", "the reference, bounded at 4 items (" + policy + ")", "bundled", {}, [eviction] {
                auto engine = std::make_shared<adapters::ReferenceEngine>();
                engine->set_capacity(4, eviction);
                return std::shared_ptr<Engine>(std::move(engine));
            }};
}

Adapter lru_reference() { return bounded_reference(Eviction::lru); }
Adapter lrs_reference() { return bounded_reference(Eviction::lrs); }

// `text` runs on `adapter` to its end, every operation run, nothing failing.
void expect_every_step_passes(const Adapter& adapter, const char* text) {
    const RunResult result = run_on(adapter, parse_trace(text));
    EXPECT_FALSE(result.failure) << format_failure(*result.failure, parse_trace(text), "");
    EXPECT_EQ(result.coverage.ops_skipped, 0u);
}

// Four entries, "b" handed out as h1 and then the least recently used (the
// others are used after it): the fifth add evicts "b", whose cache h1
// still holds intact (a clone of it, and a generation from it, are checked
// against what "b" held).
constexpr const char* lru_trace =
    "add a modern/f32/1:[kv2]\nadd b modern/f32/2:[kv3]\nadd c modern/f32/3:[kv2]\nadd d modern/f32/4:[kv2]\n"
    "h1 = get b\nh2 = get a\nh3 = get_cache c d\nadd e modern/f32/5:[kv2]\nh4 = clone h1\n"
    "generate h1 prompt=1 max=2\nget_all\n";

TEST(EvictionAsDeclared, AnLruStoreEvictsTheLeastRecentlyUsedAndHandedOutCachesStayIntact) {
    expect_every_step_passes(lru_reference(), lru_trace);
    // The same trace on an unbounded store: nothing is evicted, nothing judged.
    EXPECT_FALSE(run_on(reference(), parse_trace(lru_trace)).failure);
}

TEST(EvictionAsDeclared, EvictingTheMostRecentInsteadIsCaughtAndNamed) {
    const RunResult result = run_on(*adapters::find_bundled("M34"), parse_trace(lru_trace));
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "eviction-as-declared");
    EXPECT_NE(result.failure->message.find("add \"e\" evicted [d], expected [b]"), std::string::npos)
        << result.failure->message;
}

TEST(EvictionAsDeclared, AnLruReferencePassesEverySearchedTrace) {
    WorkloadOptions options;
    const std::optional<Finding> finding = find_and_shrink(lru_reference(), 42, 150, options);
    EXPECT_FALSE(finding) << format_failure(finding->reported, finding->shrunk.trace, "");
}

// "b" handed out (as h1), then "a" overwritten: the least recently stored
// is "b" (lrs), the first stored "a" (fifo), the least recently used "c"
// (lru). The fifth id evicts "b", whose cache h1 still holds intact.
constexpr const char* lrs_trace =
    "add a modern/f32/1:[kv2]\nadd b modern/f32/2:[kv3]\nadd c modern/f32/3:[kv2]\nadd d modern/f32/4:[kv2]\n"
    "h1 = get b\nadd a modern/f32/5:[kv2]\nadd e modern/f32/6:[kv2]\nh2 = clone h1\n"
    "generate h1 prompt=1 max=2\nget_all\n";

TEST(EvictionAsDeclared, AnLrsStoreEvictsTheLeastRecentlyStoredAndAnOverwriteCounts) {
    expect_every_step_passes(lrs_reference(), lrs_trace);
    // The LRU reference evicts "c" there, as it declares (and a store
    // keeping an overwrite's place evicts "a": M37, below).
    EXPECT_FALSE(run_on(lru_reference(), parse_trace(lrs_trace)).failure);
}

TEST(EvictionAsDeclared, AnLrsStoreKeepingAnOverwritesPlaceIsCaughtAndNamed) {
    const RunResult result = run_on(*adapters::find_bundled("M37"), parse_trace(lrs_trace));
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "eviction-as-declared");
    EXPECT_NE(result.failure->message.find("add \"e\" evicted [a], expected [b] (the least recently stored first; "
                                           "declared: 4 items, eviction lrs)"),
              std::string::npos)
        << result.failure->message;
}

TEST(EvictionAsDeclared, AnLrsReferencePassesEverySearchedTrace) {
    const std::optional<Finding> finding = find_and_shrink(lrs_reference(), 42, 150, WorkloadOptions{});
    EXPECT_FALSE(finding) << format_failure(finding->reported, finding->shrunk.trace, "(an lrs reference)");
}

// docs/semantics.md#trimming: a get_cache copy cut to 2 tokens, generated
// from (the kept prefix); a turn's cache (from none: the model's K/V of the
// prompt and the tokens fed) cut into its fed tokens, then continued; a
// clone of the cut copy cut again. Every trim runs (none skipped); a
// trim of what get hands out (read-only) or of a stored-back turn is not.
constexpr const char* trim_trace =
    "add a modern/f32/1:[kv5 kv5]\nh1 = get_cache a\ntrim h1 keep=2\nh4 = clone h1\ngenerate h1 prompt=3 max=2\n"
    "h2 = turn h0 prompt=4,5,6 max=3\ntrim h2 keep=4\nh3 = turn h2 prompt=7 max=2\n"
    "trim h4 keep=1\nget_all\n";

TEST(TrimExact, TheReferenceCutsOwnedCachesToTheirPrefixAndLeavesTheStoreAlone) {
    const RunResult result = run_on(reference(), parse_trace(trim_trace));
    EXPECT_FALSE(result.failure) << format_failure(*result.failure, parse_trace(trim_trace), "");
    EXPECT_EQ(result.coverage.ops_skipped, 0u);
    // Stored caches are read-only: a trim of a stored item is never run.
    const RunResult stored = run_on(reference(), parse_trace("add a modern/f32/1:[kv5]\nh1 = get a\ntrim h1 keep=2\n"));
    EXPECT_FALSE(stored.failure);
    EXPECT_EQ(stored.coverage.ops_skipped, 1u);
}

TEST(TrimExact, KeepingATokenTooManyIsCaughtAtTheTrim) {
    const RunResult result = run_on(*adapters::find_bundled("M35"), parse_trace(trim_trace));
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "trim-exact");
    EXPECT_EQ(result.failure->step, 2u);
    EXPECT_NE(result.failure->message.find("trim h1 keep=2 (it held 5 tokens)"), std::string::npos) << result.failure->message;
}

TEST(TrimExact, TrimmingTheEntryACopyCameFromIsStoredImmutables) {
    const RunResult result = run_on(*adapters::find_bundled("M36"), parse_trace(trim_trace));
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "stored-immutable");
}

// ---- lease-respected (docs/semantics.md#leases) ----

// Leases of 4 ms: a delete under a live lease refused, one at the expiry
// done; an overwrite refused; two leases given back, a third refused; a
// lease on nothing refused; an unlease after expiry refused.
const char* const lease_trace =
    "add a modern/f32/1:[kv2]\n"
    "add b modern/f32/2:[kv2]\n"
    "lease a\n"
    "delete a b\n"
    "add a modern/f32/3:[kv2]\n"
    "tick ms=3\n"
    "lease a\n"
    "unlease a\n"
    "unlease a\n"
    "unlease a\n"
    "lease b\n"
    "lease c\n"
    "tick ms=4\n"
    "unlease b\n"
    "delete a b\n";

const Adapter& bundled(const char* name) {
    const Adapter* adapter = adapters::find_bundled(name);
    if (adapter == nullptr) throw std::logic_error(std::string("no bundled adapter ") + name);
    return *adapter;
}

// The trace passes on the bundled adapter, every operation of it run.
void expect_passes_whole(const char* adapter, const char* text) {
    const Trace trace = parse_trace(text);
    const RunResult result = run_on(bundled(adapter), trace);
    EXPECT_FALSE(result.failure) << format_failure(*result.failure, trace, "");
    EXPECT_EQ(result.coverage.ops_skipped, 0u);
}

TEST(LeaseRespected, TheReferenceRefusesExactlyWhatALiveLeaseHoldsOff) {
    expect_passes_whole("reference-leases", lease_trace);
}

// The trace fails `property` on the bundled adapter at `step`, saying `said`.
void expect_caught(const char* adapter, const char* text, const char* property, std::size_t step, const std::string& said) {
    const RunResult result = run_on(bundled(adapter), parse_trace(text));
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, property);
    EXPECT_EQ(result.failure->step, step);
    EXPECT_NE(result.failure->message.find(said), std::string::npos) << result.failure->message;
}

TEST(LeaseRespected, ADeleteUnderALiveLeaseIsCaughtAtTheDelete) {
    expect_caught("M38", lease_trace, "lease-respected", 3,
                  "delete a b at t=0 ms was not refused: \"a\" holds 1 live lease(s), until t=4 ms");
}

TEST(LeaseRespected, ALeaseOutlivingItsTtlByATickIsCaughtAtItsExpiry) {
    const Trace trace = parse_trace("add a modern/f32/1:[kv2]\nlease a\ntick ms=4\ndelete a\n");
    EXPECT_FALSE(run_on(bundled("reference-leases"), trace).failure);
    const RunResult result = run_on(bundled("M39"), trace);
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "lease-respected");
    EXPECT_EQ(result.failure->step, 3u);
    EXPECT_NE(result.failure->message.find("the lease on \"a\" expired at t=4 ms"), std::string::npos) << result.failure->message;
    // A tick short of the expiry the delete is refused by both.
    const Trace early = parse_trace("add a modern/f32/1:[kv2]\nlease a\ntick ms=3\ndelete a\n");
    EXPECT_FALSE(run_on(bundled("M39"), early).failure);
}

// docs/semantics.md#leases, eviction under leases: reference-leases holds 3
// entries (lru). "a" is the least recently used but leased: "d" evicts
// "b"; with every entry leased "e" is refused whole; once the leases
// expired "e" evicts "a".
constexpr const char* evict_under_leases_trace =
    "add a modern/f32/1:[kv2]\nadd b modern/f32/2:[kv2]\nadd c modern/f32/3:[kv2]\nlease a\n"
    "add d modern/f32/4:[kv2]\nlease c\nlease d\nadd e modern/f32/5:[kv2]\ntick ms=4\n"
    "add e modern/f32/5:[kv2]\nget_all\n";

TEST(EvictionUnderLeases, TheReferencePassesOverLeasedEntriesAndRefusesWhenAllAreLeased) {
    expect_passes_whole("reference-leases", evict_under_leases_trace);
}

TEST(EvictionUnderLeases, AnEvictionOfALeasedEntryIsCaughtAtTheAdd) {
    expect_caught("M44", evict_under_leases_trace, "eviction-as-declared", 4, "add \"d\" evicted \"a\", which holds a live lease");
}

// docs/semantics.md#batches: two rows of one geometry copied out of the
// store, a beam step over them (each repeated twice, then reordered), a
// generation from the row kept; then the identity batch of one row.
constexpr const char* batch_trace =
    "add a modern/f32/1:[kv3 kv3]\nadd b modern/f32/2:[kv3 kv3]\nh1 = get_cache a\nh2 = get_cache b\n"
    "h3 = batch repeat=2 reorder=3,0,1,1 select=0 h1 h2\ngenerate h3 prompt=4 max=2\n"
    "h4 = batch repeat=1 reorder= select=0 h1\ngenerate h4 prompt=5 max=2\nget_all\n";

TEST(BatchExact, TheReferenceHandsOutTheRowItCameFromAndLeavesTheRowsAlone) {
    const RunResult result = run_on(reference(), parse_trace(batch_trace));
    EXPECT_FALSE(result.failure) << format_failure(*result.failure, parse_trace(batch_trace), "");
    EXPECT_EQ(result.coverage.ops_skipped, 0u);
    // Stored items are read-only, and rows of two geometries do not stack:
    // neither batch is run.
    const RunResult skipped = run_on(reference(), parse_trace("add a modern/f32/1:[kv3]\nadd b modern/f32/1:[kv2]\n"
                                                              "h1 = get a\nh2 = batch repeat=1 reorder= select=0 h1\n"
                                                              "h3 = get_cache a\nh4 = get_cache b\n"
                                                              "h5 = batch repeat=1 reorder= select=1 h3 h4\n"));
    EXPECT_FALSE(skipped.failure);
    EXPECT_EQ(skipped.coverage.ops_skipped, 2u);
}

TEST(BatchExact, AReorderOfTheKeysAloneIsCaughtAtTheBatch) {
    const RunResult result = run_on(*adapters::find_bundled("M42"), parse_trace(batch_trace));
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "batch-exact");
    EXPECT_EQ(result.failure->step, 4u);
    EXPECT_NE(result.failure->message.find("batch h1 h2 repeat=2 reorder=3,0,1,1 select=0 -> h3"), std::string::npos)
        << result.failure->message;
}

TEST(BatchExact, AnIdentityBatchSharingTheRowsTensorsIsCloneIndependents) {
    const RunResult result = run_on(*adapters::find_bundled("M43"), parse_trace(batch_trace));
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, "clone-independent");
    EXPECT_EQ(result.failure->step, 6u);
}

}  // namespace
}  // namespace kvcheck::props
