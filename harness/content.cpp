// Expected content and views: the auditor's side of every cache. Mirrors the
// semantics of docs/semantics.md#cache-layouts and #operations on segment
// lists instead of tensors. The content model itself is defined in
// kvcheck/content.h.
#include "kvcheck/content.h"

#include "kvcheck/splitmix.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvcheck {
namespace {

std::uint64_t slot_seed(std::uint64_t cache_seed, std::size_t layer, int slot) {
    return splitmix64(splitmix64(cache_seed) ^ (layer * 0x100000001B3ull) ^ static_cast<std::uint64_t>(slot + 1));
}

bool has_any_slot(const CacheContent& content) {
    for (const LayerContent& layer : content.layers) {
        for (const SlotContent& slot : layer.slots) {
            if (slot.present) return true;
        }
    }
    return false;
}

// The dtype tensors of this content have: its own when it holds any tensor,
// else float32 (what an engine gives a cache it has no tensor to copy from).
Dtype effective_dtype(const CacheContent& content) {
    return has_any_slot(content) ? content.dtype : Dtype::f32;
}

SlotContent empty_present() {
    SlotContent slot;
    slot.present = true;
    return slot;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string text = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? "," : "") + std::to_string(shape[i]);
    return text + "]";
}

}  // namespace

std::int64_t SlotContent::tokens() const {
    std::int64_t total = 0;
    for (const Segment& segment : segments) total += segment.tokens;
    return total;
}

CacheContent expand(const CacheSpec& spec) {
    CacheContent content;
    content.layout = spec.layout;
    content.dtype = spec.dtype;
    content.heads = spec.heads;
    content.head_dim = spec.head_dim;
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        const LayerSpec& layer_spec = spec.layers[i];
        LayerContent layer;
        const bool legacy = spec.layout == Layout::legacy;
        layer.initialized = legacy || layer_spec.initialized;
        for (int s = 0; s < slot_count; ++s) {
            const bool present = legacy ? s < 2 : (layer_spec.slots >> s) & 1;
            if (!present) continue;
            SlotContent& slot = layer.slots[s];
            slot.present = true;
            if (layer_spec.tokens > 0) slot.segments.push_back({slot_seed(spec.seed, i, s), layer_spec.tokens, spec.dtype});
        }
        content.layers.push_back(std::move(layer));
    }
    return content;
}

namespace {

// float16: 10 mantissa bits, exponents -14..15, subnormals in steps of
// 2^-24. Done on the bits so that it depends on no rounding mode.
float round_to_f16(float value) {
    const std::uint32_t bits = bits_of(value);
    const std::uint32_t sign = bits & 0x80000000u;
    std::uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return float_of(sign | 0x7FC00000u);  // NaN
    // 65520 is halfway between 65504 (the largest float16) and 2^16: the
    // tie goes to the even side, which is infinity; so does all beyond.
    if (magnitude >= 0x477FF000u) return float_of(sign | 0x7F800000u);
    const int exponent = static_cast<int>(magnitude >> 23) - 127;
    if (exponent >= -14) {
        // Normal in float16: drop 13 mantissa bits, ties to even; a carry
        // into the exponent is the right result.
        magnitude += 0xFFFu + ((magnitude >> 13) & 1u);
        return float_of(sign | (magnitude & ~0x1FFFu));
    }
    // Subnormal (or zero) in float16: a whole number of 2^-24. The value is
    // significand * 2^(exponent - 23), that is significand >> shift units,
    // with shift = -1 - exponent >= 14. Below 2^-25 (a float32 subnormal
    // too) is less than half a unit: zero.
    if (exponent < -25) return float_of(sign);
    const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    const int shift = -1 - exponent;
    std::uint32_t units = significand >> shift;
    const std::uint32_t rest = significand & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (units & 1u))) ++units;
    return float_of(sign | bits_of(static_cast<float>(units) * 0x1p-24f));
}

// bfloat16: the top 16 bits of the float32, rounded to nearest, ties to
// even, by adding 0x7FFF plus the lowest kept bit (a carry into the
// exponent, up to infinity, is the right result).
float round_to_bf16(float value) {
    const std::uint32_t bits = bits_of(value);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return float_of(0x7FC00000u);  // NaN, as torch makes it
    const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
    return float_of(rounded & 0xFFFF0000u);
}

}  // namespace

namespace {

// slot_value's element index: head, token and dim in disjoint bit ranges.
std::uint64_t element_index(std::int64_t head, std::int64_t token, std::int64_t dim) {
    return (static_cast<std::uint64_t>(head) << 40) ^ (static_cast<std::uint64_t>(token) << 16) ^
           static_cast<std::uint64_t>(dim);
}

// The biased exponent field of slot_value for each r = (x >> 32) & 0xFF.
// Mostly [1/8, 4); one in sixteen [2^8, 2^12); one in sixteen
// [2^-26, 2^-14), float16's subnormals (kvcheck/content.h says why).
constexpr std::uint32_t exponent_field(std::uint32_t r) {
    const int exponent = r < 224 ? static_cast<int>(r % 5) - 3 : r < 240 ? 8 + static_cast<int>(r % 4) : -26 + static_cast<int>(r % 12);
    return static_cast<std::uint32_t>(exponent + 127);
}

// slot_value's float32 bits from x = splitmix64(seed ^ splitmix64(index)).
std::uint32_t value_bits(std::uint64_t x) {
    const auto sign = static_cast<std::uint32_t>(x >> 63);
    const auto mantissa = static_cast<std::uint32_t>(x & 0x7FFFFFu);
    const auto r = static_cast<std::uint32_t>((x >> 32) & 0xFFu);
    return sign << 31 | exponent_field(r) << 23 | mantissa;
}

// slot_value of each of indices[0, count) into out;
// `done` is where it stopped (a multiple of 8): the rest is the caller's.
// Eight at a time in AVX-512 registers (its 64-bit multiply, as in
// add_terms_avx512), r % 5 and r % 12 by multiply and shift (exact for
// r < 256: tests/content_test.cpp compares every value with slot_value).
#if defined(__x86_64__) && defined(__GNUC__)
#define KVCHECK_SLOT_VALUES_AVX512 1
using Lanes8 = std::uint64_t __attribute__((vector_size(64)));
using Lanes8x32 = std::uint32_t __attribute__((vector_size(32)));

__attribute__((target("avx512f,avx512dq"))) Lanes8 splitmix64_lanes(Lanes8 x) {
    x += splitmix64_increment;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__attribute__((target("avx512f,avx512dq"))) void value_bits_avx512(std::uint64_t seed, const std::uint64_t* indices,
                                                                  std::size_t count, float* out,
                                                                  std::size_t& done) {
    std::size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        Lanes8 index;
        std::memcpy(&index, indices + i, sizeof index);
        const Lanes8 x = splitmix64_lanes(seed ^ splitmix64_lanes(index));
        const Lanes8 r = (x >> 32) & 0xFFu;
        const Lanes8 mod5 = r - ((r * 205u) >> 10) * 5u;
        const Lanes8 mod12 = r - ((r * 171u) >> 11) * 12u;
        const Lanes8 below224 = reinterpret_cast<Lanes8>(r < 224u);  // all ones where true
        const Lanes8 below240 = reinterpret_cast<Lanes8>(r < 240u);
        const Lanes8 field = ((mod5 + 124u) & below224) |
                             (~below224 & (((r & 3u) + 135u) & below240)) | (~below240 & (mod12 + 101u));
        const Lanes8 bits = (x >> 63) << 31 | field << 23 | (x & 0x7FFFFFu);
        const Lanes8x32 narrow = __builtin_convertvector(bits, Lanes8x32);
        std::memcpy(out + i, &narrow, sizeof narrow);
    }
    done = i;
}
#endif

// round_to(dtype, v) of every value, in place; the switch once, not per value.
void round_all(Dtype dtype, float* values, std::size_t count) {
    switch (dtype) {
        case Dtype::f32: return;
        case Dtype::f16:
            for (std::size_t i = 0; i < count; ++i) values[i] = round_to_f16(values[i]);
            return;
        case Dtype::bf16:
            for (std::size_t i = 0; i < count; ++i) values[i] = round_to_bf16(values[i]);
            return;
    }
}

// One segment's values for one head (tokens x head_dim, row-major) into
// out, rounded to the segment's precision. `indices` is scratch.
void fill_segment_head(const Segment& segment, std::int64_t head, std::int64_t head_dim, float* out,
                       std::vector<std::uint64_t>& indices) {
    const auto count = static_cast<std::size_t>(segment.tokens * head_dim);
    indices.resize(count);
    std::size_t at = 0;
    for (std::int64_t t = 0; t < segment.tokens; ++t) {
        for (std::int64_t d = 0; d < head_dim; ++d) indices[at++] = element_index(head, segment.first + t, d);
    }
    std::size_t done = 0;
#ifdef KVCHECK_SLOT_VALUES_AVX512
    if (count >= 8 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) {
        value_bits_avx512(segment.seed, indices.data(), count, out, done);
    }
#endif
    for (std::size_t i = done; i < count; ++i) out[i] = float_of(value_bits(splitmix64(segment.seed ^ splitmix64(indices[i]))));
    round_all(segment.precision, out, count);
}

}  // namespace

float slot_value(std::uint64_t seed, std::int64_t head, std::int64_t token, std::int64_t dim) {
    return float_of(value_bits(splitmix64(seed ^ splitmix64(element_index(head, token, dim)))));
}

float round_to(Dtype dtype, float value) {
    round_all(dtype, &value, 1);
    return value;
}

void fill_slot(const SlotContent& slot, std::int64_t heads, std::int64_t head_dim, std::vector<float>& out) {
    const std::int64_t total = slot.tokens();
    out.resize(static_cast<std::size_t>(heads * total * head_dim));
    std::vector<std::uint64_t> indices;
    float* at = out.data();
    for (std::int64_t head = 0; head < heads; ++head) {
        for (const Segment& segment : slot.segments) {
            fill_segment_head(segment, head, head_dim, at, indices);
            at += segment.tokens * head_dim;
        }
    }
}

namespace {

// The sum of the terms of values[from, count), starting from `sum`.
std::uint64_t add_terms(const float* values, std::size_t from, std::size_t count, std::uint64_t sum) {
    for (std::size_t i = from; i < count; ++i) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, values + i, sizeof bits);
        if (bits == 0x80000000u) bits = 0;
        sum += splitmix64(static_cast<std::uint64_t>(i) << 32 | bits);
    }
    return sum;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KVCHECK_CONTENT_HASH_AVX512 1

using Words8 = std::uint64_t __attribute__((vector_size(64)));
using Bits8 = std::uint32_t __attribute__((vector_size(32)));

// add_terms of the first count - count % 8 values, eight at a time in
// AVX-512 registers (its 64-bit multiply, which AVX2 lacks, is what makes
// this faster than the scalar loop); `done` is where it stopped. Compiled
// for AVX-512 whatever the build's target: called only where the CPU has
// it.
__attribute__((target("avx512f,avx512dq"))) std::uint64_t add_terms_avx512(const float* values, std::size_t count,
                                                                          std::size_t& done) {
    Words8 sums{};
    Words8 positions{};
    for (int k = 0; k < 8; ++k) positions[k] = static_cast<std::uint64_t>(k) << 32;
    std::size_t i = 0;
    for (; i + 8 <= count; i += 8) {
        Bits8 bits;
        std::memcpy(&bits, values + i, sizeof bits);
        bits &= ~(bits == 0x80000000u);  // -0 is +0
        Words8 x = __builtin_convertvector(bits, Words8) | positions;
        x += splitmix64_increment;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        sums += x ^ (x >> 31);
        positions += std::uint64_t{8} << 32;
    }
    done = i;
    std::uint64_t sum = 0;
    for (int k = 0; k < 8; ++k) sum += sums[k];
    return sum;
}
#endif

}  // namespace

// One term per value, summed: a term is splitmix64 of the value's position
// in the high 32 bits and its float32 pattern (-0 read as +0, the same
// content) in the low 32. splitmix64 is a bijection, so a changed value
// always changes its term and so the sum. The terms are independent of each
// other, so there is no chain of multiplies, and a vector language (numpy)
// computes the same hash in a few whole-array operations. The sum does not
// depend on the order the terms are added in: the AVX-512 loop and the
// scalar one give the same hash.
std::uint64_t content_hash(const float* values, std::size_t count) {
    std::uint64_t sum = 0;
    std::size_t done = 0;
#ifdef KVCHECK_CONTENT_HASH_AVX512
    if (count >= 8 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) {
        sum = add_terms_avx512(values, count, done);
    }
#endif
    sum = add_terms(values, done, count, sum);
    return splitmix64(sum ^ splitmix64(count));
}

namespace {

// A present slot as a correct engine reports it.
struct ExpectedSlot {
    Dtype dtype;
    std::array<std::int64_t, 4> shape;
    std::size_t dims;
    std::uint64_t hash;  // content_hash of its values
    const std::vector<float>* values;
};

// What a correct engine reports for `content`, in the order a view lists
// it: on_layer(initialized) for each layer, then for each of its slots
// on_slot(nullptr) when absent, else on_slot(&slot).
template <typename OnLayer, typename OnSlot>
void walk_expected(const CacheContent& content, OnLayer&& on_layer, OnSlot&& on_slot) {
    const Dtype dtype = effective_dtype(content);
    std::vector<float> values;
    for (const LayerContent& layer : content.layers) {
        on_layer(content.layout == Layout::legacy || layer.initialized);
        for (const SlotContent& slot : layer.slots) {
            if (!slot.present) {
                on_slot(static_cast<const ExpectedSlot*>(nullptr));
                continue;
            }
            const std::int64_t tokens = slot.tokens();
            fill_slot(slot, content.heads, content.head_dim, values);
            // In the dtype the slot has: a segment of a wider precision
            // than its slot is rounded once more (a merge never makes one).
            round_all(dtype, values.data(), values.size());
            const std::uint64_t hash = content_hash(values.data(), values.size());
            const ExpectedSlot expected =
                tokens == 0 ? ExpectedSlot{dtype, {0}, 1, hash, &values}
                            : ExpectedSlot{dtype, {cache_batch, content.heads, tokens, content.head_dim}, 4, hash, &values};
            on_slot(&expected);
        }
    }
}

}  // namespace

CacheView expected_view(const CacheContent& content, bool values) {
    CacheView view;
    view.layout = content.layout;
    int slot = 0;
    walk_expected(
        content,
        [&](bool initialized) {
            view.layers.emplace_back();
            view.layers.back().initialized = initialized;
            slot = 0;
        },
        [&](const ExpectedSlot* expected) {
            SlotView& slot_view = view.layers.back().slots[slot++];
            slot_view.present = expected != nullptr;
            if (expected == nullptr) return;
            slot_view.dtype = expected->dtype;
            slot_view.shape.assign(expected->shape.begin(), expected->shape.begin() + expected->dims);
            slot_view.hash = expected->hash;
            if (values) slot_view.values = *expected->values;
        });
    return view;
}

std::uint64_t expected_digest(const CacheContent& content) {
    ViewDigest digest(content.layout, content.layers.size());
    walk_expected(
        content, [&](bool initialized) { digest.layer(initialized); },
        [&](const ExpectedSlot* expected) {
            if (expected == nullptr) {
                digest.absent_slot();
            } else {
                digest.slot(expected->dtype, expected->shape.data(), expected->dims, expected->hash);
            }
        });
    return digest.value();
}

ViewDigest::ViewDigest(Layout layout, std::size_t layers) : hash_(splitmix64(0x5649455744494745ull)) {
    mix(static_cast<std::uint64_t>(layout));
    mix(layers);
}

void ViewDigest::mix(std::uint64_t word) { hash_ = splitmix64(hash_ ^ word); }

void ViewDigest::layer(bool initialized) { mix(initialized ? 0x11 : 0x10); }

void ViewDigest::absent_slot() { mix(0x20); }

void ViewDigest::slot(Dtype dtype, const std::int64_t* shape, std::size_t dims, std::uint64_t hash) {
    const bool empty = dims == 1 && shape[0] == 0;  // its dtype is not compared (view_difference)
    mix(0x21 + (empty ? 0 : 0x100 * (static_cast<std::uint64_t>(dtype) + 1)));
    mix(dims);
    for (std::size_t d = 0; d < dims; ++d) mix(static_cast<std::uint64_t>(shape[d]));
    mix(hash);
}

std::uint64_t view_digest(const CacheView& view) {
    ViewDigest digest(view.layout, view.layers.size());
    for (const LayerView& layer : view.layers) {
        digest.layer(layer.initialized);
        for (const SlotView& slot : layer.slots) {
            if (slot.present) {
                digest.slot(slot.dtype, slot.shape.data(), slot.shape.size(), slot.hash);
            } else {
                digest.absent_slot();
            }
        }
    }
    return digest.value();
}

bool ContentTolerance::within(float value, float expected) const {
    if (value == expected) return true;  // infinities too; a NaN never is
    const double difference = std::fabs(static_cast<double>(value) - static_cast<double>(expected));
    return difference <= abs + rel * std::fabs(static_cast<double>(expected));
}

namespace {

// A slot whose hash differs, compared value by value within `tolerance`:
// empty when every value is within it.
std::string values_difference(const SlotView& actual, const SlotView& expected, const ContentTolerance& tolerance) {
    if (actual.values.size() != expected.values.size()) {
        return "content differs (the adapter reported " + std::to_string(actual.values.size()) + " values of " +
               std::to_string(expected.values.size()) + "; an engine with a content tolerance reports a slot's values)";
    }
    for (std::size_t i = 0; i < actual.values.size(); ++i) {
        if (tolerance.within(actual.values[i], expected.values[i])) continue;
        char text[160];
        std::snprintf(text, sizeof text, "content differs beyond the tolerance at element %zu: %.9g, expected %.9g (abs %g, rel %g)", i,
                      static_cast<double>(actual.values[i]), static_cast<double>(expected.values[i]), tolerance.abs, tolerance.rel);
        return text;
    }
    return {};
}

}  // namespace

std::string view_difference(const CacheView& actual, const CacheView& expected, const ContentTolerance& tolerance) {
    if (actual.layout != expected.layout) {
        return std::string("layout is ") + layout_name(actual.layout) + ", expected " + layout_name(expected.layout);
    }
    if (actual.layers.size() != expected.layers.size()) {
        return std::to_string(actual.layers.size()) + " layers, expected " + std::to_string(expected.layers.size());
    }
    // The texts are built only for a difference: this runs for every entry a
    // step reads, and equal views are the rule.
    for (std::size_t i = 0; i < actual.layers.size(); ++i) {
        const auto layer = [i] { return "layer " + std::to_string(i); };
        const LayerView& a = actual.layers[i];
        const LayerView& e = expected.layers[i];
        if (a.initialized != e.initialized) {
            return layer() + (e.initialized ? " is not initialized" : " is initialized") + ", expected " +
                   (e.initialized ? "initialized" : "uninitialized");
        }
        for (int s = 0; s < slot_count; ++s) {
            const SlotView& x = a.slots[s];
            const SlotView& y = e.slots[s];
            const auto where = [&] { return layer() + " " + slot_name(static_cast<Slot>(s)); };
            if (x.present != y.present) return where() + (y.present ? " is missing" : " is present, expected absent");
            if (!x.present) continue;
            // An empty slot's dtype carries nothing: update replaces or
            // re-creates it from the new tokens. Merges of tensor-less parts
            // leave it to the engine, so it is not compared.
            const bool empty = y.shape.size() == 1 && y.shape.front() == 0;
            if (x.dtype != y.dtype && !empty) {
                return where() + " dtype " + dtype_name(x.dtype) + ", expected " + dtype_name(y.dtype);
            }
            if (x.shape != y.shape) return where() + " shape " + shape_text(x.shape) + ", expected " + shape_text(y.shape);
            if (x.hash == y.hash) continue;
            if (!tolerance.declared()) return where() + " content differs";
            const std::string values = values_difference(x, y, tolerance);
            if (!values.empty()) return where() + " " + values;
        }
    }
    return {};
}

SlotContent logical_slot(const CacheContent& content, std::size_t layer, Slot side) {
    if (layer >= content.layers.size()) return {};
    const LayerContent& l = content.layers[layer];
    if (content.layout == Layout::legacy) return l.slots[side];
    if (!l.initialized) return {};
    const Slot modern = side == keys ? keys : values;
    const Slot legacy_named = side == keys ? key_cache : value_cache;
    return l.slots[modern].present ? l.slots[modern] : l.slots[legacy_named];
}

bool merged_geometry_ok(const std::vector<CacheContent>& parts) {
    const CacheContent* first = nullptr;
    for (const CacheContent& part : parts) {
        if (!content_holds_tokens(part)) continue;
        if (first == nullptr) first = &part;
        if (part.heads != first->heads || part.head_dim != first->head_dim) return false;
    }
    return true;
}

bool dtypes_mixed(const std::vector<CacheContent>& parts) {
    const CacheContent* first = nullptr;
    for (const CacheContent& part : parts) {
        if (!has_any_slot(part)) continue;
        if (first == nullptr) first = &part;
        if (part.dtype != first->dtype) return true;
    }
    return false;
}

CacheContent expected_concat(const std::vector<CacheContent>& parts) {
    CacheContent merged;
    bool all_legacy = true;
    std::size_t layers = 0;
    bool dtype_known = false;
    bool geometry_known = false;
    for (const CacheContent& part : parts) {
        // The geometry of the parts that hold tokens (merged_geometry_ok),
        // else of the first part.
        if (!geometry_known && (content_holds_tokens(part) || &part == &parts.front())) {
            merged.heads = part.heads;
            merged.head_dim = part.head_dim;
            geometry_known = content_holds_tokens(part);
        }
        all_legacy = all_legacy && part.layout == Layout::legacy;
        layers = std::max(layers, part.layers.size());
        if (!has_any_slot(part)) continue;
        if (!dtype_known) {
            merged.dtype = part.dtype;
            dtype_known = true;
        } else if (merged.dtype != part.dtype) {
            merged.dtype = Dtype::f32;  // torch promotes f16 with bf16 to f32, and anything with f32
        }
    }
    merged.layout = all_legacy ? Layout::legacy : Layout::modern;
    for (std::size_t i = 0; i < layers; ++i) {
        LayerContent layer;
        layer.initialized = true;
        for (Slot side : {keys, values}) {
            SlotContent slot = empty_present();
            for (const CacheContent& part : parts) {
                const SlotContent piece = logical_slot(part, i, side);
                if (piece.present) slot.segments.insert(slot.segments.end(), piece.segments.begin(), piece.segments.end());
            }
            layer.slots[side] = std::move(slot);
        }
        merged.layers.push_back(std::move(layer));
    }
    return merged;
}

CacheContent expected_to_legacy(const CacheContent& content) {
    CacheContent legacy;
    legacy.layout = Layout::legacy;
    legacy.dtype = content.dtype;
    legacy.heads = content.heads;
    legacy.head_dim = content.head_dim;
    for (std::size_t i = 0; i < content.layers.size(); ++i) {
        LayerContent layer;
        for (Slot side : {keys, values}) {
            const SlotContent logical = logical_slot(content, i, side);
            layer.slots[side] = logical.present ? logical : empty_present();
        }
        legacy.layers.push_back(std::move(layer));
    }
    // A cache with no tensor at all converts to float32 empty slots.
    if (!has_any_slot(content)) legacy.dtype = Dtype::f32;
    return legacy;
}

CacheContent expected_trim(const CacheContent& content, std::int64_t keep) {
    CacheContent trimmed = content;
    for (LayerContent& layer : trimmed.layers) {
        for (SlotContent& slot : layer.slots) {
            // A prefix of a segment holds the segment's first values: its
            // tokens are counted from its own first token.
            std::int64_t left = keep;
            std::vector<Segment> kept;
            for (Segment segment : slot.segments) {
                if (left == 0) break;
                segment.tokens = std::min(segment.tokens, left);
                left -= segment.tokens;
                kept.push_back(segment);
            }
            slot.segments = std::move(kept);
        }
    }
    return trimmed;
}

CacheContent expected_window(const CacheContent& content, std::int64_t window) {
    if (window < 1) throw std::invalid_argument("expected_window: the window must be at least 1, got " + std::to_string(window));
    CacheContent windowed = content;
    for (LayerContent& layer : windowed.layers) {
        for (SlotContent& slot : layer.slots) {
            // Drop tokens from the front, segment by segment: a segment cut
            // inside keeps its last tokens, counted on from where it was cut.
            std::int64_t drop = std::max<std::int64_t>(0, slot.tokens() - window);
            std::vector<Segment> kept;
            for (Segment segment : slot.segments) {
                const std::int64_t dropped = std::min(segment.tokens, drop);
                drop -= dropped;
                if (dropped == segment.tokens && segment.tokens > 0) continue;
                segment.first += dropped;
                segment.tokens -= dropped;
                kept.push_back(segment);
            }
            slot.segments = std::move(kept);
        }
    }
    return windowed;
}

CacheContent expected_from_legacy(const CacheContent& content) {
    CacheContent modern = content;
    modern.layout = Layout::modern;
    for (LayerContent& layer : modern.layers) {
        layer.initialized = true;
        layer.slots[key_cache] = {};
        layer.slots[value_cache] = {};
    }
    return modern;
}

std::int64_t content_bytes(const CacheContent& content) {
    const std::int64_t element_bytes = content.dtype == Dtype::f32 ? 4 : 2;
    std::int64_t bytes = 0;
    for (const LayerContent& layer : content.layers) {
        for (const SlotContent& slot : layer.slots) {
            if (slot.present) bytes += cache_batch * content.heads * slot.tokens() * content.head_dim * element_bytes;
        }
    }
    return bytes;
}

std::int64_t view_bytes(const CacheView& view) {
    std::int64_t bytes = 0;
    for (const LayerView& layer : view.layers) {
        for (const SlotView& slot : layer.slots) {
            if (!slot.present || slot.shape.empty()) continue;
            std::int64_t elements = 1;
            for (const std::int64_t size : slot.shape) elements *= size;
            bytes += elements * (slot.dtype == Dtype::f32 ? 4 : 2);
        }
    }
    return bytes;
}

bool content_holds_tokens(const CacheContent& content) {
    for (std::size_t i = 0; i < content.layers.size(); ++i) {
        for (Slot side : {keys, values}) {
            if (logical_slot(content, i, side).tokens() > 0) return true;
        }
    }
    return false;
}

std::int64_t content_seq_length(const CacheContent& content, std::size_t layer) {
    return logical_slot(content, layer, keys).tokens();
}

}  // namespace kvcheck
