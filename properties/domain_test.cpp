// The model domain against engines (kvcheck/domain.h): an engine that
// raises on any cache outside its model, as a real one does, passes every
// property when it declares the model; one that takes no modern cache is
// never handed one, not even for generation with no cache; and the known
// bugs are still caught when the search keeps to a narrow model, except
// those that need a cache such a model never makes (listed below, each
// with its reason, and each caught in a wider model).
#include "reference/reference_engine.h"
#include "run_util.h"

#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <map>
#include <stdexcept>

namespace kvcheck::props {
namespace {

constexpr std::size_t traces_max = 3000;        // per mutant, as mutants_test
constexpr std::size_t reference_traces = 1000;  // per correct engine
constexpr std::size_t absent_traces = 1000;     // per mutant no model can show
constexpr std::uint64_t first_seed = 1;

// The narrow model: what one small real model stores.
ModelDomain narrow() { return {true, 2, 2, 8, {Dtype::f32}, {Layout::modern}, false}; }
// A wide one, still of one layer count, geometry and token count a cache.
ModelDomain wide() {
    return {true, 2, 2, 8, {Dtype::f32, Dtype::f16, Dtype::bf16}, {Layout::modern, Layout::legacy}, true};
}

// Why a cache is not one `model` makes ("" when it is): what a real engine
// checks of what it is handed. A cache with no layer is the fresh cache of
// a generation with no cache.
std::string content_fault(const ModelDomain& model, const CacheContent& content) {
    if (!model.holds(content.layout)) return std::string("a ") + layout_name(content.layout) + " cache";
    if (content.layers.empty()) return "";
    if (static_cast<std::int64_t>(content.layers.size()) != model.layers) return std::to_string(content.layers.size()) + " layers";
    if (content.heads != model.heads || content.head_dim != model.head_dim) return "another geometry";
    if (!model.holds(content.dtype)) return std::string("dtype ") + dtype_name(content.dtype);
    for (std::size_t i = 0; i < content.layers.size(); ++i) {
        const SlotContent k = logical_slot(content, i, keys);
        const SlotContent v = logical_slot(content, i, values);
        if (!k.present || !v.present || k.tokens() < 1 || k.tokens() != v.tokens()) return "layer " + std::to_string(i);
        if (k.tokens() != logical_slot(content, 0, keys).tokens()) return "layers of different lengths";
    }
    return "";
}

// The reference as a real engine of one model: it raises on any cache
// outside the model it declares, and counts the fresh caches it is asked
// to generate from.
class ModelEngine final : public adapters::ReferenceEngine {
  public:
    ModelEngine(ModelDomain model, bool modern_layout, std::atomic<std::size_t>* fresh_empty)
        : model_(std::move(model)), modern_layout_(modern_layout), fresh_empty_(fresh_empty) {}

    Capabilities capabilities() const override {
        Capabilities c = ReferenceEngine::capabilities();
        c.modern_layout = modern_layout_;
        if (model_.declared) c.model = model_;
        return c;
    }
    void add(const std::string& id, const CacheContent& content, const Metadata& metadata) override {
        require(content);
        ReferenceEngine::add(id, content, metadata);
    }
    void make(const CacheContent& content, Handle out) override {
        require(content);
        ReferenceEngine::make(content, out);
    }
    std::vector<std::int64_t> generate_fresh(const CacheContent& content, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens) override {
        require(content);
        if (content.layers.empty()) ++*fresh_empty_;
        return ReferenceEngine::generate_fresh(content, prompt, max_new_tokens);
    }

  protected:
    // A legacy-only engine starts its own caches legacy: the cache a turn
    // from none writes into, and the memory extract makes.
    kv::CachePtr working_cache(const kv::ConstCachePtr& past) override {
        if (past || modern_layout_) return ReferenceEngine::working_cache(past);
        kv::CachePtr fresh = kv::Cache::make(kv::Layout::legacy);
        fresh->set_owned(true);
        return fresh;
    }
    kv::CachePtr extracted(const std::vector<std::int64_t>& prompt) override {
        if (modern_layout_) return ReferenceEngine::extracted(prompt);
        kv::CachePtr memory = kv::Cache::make(kv::Layout::legacy);
        ReferenceEngine::model_.forward(prompt, *memory);
        return memory;
    }

  private:
    void require(const CacheContent& content) const {
        if (!modern_layout_ && content.layout == Layout::modern) {
            throw std::invalid_argument("a modern cache, but this engine takes legacy caches only");
        }
        if (!model_.declared) return;
        const std::string fault = content_fault(model_, content);
        if (!fault.empty()) throw std::invalid_argument("not a cache of the model: " + fault);
    }

    ModelDomain model_;
    bool modern_layout_;
    std::atomic<std::size_t>* fresh_empty_;
};

Adapter model_engine(const std::string& name, ModelDomain model, bool modern_layout, std::atomic<std::size_t>* fresh_empty) {
    return {name, "the reference, raising on any cache outside its model", "test", {},
            [=] { return std::shared_ptr<Engine>(std::make_shared<ModelEngine>(model, modern_layout, fresh_empty)); }};
}

TEST(Domain, AnEngineOfOneModelPassesEveryPropertyWhenItDeclaresIt) {
    std::atomic<std::size_t> fresh_empty{0};
    const Adapter engine = model_engine("model-engine", narrow(), true, &fresh_empty);
    const std::optional<Finding> finding = find_and_shrink(engine, first_seed, reference_traces, WorkloadOptions{});
    EXPECT_FALSE(finding) << format_failure(finding->shrunk.failure, finding->shrunk.trace, "(a test engine)");
    EXPECT_GT(fresh_empty.load(), 0u) << "generation with no cache was never drawn";
    // Undeclared, the same engine raises at once: the search draws caches it never holds.
    WorkloadOptions workload;
    workload.capabilities = engine.make()->capabilities();
    workload.capabilities.model = ModelDomain{};
    Runner runner;
    runner.make = engine.make;
    const SearchResult raised = search(runner, {first_seed, 50, 0}, workload);
    ASSERT_TRUE(raised.finding);
    EXPECT_EQ(raised.finding->shrunk.failure.property, "engine-error");
}

TEST(Domain, AnEngineWithoutTheModernLayoutIsNeverHandedAModernCache) {
    std::atomic<std::size_t> fresh_empty{0};
    const Adapter legacy_only = model_engine("legacy-only", ModelDomain{}, false, &fresh_empty);
    const std::optional<Finding> finding = find_and_shrink(legacy_only, first_seed, reference_traces, WorkloadOptions{});
    EXPECT_FALSE(finding) << format_failure(finding->shrunk.failure, finding->shrunk.trace, "(a test engine)");
    EXPECT_GT(fresh_empty.load(), 0u) << "generation with no cache was never drawn";
    // A modern cache in a replayed trace is skipped, never handed over.
    const RunResult replayed = run_on(legacy_only, parse_trace("add a modern/f32/1:[kv2]\ngenerate h0 prompt=3 max=2\n"));
    EXPECT_FALSE(replayed.failure);
    EXPECT_EQ(replayed.coverage.ops_skipped, 1u);
}

// The known bugs a narrow model (2 layers of 2x8, float32, modern, no odd
// layers) cannot show, and why: each needs a cache such a model never
// makes. Every other mutant must be caught under it.
const std::map<std::string, std::string> outside_the_narrow_model = {
    {"M5", "needs a layer holding both modern and legacy-named slots (odd layers)"},
    {"M6", "needs a one-sided layer (odd layers)"},
    {"M13", "needs a bfloat16 cache"},
    {"M16", "needs caches of different dtypes merged"},
    {"M20", "needs a legacy cache and from_legacy (both layouts)"},
    {"M29", "needs get_cache of stored ids that hold no tokens: a stored cache whose K/V are all in uninitialized "
            "layers (odd layers); a model's caches hold tokens in every layer"},
};

// The known bugs no declared model shows, and why.
const std::map<std::string, std::string> outside_every_model = {
    {"M4", "needs a modern cache with no layer (a model's caches have its layer count)"},
};

class MutantInAModel : public ::testing::TestWithParam<std::string> {};

TEST_P(MutantInAModel, IsCaughtByAPropertyItBreaks) {
    const Adapter* adapter = adapters::find_bundled(GetParam());
    ASSERT_NE(adapter, nullptr);
    if (outside_every_model.count(adapter->name) != 0) {
        std::cout << "[ domain   ] " << adapter->name << " is not checked in a model: " << outside_every_model.at(adapter->name)
                  << "\n";
        const std::optional<Finding> finding =
            find_and_shrink(*adapter, first_seed, absent_traces, WorkloadOptions{}, PropertySet::all(), wide());
        EXPECT_FALSE(finding) << adapter->name << " was caught in " << domain_text(wide()) << ": take it off the list\n"
                              << format_failure(finding->shrunk.failure, finding->shrunk.trace, "kvcheck run --adapter " + adapter->name);
        return;
    }
    const bool narrow_enough = outside_the_narrow_model.count(adapter->name) == 0;
    const ModelDomain model = narrow_enough ? narrow() : wide();
    // Its own properties only: in a narrow model a bug may show first as
    // another property's violation (M21's memoized copy, written into by a
    // generation, is a changed copy: stored-immutable, layout-roundtrip).
    PropertySet its_own = PropertySet::none();
    for (const Property property : adapter->breaks) its_own.add(property);
    const std::optional<Finding> finding = find_and_shrink(*adapter, first_seed, traces_max, WorkloadOptions{}, its_own, model);
    ASSERT_TRUE(finding) << adapter->name << " (" << adapter->description << ") survived " << traces_max << " traces in "
                         << domain_text(model);
    const auto& breaks = adapter->breaks;
    const std::optional<Property> reported = parse_property(finding->shrunk.failure.property);
    EXPECT_TRUE(reported && std::find(breaks.begin(), breaks.end(), *reported) != breaks.end())
        << adapter->name << " was reported under " << finding->shrunk.failure.property;
    for (const Op& operation : finding->shrunk.trace) {
        std::visit(
            [&](const auto& o) {
                if constexpr (std::is_same_v<std::decay_t<decltype(o)>, op::Add> || std::is_same_v<std::decay_t<decltype(o)>, op::Make>) {
                    EXPECT_EQ(spec_fault(model, o.cache), "") << "the shrunk trace left the model: " << format_op(operation);
                }
            },
            operation);
    }
    std::cout << "[ domain   ] " << adapter->name << " in " << domain_text(model) << ": " << finding->shrunk.failure.property
              << " after " << finding->traces_tried << " traces, shrunk to " << finding->shrunk.trace.size() << " ops"
              << (narrow_enough ? "" : " (not in the narrow model: " + outside_the_narrow_model.at(adapter->name) + ")") << "\n";
}

// The contiguous family's mutants: a model domain bounds the caches a
// store holds, not a paged pool's (the paged mutants are mutant.all's).
std::vector<std::string> mutant_names() {
    std::vector<std::string> names;
    for (const auto& adapter : adapters::bundled()) {
        if (!adapter.breaks.empty() && adapter.lanes == 1 && !adapter.make()->capabilities().paged) {
            names.push_back(adapter.name);
        }
    }
    return names;
}

INSTANTIATE_TEST_SUITE_P(Bundled, MutantInAModel, ::testing::ValuesIn(mutant_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvcheck::props
