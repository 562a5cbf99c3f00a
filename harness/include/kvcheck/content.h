// What a cache holds, described without tensors, so that traces are
// self-contained and the auditor can compute expected state without running
// any engine.
//
//   CacheSpec spec = parse_cache_spec("modern/bf16/7/4x16:[kv3 k~2 KV4 -0]");
//   CacheContent content = expand(spec);           // per-slot segments
//   CacheView expected = expected_view(content);   // what an engine must report
//
// The content model, exactly (an SDK in another language mirrors it bit for
// bit: slot_value, round_to, fill_slot, content_hash and the view digest).
//
// Geometry. Every K/V tensor of a cache has shape [1, heads, seq, head_dim];
// heads and head_dim belong to the cache (CacheSpec, CacheContent), are the
// same for all its slots, and default to 2 and 4 (the decoder's default
// geometry). A spec's text gives them as "/<heads>x<head_dim>" after the
// seed, and leaves them out when they are the default, so a text without
// them means heads 2, head_dim 4. An empty slot has shape [0].
//
// Segments. A slot's content is a list of segments, each `tokens` tokens
// whose values come from `seed` and are rounded to the segment's dtype
// (`precision`). expand() gives each present slot of layer i with t > 0
// tokens one segment {slot_seed(spec.seed, i, slot), t, spec.dtype}; a
// merged slot is the concatenation of its parts' segments, each keeping its
// own precision. A merge of parts of different dtypes has torch.cat's
// promoted dtype (float16 with bfloat16, or anything with float32:
// float32), so its values are each part's, rounded to that part's dtype,
// then widened exactly (expected_concat).
//
// Values. Element (head h, token t, dim d) of a segment with seed s is
// round_to(precision, slot_value(s, h, t, d)), t counted from the
// segment's first token. slot_value is a float32 with a full 23-bit
// mantissa drawn from the seed, so it is almost never exact in float16 or
// bfloat16. Most magnitudes are in [1/8, 4); one in sixteen is in
// [2^8, 2^12), and one in sixteen in [2^-26, 2^-14), where float16 has only
// subnormals, so that a bfloat16 value routed through float16 loses bits
// too. (Nothing reaches float16's overflow: a model decoding on a float16
// cache would compute with infinities.) slot_value, given
// x = splitmix64(s ^ splitmix64((h << 40) ^ (t << 16) ^ d)) (unsigned
// 64-bit arithmetic; h < 2^24, t < 2^24, d < 2^16):
//   sign     = x >> 63
//   mantissa = x & 0x7FFFFF
//   r        = (x >> 32) & 0xFF
//   exponent = r < 224 ? (r % 5) - 3       (2^-3 .. 2^1)
//            : r < 240 ? 8 + (r % 4)        (2^8 .. 2^11)
//            :           -26 + (r % 12)     (2^-26 .. 2^-15)
//   bits     = sign << 31 | (exponent + 127) << 23 | mantissa
// read as an IEEE-754 binary32. A segment's seed is
// slot_seed(cache_seed, layer, slot) = splitmix64(splitmix64(cache_seed) ^
// (layer * 0x100000001B3) ^ (slot + 1)), slot numbered as Slot below.
//
// Rounding. round_to(f32, v) is v. round_to(f16, v) and round_to(bf16, v)
// are the nearest float16 / bfloat16 value, ties to even, as a float32
// (exactly what torch's `.to(dtype)` on a CPU tensor gives, then `.float()`):
// float16 keeps 10 mantissa bits, has subnormals down to 2^-24 and rounds
// magnitudes from 65520 up to infinity; bfloat16 keeps the top 16 bits of
// the float32 after adding 0x7FFF plus bit 16 (its lowest kept bit). A NaN
// stays a NaN (float16: sign kept, bits sign | 0x7FC00000; bfloat16:
// 0x7FC00000); slot_value never gives one.
//
// fill_slot writes a slot's elements in row-major [head][token][dim] order,
// the tokens of all its segments in order for each head (batch 1).
//
// Views and hashes. A correct engine reports, for each present slot, the
// cache's dtype (float32 for a cache that holds no slot at all), shape
// [1, heads, tokens, head_dim] ([0] when it holds no token) and the
// content_hash of its values read as float32, the values being those
// fill_slot gives, rounded to the slot's dtype. So a slot is compared
// exactly in the dtype the engine claims: a cast that keeps the dtype tag
// but loses bits changes the hash. content_hash and ViewDigest are below;
// docs/semantics.md#content-geometry-values-and-hashes spells every
// definition out for a mirror in another language.
//
// What changed from the first version (for the mirror): slot_value was
// ((splitmix64(s ^ splitmix64((h * 1000003 + t) * 64 + d)) % 64) - 32) / 8,
// a multiple of 1/8 in [-4, 4), exact in every dtype; segments had no
// precision and values were not rounded; every cache had heads 2 and
// head_dim 4 and the text form had no geometry. slot_seed, the view digest,
// the text form of layers and expand's segment seeds are unchanged.
// content_hash changed with protocol version 3 (docs/semantics.md gives the
// previous definition).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kvcheck {

inline constexpr std::int64_t cache_batch = 1;
// The default geometry: a spec or content that names none has it.
inline constexpr std::int64_t cache_heads = 2;
inline constexpr std::int64_t cache_head_dim = 4;
// The largest heads and head_dim a spec may carry (slot_value's element
// index needs head < 2^24 and dim < 2^16; this keeps caches sane).
inline constexpr std::int64_t cache_heads_max = 256;
inline constexpr std::int64_t cache_head_dim_max = 1024;

enum class Layout : std::uint8_t { modern, legacy };
enum class Dtype : std::uint8_t { f32, f16, bf16 };

const char* layout_name(Layout layout);
const char* dtype_name(Dtype dtype);

// The four slots of a layer. A legacy cache uses keys/values for its
// key_cache/value_cache list entries; key_cache/value_cache here are the
// legacy-named slots a modern layer may carry.
enum Slot : std::uint8_t { keys = 0, values = 1, key_cache = 2, value_cache = 3 };
inline constexpr int slot_count = 4;
const char* slot_name(Slot slot);

// ---- the compact spec, as traces write it ---------------------------------

// One layer: which slots it holds (bit i = Slot i), whether it is
// initialized (modern only; legacy layers always are), and its tokens.
struct LayerSpec {
    std::uint8_t slots = 0b11;
    bool initialized = true;
    std::int64_t tokens = 0;

    friend bool operator==(const LayerSpec& a, const LayerSpec& b) {
        return a.slots == b.slots && a.initialized == b.initialized && a.tokens == b.tokens;
    }
};

// Text: "<layout>/<dtype>/<seed>[/<heads>x<head_dim>]:[<layer> ...]", a
// layer being its slot letters (k keys, v values, K key_cache, V
// value_cache; "-" for none), "~" when uninitialized, then its token count:
// "modern/f32/3:[kv2 k~1 -0]", "legacy/bf16/9/4x16:[kv300 kv300]". The
// geometry is written only when it is not the default (2x4).
struct CacheSpec {
    Layout layout = Layout::modern;
    Dtype dtype = Dtype::f32;
    std::uint64_t seed = 0;
    std::vector<LayerSpec> layers;
    std::int64_t heads = cache_heads;
    std::int64_t head_dim = cache_head_dim;

    friend bool operator==(const CacheSpec& a, const CacheSpec& b) {
        return a.layout == b.layout && a.dtype == b.dtype && a.seed == b.seed && a.layers == b.layers &&
               a.heads == b.heads && a.head_dim == b.head_dim;
    }
};

std::string format_cache_spec(const CacheSpec& spec);
// Throws std::invalid_argument naming the fault.
CacheSpec parse_cache_spec(const std::string& text);

// ---- the expanded content, as engines materialize it ----------------------

struct Segment {
    std::uint64_t seed = 0;
    std::int64_t tokens = 0;
    Dtype precision = Dtype::f32;  // its values are rounded to this dtype
    // The segment's token `first + t` is its t-th: a suffix of a segment
    // (expected_window) starts past its first tokens. 0 in every content
    // kvcheck sends an engine (the wire refuses another).
    std::int64_t first = 0;
};

struct SlotContent {
    bool present = false;
    std::vector<Segment> segments;  // none: an empty tensor of shape [0]
    std::int64_t tokens() const;
};

struct LayerContent {
    bool initialized = true;
    std::array<SlotContent, slot_count> slots;
};

struct CacheContent {
    Layout layout = Layout::modern;
    Dtype dtype = Dtype::f32;
    std::vector<LayerContent> layers;
    std::int64_t heads = cache_heads;
    std::int64_t head_dim = cache_head_dim;
};

CacheContent expand(const CacheSpec& spec);

// The unrounded value of element (head, token, dim) of a segment: a pure
// function of the segment seed (see the top of this file).
float slot_value(std::uint64_t seed, std::int64_t head, std::int64_t token, std::int64_t dim);

// `value` rounded to the nearest value of `dtype`, ties to even, as torch's
// `.to(dtype)` rounds (see the top of this file).
float round_to(Dtype dtype, float value);

// A float32's bit pattern, and the float32 of a bit pattern (the terms
// slot_value and round_to are written in).
inline std::uint32_t bits_of(float value) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}
inline float float_of(std::uint32_t bits) {
    float value = 0;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

// Fills `out` (heads x tokens x head_dim, row-major, batch 1) with a slot's
// values: the concatenation of its segments along tokens, each segment's
// values rounded to its precision. Engines fill their tensors with them.
void fill_slot(const SlotContent& slot, std::int64_t heads, std::int64_t head_dim, std::vector<float>& out);

// ---- views: what an engine reports of a cache ------------------------------

struct SlotView {
    bool present = false;
    Dtype dtype = Dtype::f32;
    std::vector<std::int64_t> shape;
    std::uint64_t hash = 0;  // content_hash of the values, read as float32
    // The values themselves, read as float32, row-major: only from an engine
    // that declares a content tolerance (ContentTolerance), and only in a
    // view (a digest stays a hash). Not part of equality: the hash is.
    std::vector<float> values;

    friend bool operator==(const SlotView& a, const SlotView& b) {
        return a.present == b.present && (!a.present || (a.dtype == b.dtype && a.shape == b.shape && a.hash == b.hash));
    }
    friend bool operator!=(const SlotView& a, const SlotView& b) { return !(a == b); }
};

struct LayerView {
    bool initialized = true;
    std::array<SlotView, slot_count> slots;
};

// A cache's logical content, layout and flags, as an engine reports it.
struct CacheView {
    Layout layout = Layout::modern;
    std::vector<LayerView> layers;
};

// The hash of a tensor's values, row-major, converted to float32. Engines
// call this on their own tensors; the auditor on expected values.
//
//   content_hash = splitmix64(S ^ splitmix64(count)),
//   S = sum over i < count of splitmix64(i << 32 | bits(values[i])) mod 2^64,
//
// bits(v) being v's float32 pattern with -0 read as +0. splitmix64 is a
// bijection and each word holds a position once (positions count modulo
// 2^32: a slot of 16 GiB of float32), so a single changed value always
// changes the hash. It is not a cryptographic hash: values chosen to
// collide can be found. For an engine's bugs, which do not aim at it, two
// different contents collide only when the differences of their terms sum
// to zero modulo 2^64: a 2^-64 coincidence.
std::uint64_t content_hash(const float* values, std::size_t count);

// What a correct engine reports for `content`; with `values`, each slot
// carries its values too (SlotView::values), for a comparison within a
// content tolerance.
CacheView expected_view(const CacheContent& content, bool values = false);

// A digest of a view, for comparing views without building them: views
// that view_difference finds equal have the same digest (so an empty
// slot's dtype is left out, as there), and different ones differ but for a
// 64-bit collision. Fed in view order: the layout and the number of layers,
// then per layer its flag and its slot_count slots.
class ViewDigest {
  public:
    ViewDigest(Layout layout, std::size_t layers);
    void layer(bool initialized);
    void absent_slot();
    void slot(Dtype dtype, const std::int64_t* shape, std::size_t dims, std::uint64_t hash);
    std::uint64_t value() const { return hash_; }

  private:
    void mix(std::uint64_t word);
    std::uint64_t hash_;
};

std::uint64_t view_digest(const CacheView& view);
// view_digest(expected_view(content)), without building the view.
std::uint64_t expected_digest(const CacheContent& content);

// docs/semantics.md#content-tolerance: how far an engine that stores K/V
// quantized may read a value back from the one it was given. A value v
// read for an expected e is within it when |v - e| <= abs + rel * |e|
// (both 0: exact, the default). It loosens only the comparisons of content
// with what kvcheck expects; a stored entry or a handle read twice is
// compared with its first reading exactly (Readings::entry_difference).
struct ContentTolerance {
    double abs = 0;
    double rel = 0;
    bool declared() const { return abs > 0 || rel > 0; }
    bool within(float value, float expected) const;
};

// The first difference between two views, as "layer 1 keys: content
// differs"; empty when equal. The dtype of an empty slot (shape [0]) is not
// compared: it holds no value and update never reads it. With a declared
// `tolerance`, a slot whose hash differs is compared value by value
// (`expected` made by expected_view(content, true), `actual` carrying its
// values): equal when every value is within the tolerance.
std::string view_difference(const CacheView& actual, const CacheView& expected, const ContentTolerance& tolerance = {});

// The logical K or V a model sees in layer i of a content (modern: the
// layer's keys, else key_cache, when initialized; legacy: the list entry).
// Absent (present == false) when the layer is missing, uninitialized or
// lacks that side.
SlotContent logical_slot(const CacheContent& content, std::size_t layer, Slot side);

// The expected results of the cache-level operations, mirroring the
// semantics of docs/semantics.md#cache-operations and #conversions. A merge of parts of different
// dtypes has torch.cat's promoted dtype (float16 with bfloat16, or anything
// with float32: float32); every part counts that holds a slot, even an
// empty one. Its segments keep the precision of the part they came from.
// Parts holding tokens must share one geometry (merged_geometry_ok); the
// merge has theirs.
CacheContent expected_concat(const std::vector<CacheContent>& parts);
// Do the parts holding tokens share one geometry, as a merge needs?
bool merged_geometry_ok(const std::vector<CacheContent>& parts);
// Do the parts that hold a slot (those whose dtype the promotion counts)
// have different dtypes? An engine may refuse such a merge (with an error,
// changing nothing) instead of promoting.
bool dtypes_mixed(const std::vector<CacheContent>& parts);
CacheContent expected_to_legacy(const CacheContent& content);
CacheContent expected_from_legacy(const CacheContent& content);
// docs/semantics.md#trimming: every present slot of every layer holding
// more than `keep` tokens keeps its first `keep`; the rest is unchanged
// (flags, layout, dtype, geometry, slots holding `keep` or fewer).
CacheContent expected_trim(const CacheContent& content, std::int64_t keep);
// docs/semantics.md#store-windows: what a windowed engine (window W >= 1)
// shows of a cache: every present slot of every layer holding more than W
// tokens keeps its last W, in order; the rest is unchanged.
CacheContent expected_window(const CacheContent& content, std::int64_t window);
bool content_holds_tokens(const CacheContent& content);
// The bytes of K/V a copy of `content` holds: every present slot's
// elements at the content's dtype (4 bytes for f32, 2 for f16 and bf16).
std::int64_t content_bytes(const CacheContent& content);
// The same of a view: every present slot's elements at its dtype.
std::int64_t view_bytes(const CacheView& view);
std::int64_t content_seq_length(const CacheContent& content, std::size_t layer = 0);

}  // namespace kvcheck
