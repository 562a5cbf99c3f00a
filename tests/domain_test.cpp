// The model domain (kvcheck/domain.h): an engine that declares its model
// gets only that model's caches, from every way a trace is drawn (seeded
// swarms, the fuzz targets' byte decoder, RapidCheck's uniform swarm) and
// after shrinking; an engine that takes no modern cache never gets one;
// declarations and --model texts are checked, with errors naming the key.
#include "byte_chooser.h"
#include "generators.h"
#include "kvcheck/domain.h"
#include "kvcheck/shrink.h"
#include "kvcheck/workload.h"

#include <boost/pfr.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using kvcheck::CacheSpec;
using kvcheck::Capabilities;
using kvcheck::Dtype;
using kvcheck::Layout;
using kvcheck::LayerSpec;
using kvcheck::ModelDomain;
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

ModelDomain model_of(std::int64_t layers, std::int64_t heads, std::int64_t head_dim, std::vector<Dtype> dtypes,
                     std::vector<Layout> layouts, bool odd_layers = false) {
    return {true, layers, heads, head_dim, std::move(dtypes), std::move(layouts), odd_layers};
}

WorkloadOptions declaring(const ModelDomain& model) {
    WorkloadOptions options;
    options.capabilities.model = model;
    return options;
}

// What spec_fault checks, spelt out here once more, so that a spec_fault
// that lets something through does not pass its own test.
void expect_in_model(const ModelDomain& model, const CacheSpec& spec, const std::string& where) {
    const std::string text = where + ": " + kvcheck::format_cache_spec(spec);
    ASSERT_EQ(static_cast<std::int64_t>(spec.layers.size()), model.layers) << text;
    for (const LayerSpec& layer : spec.layers) {
        ASSERT_GE(layer.tokens, 1) << text;
        ASSERT_EQ(layer.tokens, spec.layers.front().tokens) << text;
        if (!model.odd_layers) {
            ASSERT_EQ(layer.slots, 0b0011) << text;
            ASSERT_TRUE(layer.initialized) << text;
        }
    }
    ASSERT_EQ(spec.heads, model.heads) << text;
    ASSERT_EQ(spec.head_dim, model.head_dim) << text;
    ASSERT_TRUE(model.holds(spec.dtype)) << text;
    ASSERT_TRUE(model.holds(spec.layout)) << text;
    ASSERT_EQ(kvcheck::spec_fault(model, spec), "") << text;
}

// What the traces of many seeds drew.
struct Drawn {
    std::size_t specs = 0;
    std::set<Dtype> dtypes;
    std::set<Layout> layouts;
    std::size_t mixed_traces = 0;  // traces holding caches of two dtypes
    std::size_t conversions = 0;
    std::size_t odd = 0;           // specs with an odd layer
    std::int64_t tokens_max = 0;
    std::size_t crossing_64 = 0;   // specs with layers of 64 tokens or more
};

void note(Drawn& drawn, const ModelDomain& model, const Trace& trace, const std::string& where) {
    std::set<Dtype> in_trace;
    for (const CacheSpec& spec : specs_of(trace)) {
        expect_in_model(model, spec, where);
        if (::testing::Test::HasFatalFailure()) return;
        ++drawn.specs;
        drawn.dtypes.insert(spec.dtype);
        in_trace.insert(spec.dtype);
        drawn.layouts.insert(spec.layout);
        drawn.tokens_max = std::max(drawn.tokens_max, spec.layers.front().tokens);
        drawn.crossing_64 += spec.layers.front().tokens >= 64 ? 1 : 0;
        drawn.odd += std::any_of(spec.layers.begin(), spec.layers.end(),
                                 [](const LayerSpec& l) { return l.slots != 0b0011 || !l.initialized; });
    }
    drawn.mixed_traces += in_trace.size() > 1 ? 1 : 0;
    for (const kvcheck::Op& operation : trace) {
        drawn.conversions += std::holds_alternative<kvcheck::op::ToLegacy>(operation) ||
                             std::holds_alternative<kvcheck::op::FromLegacy>(operation);
    }
}

Drawn draw_seeds(const ModelDomain& model, std::uint64_t seeds) {
    const WorkloadOptions options = declaring(model);
    Drawn drawn;
    for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
        note(drawn, model, kvcheck::trace_for_seed(seed, options), "seed " + std::to_string(seed));
        if (::testing::Test::HasFatalFailure()) break;
    }
    return drawn;
}

TEST(Domain, ANarrowModelGetsOnlyItsCaches) {
    const ModelDomain model = model_of(2, 2, 8, {Dtype::f32}, {Layout::modern});
    const Drawn drawn = draw_seeds(model, 4000);
    std::cout << "[ domain   ] " << kvcheck::domain_text(model) << ": " << drawn.specs << " caches, " << drawn.crossing_64
              << " of >= 64 tokens, the most " << drawn.tokens_max << "\n";
    EXPECT_GT(drawn.specs, 5000u);
    EXPECT_EQ(drawn.conversions, 0u) << "a conversion needs both layouts";
    EXPECT_EQ(drawn.mixed_traces, 0u);
    EXPECT_EQ(drawn.odd, 0u);
    // Token counts still spread over the size thresholds of the scope.
    EXPECT_GT(drawn.crossing_64, drawn.specs / 20);
    EXPECT_GE(drawn.tokens_max, 256);
    EXPECT_LE(drawn.tokens_max, WorkloadOptions{}.scope.layer_tokens_max);
}

TEST(Domain, AWideModelGetsEachOfItsDtypesAndLayoutsAndMixesThem) {
    const ModelDomain model = model_of(3, 4, 16, {Dtype::bf16, Dtype::f16}, {Layout::legacy, Layout::modern});
    const Drawn drawn = draw_seeds(model, 3000);
    EXPECT_EQ(drawn.dtypes, (std::set<Dtype>{Dtype::bf16, Dtype::f16}));
    EXPECT_EQ(drawn.layouts, (std::set<Layout>{Layout::legacy, Layout::modern}));
    EXPECT_GT(drawn.mixed_traces, 50u);
    EXPECT_GT(drawn.conversions, 100u);
    EXPECT_EQ(drawn.odd, 0u);
}

TEST(Domain, OddLayersOnlyWhenTheModelHasThem) {
    const ModelDomain model = model_of(2, 2, 4, {Dtype::f32}, {Layout::modern}, true);
    const Drawn drawn = draw_seeds(model, 2000);
    EXPECT_GT(drawn.odd, drawn.specs / 10);
}

TEST(Domain, TheFuzzDecoderAndTheUniformSwarmKeepToIt) {
    const ModelDomain model = model_of(2, 2, 8, {Dtype::f32, Dtype::bf16}, {Layout::modern});
    const WorkloadOptions options = declaring(model);
    Drawn drawn;
    std::vector<std::uint8_t> bytes(4096);
    for (std::uint64_t input = 1; input <= 500; ++input) {
        kvcheck::SeededChooser filler(input);
        for (std::uint8_t& byte : bytes) byte = static_cast<std::uint8_t>(filler.below(256));
        kvcheck::fuzz::ByteChooser ops(bytes.data(), bytes.size());
        note(drawn, model, kvcheck::fuzz::ops_trace(ops, options), "fuzz_ops input " + std::to_string(input));
        kvcheck::fuzz::ByteChooser layout(bytes.data(), bytes.size());
        note(drawn, model, kvcheck::fuzz::layout_trace(layout, options), "fuzz_layout input " + std::to_string(input));
        // The swarm RapidCheck's generators draw specs from (properties/generators.h).
        kvcheck::SeededChooser choose(input);
        const kvcheck::Swarm uniform = kvcheck::uniform_swarm(options);
        note(drawn, model, {kvcheck::op::Add{"a", kvcheck::random_cache_spec(choose, uniform, options)}}, "uniform swarm");
        note(drawn, model, kvcheck::generate_trace(choose, uniform, options), "uniform trace");
        if (HasFatalFailure()) return;
    }
    EXPECT_GT(drawn.specs, 1000u);
}

TEST(Domain, AnUndeclaredEngineStillGetsEveryShape) {
    Drawn drawn;
    std::size_t layer_counts_other_than_2 = 0;
    std::size_t unequal = 0;
    for (std::uint64_t seed = 1; seed <= 500; ++seed) {
        for (const CacheSpec& spec : specs_of(kvcheck::trace_for_seed(seed, WorkloadOptions{}))) {
            layer_counts_other_than_2 += spec.layers.size() != 2;
            for (const LayerSpec& layer : spec.layers) unequal += layer.tokens != spec.layers.front().tokens;
            EXPECT_EQ(kvcheck::spec_fault(ModelDomain{}, spec), "") << "an undeclared model holds every cache";
        }
    }
    EXPECT_GT(layer_counts_other_than_2, 100u);
    EXPECT_GT(unequal, 100u);
}

TEST(Domain, ALegacyOnlyEngineGetsNoModernCache) {
    WorkloadOptions options;
    options.capabilities.modern_layout = false;
    std::size_t specs = 0;
    for (std::uint64_t seed = 1; seed <= 2000; ++seed) {
        const Trace trace = kvcheck::trace_for_seed(seed, options);
        for (const CacheSpec& spec : specs_of(trace)) {
            ASSERT_EQ(spec.layout, Layout::legacy) << "seed " << seed;
            ++specs;
        }
        for (const kvcheck::Op& operation : trace) {
            ASSERT_FALSE(std::holds_alternative<kvcheck::op::ToLegacy>(operation)) << "seed " << seed;
            ASSERT_FALSE(std::holds_alternative<kvcheck::op::FromLegacy>(operation)) << "seed " << seed;
        }
    }
    EXPECT_GT(specs, 3000u);
    EXPECT_EQ(kvcheck::fresh_layout(options.capabilities), Layout::legacy);
    EXPECT_EQ(kvcheck::fresh_layout(Capabilities{}), Layout::modern);
    // A modern cache (a replayed trace's) is not supported: its operation is skipped.
    const CacheSpec modern = kvcheck::parse_cache_spec("modern/f32/1:[kv2]");
    EXPECT_FALSE(kvcheck::engine_supports(options.capabilities, modern));
    EXPECT_TRUE(kvcheck::engine_supports(options.capabilities, kvcheck::parse_cache_spec("legacy/f32/1:[kv2]")));
}

TEST(Domain, SpecFaultNamesWhatLeavesTheModel) {
    const ModelDomain model = model_of(2, 2, 8, {Dtype::f32}, {Layout::modern});
    EXPECT_EQ(kvcheck::spec_fault(model, kvcheck::parse_cache_spec("modern/f32/1/2x8:[kv3 kv3]")), "");
    const std::vector<std::pair<std::string, std::string>> outside = {
        {"modern/f32/1/2x8:[kv3]", "1 layers, not 2"},
        {"modern/f32/1/2x8:[kv3 kv2]", "layer 1 holds 2 tokens, layer 0 3"},
        {"modern/f32/1/2x8:[kv0 kv0]", "layer 0 holds no token"},
        {"modern/f32/1/2x8:[kv3 k3]", "layer 1 is odd"},
        {"modern/f32/1/2x8:[kv3 kv~3]", "layer 1 is odd"},
        {"modern/f32/1/2x8:[kv3 KV3]", "layer 1 is odd"},
        {"modern/f32/1:[kv3 kv3]", "geometry 2x4, not 2x8"},
        {"modern/bf16/1/2x8:[kv3 kv3]", "dtype bf16 is not the model's"},
        {"legacy/f32/1/2x8:[kv3 kv3]", "layout legacy is not the model's"},
    };
    for (const auto& [text, fault] : outside) EXPECT_EQ(kvcheck::spec_fault(model, kvcheck::parse_cache_spec(text)), fault) << text;
}

// Shrinking keeps a declared model's caches in it: the oracle fails on any
// trace that still adds or makes a cache, so the shrinker pushes every
// spec as far toward "nothing" as it is let.
TEST(Domain, ShrinkingStaysInTheModel) {
    const ModelDomain model = model_of(2, 2, 8, {Dtype::bf16, Dtype::f32}, {Layout::legacy});
    const WorkloadOptions options = declaring(model);
    const kvcheck::Oracle oracle = [](const Trace& trace) -> std::optional<kvcheck::Failure> {
        for (std::size_t step = 0; step < trace.size(); ++step) {
            if (!specs_of({trace[step]}).empty()) return kvcheck::Failure{"synthetic", step, "holds a cache", {}};
        }
        return std::nullopt;
    };
    kvcheck::ShrinkOptions shrinking;
    shrinking.model = model;
    std::size_t shrunk = 0;
    for (std::uint64_t seed = 1; seed <= 200; ++seed) {
        const Trace trace = kvcheck::trace_for_seed(seed, options);
        const std::optional<kvcheck::Failure> failure = oracle(trace);
        if (!failure) continue;
        const kvcheck::ShrinkResult result = kvcheck::shrink(trace, *failure, oracle, shrinking);
        ASSERT_EQ(result.trace.size(), 1u) << kvcheck::format_trace(result.trace);
        const CacheSpec spec = specs_of(result.trace).front();
        expect_in_model(model, spec, "shrunk from seed " + std::to_string(seed));
        EXPECT_EQ(spec.layers.front().tokens, 1) << "tokens shrink together, down to 1";
        EXPECT_EQ(spec.dtype, Dtype::bf16) << "the model's first dtype is its plainest";
        ++shrunk;
    }
    EXPECT_GT(shrunk, 150u);
    // Undeclared, the same shrink goes where the model would not.
    const Trace trace = {kvcheck::op::Add{"a", kvcheck::parse_cache_spec("legacy/bf16/5/2x8:[kv3 kv3]")}};
    const kvcheck::ShrinkResult wide = kvcheck::shrink(trace, *oracle(trace), oracle);
    EXPECT_EQ(kvcheck::format_trace(wide.trace), "add a modern/f32/0:[]\n");
}

TEST(Domain, DeclarationsAreChecked) {
    EXPECT_EQ(kvcheck::capabilities_fault(Capabilities{}), "");
    Capabilities none;
    none.modern_layout = none.legacy_layout = false;
    EXPECT_EQ(kvcheck::capabilities_fault(none), "modern_layout and legacy_layout are both false: the engine takes no cache at all");
    WorkloadOptions options;
    options.capabilities = none;
    kvcheck::SeededChooser choose(1);
    EXPECT_THROW(kvcheck::random_swarm(choose, options), std::invalid_argument);
    const auto fault_of = [](ModelDomain model, const std::function<void(Capabilities&)>& engine = nullptr) {
        Capabilities c;
        c.model = std::move(model);
        if (engine) engine(c);
        return kvcheck::capabilities_fault(c);
    };
    const ModelDomain good = model_of(2, 2, 8, {Dtype::f32}, {Layout::modern});
    EXPECT_EQ(fault_of(good), "");
    ModelDomain bad = good;
    bad.layers = 0;
    EXPECT_EQ(fault_of(bad), "model: 'layers' must be in [1, 1024], not 0");
    bad = good;
    bad.heads = 0;
    EXPECT_EQ(fault_of(bad), "model: 'heads' must be in [1, 256], not 0");
    bad = good;
    bad.head_dim = 2048;
    EXPECT_EQ(fault_of(bad), "model: 'head_dim' must be in [1, 1024], not 2048");
    bad = good;
    bad.dtypes.clear();
    EXPECT_EQ(fault_of(bad), "model: 'dtypes' is empty (give at least one of f32, f16, bf16)");
    bad = good;
    bad.dtypes = {Dtype::f32, Dtype::f32};
    EXPECT_EQ(fault_of(bad), "model: 'dtypes' names a dtype twice");
    bad = good;
    bad.layouts.clear();
    EXPECT_EQ(fault_of(bad), "model: 'layouts' is empty (give modern, legacy or both)");
    EXPECT_EQ(fault_of(good, [](Capabilities& c) { c.modern_layout = false; }),
              "model: 'layouts' holds modern, but the engine's modern_layout capability is false");
    EXPECT_EQ(fault_of(model_of(2, 2, 4, {Dtype::f16}, {Layout::modern}), [](Capabilities& c) { c.half_dtypes = false; }),
              "model: 'dtypes' holds f16, but the engine's half_dtypes capability is false");
    EXPECT_EQ(fault_of(good, [](Capabilities& c) { c.any_geometry = false; }),
              "model: 'heads' x 'head_dim' is 2x8, but the engine's any_geometry capability is false (it takes 2x4 only)");
}

TEST(Domain, TheCommandLineTextParsesStrictly) {
    const ModelDomain model = kvcheck::parse_model_domain("layers=2,heads=2,head_dim=8,dtype=f32+bf16,layout=modern+legacy");
    EXPECT_TRUE(model.declared);
    EXPECT_EQ(kvcheck::domain_text(model), "layers=2 heads=2 head_dim=8 dtype=f32+bf16 layout=modern+legacy");
    EXPECT_EQ(kvcheck::domain_text(kvcheck::parse_model_domain("layers=3,dtype=f16,layout=legacy,odd_layers=yes")),
              "layers=3 heads=2 head_dim=4 dtype=f16 layout=legacy odd_layers=yes");
    EXPECT_EQ(kvcheck::domain_text(ModelDomain{}), "any (undeclared)");
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"layers=2,dtype=f32", "'layout' is missing"},
        {"layers=2,layout=modern", "'dtype' is missing"},
        {"dtype=f32,layout=modern", "'layers' is missing"},
        {"layers=two,dtype=f32,layout=modern", "'layers' takes a whole number, not 'two'"},
        {"layers=-1,dtype=f32,layout=modern", "'layers' takes a whole number, not '-1'"},
        {"layers=0,dtype=f32,layout=modern", "'layers' must be in [1, 1024], not 0"},
        {"layers=2,heads=0,dtype=f32,layout=modern", "'heads' must be in [1, 256], not 0"},
        {"layers=2,dtype=f64,layout=modern", "'dtype': unknown value 'f64'"},
        {"layers=2,dtype=f32+,layout=modern", "'dtype': unknown value ''"},
        {"layers=2,dtype=f32+f32,layout=modern", "'dtype' names 'f32' twice"},
        {"layers=2,dtype=f32,layout=paged", "'layout': unknown value 'paged'"},
        {"layers=2,dtype=f32,layout=modern,odd_layers=maybe", "'odd_layers' takes yes or no, not 'maybe'"},
        {"layers=2,dtype=f32,layout=modern,colour=red", "unknown key 'colour' (known: layers, heads, head_dim, dtype, layout, odd_layers)"},
        {"layers=2,layers=3,dtype=f32,layout=modern", "'layers' is given twice"},
        {"layers,dtype=f32,layout=modern", "'layers' is not key=value"},
    };
    for (const auto& [text, fault] : bad) {
        try {
            kvcheck::parse_model_domain(text);
            ADD_FAILURE() << text << " parsed";
        } catch (const std::invalid_argument& error) {
            EXPECT_EQ(std::string(error.what()), fault) << text;
        }
    }
}

}  // namespace
