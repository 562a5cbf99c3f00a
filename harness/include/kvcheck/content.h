// What a cache holds, described without tensors, so that traces are
// self-contained and the auditor can compute expected state without running
// any engine.
//
// Geometry is fixed for every cache kvcheck makes: [batch 1, heads 2, seq,
// head_dim 4], the decoder's. A slot's content is a list of segments, each
// `len` tokens whose values come from `seed` (kvcheck::slot_value); a merged
// slot is the concatenation of its parts' segments. Values are multiples of
// 1/8 in [-4, 4): exact in float32, float16 and bfloat16.
//
//   CacheSpec spec = parse_cache_spec("modern/bf16/7:[kv3 k~2 KV4 -0]");
//   CacheContent content = expand(spec);           // per-slot segments
//   CacheView expected = expected_view(content);   // what an engine must report
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck {

inline constexpr std::int64_t cache_batch = 1;
inline constexpr std::int64_t cache_heads = 2;
inline constexpr std::int64_t cache_head_dim = 4;

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

// Text: "<layout>/<dtype>/<seed>:[<layer> ...]", a layer being its slot
// letters (k keys, v values, K key_cache, V value_cache; "-" for none), "~"
// when uninitialized, then its token count: "modern/f32/3:[kv2 k~1 -0]".
struct CacheSpec {
    Layout layout = Layout::modern;
    Dtype dtype = Dtype::f32;
    std::uint64_t seed = 0;
    std::vector<LayerSpec> layers;

    friend bool operator==(const CacheSpec& a, const CacheSpec& b) {
        return a.layout == b.layout && a.dtype == b.dtype && a.seed == b.seed && a.layers == b.layers;
    }
};

std::string format_cache_spec(const CacheSpec& spec);
// Throws std::invalid_argument naming the fault.
CacheSpec parse_cache_spec(const std::string& text);

// ---- the expanded content, as engines materialize it ----------------------

struct Segment {
    std::uint64_t seed = 0;
    std::int64_t tokens = 0;
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
};

CacheContent expand(const CacheSpec& spec);

// The value of element (head, token, dim) of a segment: a pure function of
// the segment seed. Engines fill their tensors with it.
float slot_value(std::uint64_t seed, std::int64_t head, std::int64_t token, std::int64_t dim);

// Fills `out` (heads x tokens x head_dim, row-major, batch 1) with a slot's
// values: the concatenation of its segments along tokens.
void fill_slot(const SlotContent& slot, std::vector<float>& out);

// ---- views: what an engine reports of a cache ------------------------------

struct SlotView {
    bool present = false;
    Dtype dtype = Dtype::f32;
    std::vector<std::int64_t> shape;
    std::uint64_t hash = 0;  // content_hash of the values as float32

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
std::uint64_t content_hash(const float* values, std::size_t count);

// What a correct engine reports for `content`.
CacheView expected_view(const CacheContent& content);

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

// The first difference between two views, as "layer 1 keys: content
// differs"; empty when equal. The dtype of an empty slot (shape [0]) is not
// compared: it holds no value and update never reads it.
std::string view_difference(const CacheView& actual, const CacheView& expected);

// The logical K or V a model sees in layer i of a content (modern: the
// layer's keys, else key_cache, when initialized; legacy: the list entry).
// Absent (present == false) when the layer is missing, uninitialized or
// lacks that side.
SlotContent logical_slot(const CacheContent& content, std::size_t layer, Slot side);

// The expected results of the cache-level operations
// (docs/semantics.md#cache-operations, #conversions). A merge of parts of
// different dtypes takes torch.cat's promotion (#mixed-dtypes): the workload
// draws one dtype per trace, but a part that holds no tensor counts as
// float32.
CacheContent expected_concat(const std::vector<CacheContent>& parts);
CacheContent expected_to_legacy(const CacheContent& content);
CacheContent expected_from_legacy(const CacheContent& content);
bool content_holds_tokens(const CacheContent& content);
// The bytes of K/V a copy of `content` holds: every present slot's
// elements at the content's dtype (4 bytes for f32, 2 for f16 and bf16).
std::int64_t content_bytes(const CacheContent& content);
std::int64_t content_seq_length(const CacheContent& content, std::size_t layer = 0);

}  // namespace kvcheck
