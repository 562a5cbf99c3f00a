// The layout target: arbitrary cache specs (random_cache_spec through the
// chooser, or a text trace) made, stored, cloned, converted, merged, dumped
// and loaded, checked two ways:
// - by the executor, against the auditor's expected content (expected_view
//   of expected_to_legacy, expected_concat, ...), after every step;
// - by round trips that need no model of the expected result: for every
//   cache the trace makes or adds, on a fresh engine, a clone must look
//   exactly like its source, legacy -> modern -> legacy must give back the
//   same view, and modern -> legacy -> modern and a one-part concat must
//   keep what a model sees (the logical keys and values of every layer).
// A round-trip violation is reported as layout-roundtrip at the step that
// made the cache, and shrinks like any other.
#include "generators.h"
#include "trace_target.h"

#include <optional>
#include <string>
#include <variant>

namespace {

using namespace kvcheck;

// What a model sees of one side of a layer: empty (absent or no elements),
// or dtype, shape and content.
struct LogicalSlot {
    bool empty = true;
    SlotView view;
    friend bool operator==(const LogicalSlot& a, const LogicalSlot& b) {
        return a.empty == b.empty && (a.empty || a.view == b.view);
    }
};

LogicalSlot logical(const SlotView& slot) {
    std::int64_t elements = slot.present ? 1 : 0;
    for (std::int64_t dim : slot.shape) elements *= dim;
    if (elements == 0) return {};
    return {false, slot};
}

// The keys (side 0) or values (side 1) a model sees in layer `layer`, by
// the rule of docs/semantics.md#logical-content (kvcheck::logical_slot, on views).
LogicalSlot logical_side(const CacheView& view, std::size_t layer, int side) {
    const LayerView& l = view.layers[layer];
    if (view.layout == Layout::legacy) return logical(l.slots[side]);
    if (!l.initialized) return {};
    const SlotView& modern = l.slots[side == 0 ? keys : values];
    return logical(modern.present ? modern : l.slots[side == 0 ? key_cache : value_cache]);
}

// The first logical difference, as "layer 1 values"; empty when equal.
std::string logical_difference(const CacheView& actual, const CacheView& expected) {
    if (actual.layers.size() != expected.layers.size()) {
        return std::to_string(actual.layers.size()) + " layers, expected " + std::to_string(expected.layers.size());
    }
    for (std::size_t i = 0; i < actual.layers.size(); ++i) {
        for (int side : {0, 1}) {
            if (!(logical_side(actual, i, side) == logical_side(expected, i, side))) {
                return "layer " + std::to_string(i) + (side == 0 ? " keys" : " values") + " differ";
            }
        }
    }
    return {};
}

// The round trips of one cache on a fresh engine; the first violation as
// text, empty when all hold.
std::string roundtrip_violation(Engine& engine, const CacheContent& content) {
    const Capabilities c = engine.capabilities();
    engine.make(content, 1);
    const CacheView source = engine.view_handle(1);
    engine.clone(1, 2);
    std::string difference = view_difference(engine.view_handle(2), source);
    if (!difference.empty()) return "clone differs from its source: " + difference;
    engine.concat({1}, 3);
    difference = logical_difference(engine.view_handle(3), source);
    if (!difference.empty()) return "a one-part concat changed what a model sees: " + difference;
    if (!c.conversions || !c.legacy_layout) return {};
    if (content.layout == Layout::legacy) {
        engine.from_legacy(1, 4);
        engine.to_legacy(4, 5);
        difference = view_difference(engine.view_handle(5), source);
        return difference.empty() ? "" : "legacy -> modern -> legacy changed the cache: " + difference;
    }
    engine.to_legacy(1, 4);
    engine.from_legacy(4, 5);
    difference = logical_difference(engine.view_handle(5), source);
    if (!difference.empty()) return "modern -> legacy -> modern changed what a model sees: " + difference;
    engine.to_legacy(5, 6);
    difference = view_difference(engine.view_handle(6), engine.view_handle(4));
    return difference.empty() ? "" : "a second modern -> legacy conversion differs from the first: " + difference;
}

const CacheSpec* spec_of(const Op& op) {
    if (const auto* add = std::get_if<op::Add>(&op)) return &add->cache;
    if (const auto* make = std::get_if<op::Make>(&op)) return &make->cache;
    return nullptr;
}

RunResult check_layout(const Trace& trace, const EngineFactory& make, const RunOptions& options) {
    RunResult result = fuzz::execute_fresh(trace, make, options);
    if (result.failure) return result;
    for (std::size_t step = 0; step < trace.size() && step < result.steps_run; ++step) {
        const CacheSpec* spec = spec_of(trace[step]);
        if (spec == nullptr) continue;
        std::string violation;
        try {
            violation = roundtrip_violation(*make(), expand(*spec));
        } catch (const std::exception& error) {
            result.failure = Failure{engine_error_id, step, std::string("round trip: the engine threw: ") + error.what(), {}};
            return result;
        }
        if (!violation.empty()) {
            result.failure = Failure{property_id(Property::layout_roundtrip), step, "round trip of this cache: " + violation, {}};
            return result;
        }
    }
    return result;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    fuzz::TraceTarget target;
    target.name = "layout";
    target.workload = fuzz::layout_workload();
    target.generate = fuzz::layout_trace;
    target.check = check_layout;
    fuzz::init_target(argc, argv, std::move(target));
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return fuzz::run_input(data, size);
}
