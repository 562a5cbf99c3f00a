// The trace text format: exact text per op kind, multi-line traces, seeded
// random round trips, and parse errors that name the line and the fault.
#include "kvcheck/trace.h"

#include <boost/pfr.hpp>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using kvcheck::CacheSpec;
using kvcheck::Dtype;
using kvcheck::HandleName;
using kvcheck::Layout;
using kvcheck::LayerSpec;
using kvcheck::Op;
using kvcheck::Trace;
namespace op = kvcheck::op;

constexpr std::int64_t int64_min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t uint64_max = std::numeric_limits<std::uint64_t>::max();

// "modern/bf16/7:[kv3 k~2 KV4 -0]"
CacheSpec example_spec() {
    return CacheSpec{Layout::modern, Dtype::bf16, 7,
                     {LayerSpec{0b0011, true, 3}, LayerSpec{0b0001, false, 2}, LayerSpec{0b1100, true, 4},
                      LayerSpec{0b0000, true, 0}}};
}

// One op of every kind with its exact canonical text.
std::vector<std::pair<Op, std::string>> one_op_per_kind() {
    return {
        {op::Add{"a", example_spec()}, "add a modern/bf16/7:[kv3 k~2 KV4 -0]"},
        {op::Add{"a", example_spec(), kvcheck::MetaSeed{12}}, "add a modern/bf16/7:[kv3 k~2 KV4 -0] meta=12"},
        {op::AddHandle{"b", HandleName{3}}, "add_handle b h3"},
        {op::Get{HandleName{2}, "a"}, "h2 = get a"},
        {op::GetByIds{{"a", "b.c", "x-1_y"}}, "get_by_ids a b.c x-1_y"},
        {op::GetAll{}, "get_all"},
        {op::GetCache{HandleName{2}, {"a", "b"}}, "h2 = get_cache a b"},
        {op::Generate{HandleName{1}, {5, 7}, 3}, "generate h1 prompt=5,7 max=3"},
        {op::GenerateStream{HandleName{0}, {}, -1}, "generate_stream h0 prompt= max=-1"},
        {op::Delete{{"a"}}, "delete a"},
        {op::DeleteAll{}, "delete_all"},
        {op::Dump{2}, "dump slot=2"},
        {op::DumpCrash{1, 100}, "dump_crash slot=1 bytes=100"},
        {op::Load{1}, "load slot=1"},
        {op::Corrupt{1, 17, 1}, "corrupt slot=1 offset=17 truncate=1"},
        {op::Make{HandleName{4}, CacheSpec{Layout::legacy, Dtype::f16, uint64_max, {}}},
         "h4 = make legacy/f16/18446744073709551615:[]"},
        {op::Clone{HandleName{5}, HandleName{4}}, "h5 = clone h4"},
        {op::Concat{HandleName{6}, {HandleName{4}, HandleName{5}}}, "h6 = concat h4 h5"},
        {op::ToLegacy{HandleName{7}, HandleName{6}}, "h7 = to_legacy h6"},
        {op::FromLegacy{HandleName{8}, HandleName{7}}, "h8 = from_legacy h7"},
        {op::Release{HandleName{8}}, "release h8"},
        {op::DumpKill{1, 4}, "dump_kill slot=1 point=4"},
        {op::Turn{HandleName{9}, HandleName{0}, {5, 7}, 3}, "h9 = turn h0 prompt=5,7 max=3"},
        {op::Extract{"m", {1, 2}}, "extract m prompt=1,2"},
        {op::Fill{CacheSpec{Layout::modern, Dtype::f32, 3, {LayerSpec{0b0011, true, 2}}}, 8, 64},
         "fill modern/f32/3:[kv2] first=8 count=64"},
        {op::PagedAlloc{1, {1, 2, 3}, 0}, "paged_alloc seq=1 tokens=1,2,3 salt=0"},
        {op::PagedAppend{1, 2}, "paged_append seq=1 count=2"},
        {op::PagedFork{1, 2}, "paged_fork parent=1 child=2"},
        {op::PagedFree{2}, "paged_free seq=2"},
        {op::PagedLookup{{1, 2}, 1}, "paged_lookup tokens=1,2 salt=1"},
        {op::PagedEvict{}, "paged_evict"},
        {op::PagedReset{}, "paged_reset"},
        {op::PagedStep{}, "paged_step"},
        {op::PagedImport{3, CacheSpec{Layout::modern, Dtype::f32, 7, {LayerSpec{0b11, true, 3}}}}, "paged_import seq=3 modern/f32/7:[kv3]"},
        {op::PagedExport{3}, "paged_export seq=3"},
        {op::PagedRewind{3, 2, 1}, "paged_rewind seq=3 count=2 token=1"},
        {op::Trim{{2}, 3}, "trim h2 keep=3"},
        {op::Batch{{5}, 2, {3, 0, 1, 1}, 1, {{1}, {2}}}, "h5 = batch repeat=2 reorder=3,0,1,1 select=1 h1 h2"},
        {op::Batch{{4}, 1, {}, 0, {{1}}}, "h4 = batch repeat=1 reorder= select=0 h1"},
        {op::SwitchLane{2}, "switch lane=2"},
        {op::Tick{4}, "tick ms=4"},
        {op::Lease{"a"}, "lease a"},
        {op::Unlease{"b"}, "unlease b"},
    };
}

TEST(TraceText, EveryKindFormatsToItsExactTextAndParsesBack) {
    std::set<std::size_t> kinds;
    for (const auto& [value, text] : one_op_per_kind()) {
        kinds.insert(value.index());
        EXPECT_EQ(kvcheck::format_op(value), text);
        const Op parsed = kvcheck::parse_op(text);
        EXPECT_TRUE(parsed == value) << text << " parsed as " << kvcheck::format_op(parsed);
        EXPECT_EQ(kvcheck::hash_op(parsed), kvcheck::hash_op(value)) << text;
        EXPECT_STREQ(kvcheck::op_name(value), kvcheck::op_kind_name(value.index()));
    }
    EXPECT_EQ(kinds.size(), kvcheck::op_kind_count) << "the table must cover every op kind";
}

TEST(TraceText, EmptyVariableFieldsPrintNothing) {
    EXPECT_EQ(kvcheck::format_op(op::GetByIds{}), "get_by_ids");
    EXPECT_EQ(kvcheck::format_op(op::Concat{HandleName{1}, {}}), "h1 = concat");
    EXPECT_TRUE(kvcheck::parse_op("h1 = concat") == Op(op::Concat{HandleName{1}, {}}));
    EXPECT_TRUE(kvcheck::parse_op("delete") == Op(op::Delete{}));
}

TEST(TraceText, NamesAndCreatedHandles) {
    EXPECT_STREQ(kvcheck::op_kind_name(0), "add");
    EXPECT_STREQ(kvcheck::op_name(op::FromLegacy{}), "from_legacy");
    EXPECT_THROW(kvcheck::op_kind_name(kvcheck::op_kind_count), std::out_of_range);
    EXPECT_EQ(kvcheck::created_handle(op::GetCache{HandleName{9}, {"a"}}), 9);
    EXPECT_EQ(kvcheck::created_handle(op::Make{HandleName{3}, {}}), 3);
    EXPECT_EQ(kvcheck::created_handle(op::Generate{HandleName{4}, {}, 1}), 0) << "source is not out";
    EXPECT_EQ(kvcheck::created_handle(op::AddHandle{"a", HandleName{4}}), 0);
    EXPECT_EQ(kvcheck::created_handle(op::GetAll{}), 0);
}

TEST(TraceText, EqualityIsPerKindAndPerField) {
    const Op generate = op::Generate{HandleName{1}, {5}, 3};
    EXPECT_TRUE(generate == Op(op::Generate{HandleName{1}, {5}, 3}));
    EXPECT_FALSE(generate == Op(op::GenerateStream{HandleName{1}, {5}, 3})) << "same fields, other kind";
    EXPECT_TRUE(generate != Op(op::Generate{HandleName{2}, {5}, 3}));
    EXPECT_TRUE(generate != Op(op::Generate{HandleName{1}, {5, 0}, 3}));
    EXPECT_TRUE(generate != Op(op::Generate{HandleName{1}, {5}, 4}));
    EXPECT_TRUE(Op(op::GetAll{}) == Op(op::GetAll{}));
    EXPECT_FALSE(Op(op::GetAll{}) == Op(op::DeleteAll{}));
    const Op add = op::Add{"a", example_spec()};
    for (int field = 0; field < 3; ++field) {
        CacheSpec other = example_spec();
        if (field == 0) other.layers[1].slots = 0b11;
        if (field == 1) other.layers[1].initialized = true;
        if (field == 2) other.layers[1].tokens = 5;
        EXPECT_TRUE(add != Op(op::Add{"a", other})) << "layer field " << field;
        EXPECT_NE(kvcheck::hash_op(add), kvcheck::hash_op(op::Add{"a", other})) << "layer field " << field;
    }
    EXPECT_NE(kvcheck::hash_op(op::GetAll{}), kvcheck::hash_op(op::DeleteAll{}));
}

TEST(TraceText, MultiLineTraceWithCommentsAndBlankLines) {
    const std::string text =
        "# a regression, as a person would write it\n"
        "\n"
        "add a modern/f32/3:[kv2 kv2]   # two layers\n"
        "   \t\n"
        "add_handle b h0\n"
        "  h1   =  get_cache\ta  b  \r\n"
        "generate h1 prompt=5,7 max=3\n"
        "h2 = make modern/f32/0:[  vk1   -~0 ]\n"
        "dump slot=007\n"
        "#trailing comment without newline";
    const Trace trace = kvcheck::parse_trace(text);
    ASSERT_EQ(trace.size(), 6u);
    EXPECT_EQ(kvcheck::format_trace(trace),
              "add a modern/f32/3:[kv2 kv2]\n"
              "add_handle b h0\n"
              "h1 = get_cache a b\n"
              "generate h1 prompt=5,7 max=3\n"
              "h2 = make modern/f32/0:[kv1 -~0]\n"
              "dump slot=7\n");
    EXPECT_EQ(kvcheck::created_handle(trace[2]), 1);
    EXPECT_TRUE(kvcheck::parse_trace("") == Trace{});
    EXPECT_TRUE(kvcheck::parse_trace("# nothing\n\n") == Trace{});
    EXPECT_EQ(kvcheck::format_trace({}), "");
}

// ---- seeded random ops of every kind, built field by field ----------------

class RandomOps {
  public:
    explicit RandomOps(std::uint64_t seed) : rng_(seed) {}

    Op any() { return make_kind(below(kvcheck::op_kind_count), std::make_index_sequence<kvcheck::op_kind_count>{}); }

  private:
    std::size_t below(std::size_t bound) { return std::uniform_int_distribution<std::size_t>(0, bound - 1)(rng_); }

    template <std::size_t... K>
    Op make_kind(std::size_t kind, std::index_sequence<K...>) {
        using Maker = Op (*)(RandomOps&);
        static constexpr std::array<Maker, sizeof...(K)> makers{&RandomOps::make<std::variant_alternative_t<K, Op>>...};
        return makers.at(kind)(*this);
    }

    template <typename O>
    static Op make(RandomOps& random) {
        O value{};
        boost::pfr::for_each_field(value, [&random](auto& field) { random.fill(field); });
        return value;
    }

    std::int64_t number() {
        switch (below(6)) {
            case 0: return 0;
            case 1: return int64_min;
            case 2: return int64_max;
            case 3: return -static_cast<std::int64_t>(below(1000));
            case 4: return static_cast<std::int64_t>(rng_());
            default: return static_cast<std::int64_t>(below(1000));
        }
    }

    void fill(std::int64_t& value) { value = number(); }
    void fill(kvcheck::MetaSeed& meta) { meta.value = number(); }
    void fill(HandleName& handle) { handle.value = below(8) == 0 ? int64_max : static_cast<std::int64_t>(below(20)); }

    void fill(std::string& id) {
        static constexpr char chars[] = "ABCXYZabcxyz0189_.-";
        id.assign(1 + below(8), 'a');
        for (char& c : id) c = chars[below(sizeof chars - 1)];
    }

    void fill(CacheSpec& spec) {
        spec.layout = below(2) == 0 ? Layout::modern : Layout::legacy;
        spec.dtype = static_cast<Dtype>(below(3));
        spec.seed = below(4) == 0 ? uint64_max : rng_();
        spec.heads = below(2) == 0 ? kvcheck::cache_heads : 1 + static_cast<std::int64_t>(below(kvcheck::cache_heads_max));
        spec.head_dim = below(2) == 0 ? kvcheck::cache_head_dim : 1 + static_cast<std::int64_t>(below(kvcheck::cache_head_dim_max));
        spec.layers.resize(below(5));
        for (LayerSpec& layer : spec.layers) {
            layer.slots = static_cast<std::uint8_t>(below(16));
            layer.initialized = below(3) != 0;
            layer.tokens = below(8) == 0 ? int64_max : static_cast<std::int64_t>(below(50));
        }
    }

    template <typename T>
    void fill(std::vector<T>& values) {
        values.resize(below(5));
        for (T& value : values) fill(value);
    }

    std::mt19937_64 rng_;
};

TEST(TraceText, RandomTracesRoundTrip) {
    constexpr std::uint64_t seed = 20240611;
    constexpr int traces_count = 2000;
    constexpr std::size_t trace_ops_max = 24;
    RandomOps random(seed);
    std::mt19937_64 lengths(seed + 1);
    std::set<std::size_t> kinds_seen;
    std::set<std::string> texts_seen;
    std::set<std::size_t> hashes_seen;
    for (int i = 0; i < traces_count; ++i) {
        Trace trace(std::uniform_int_distribution<std::size_t>(0, trace_ops_max)(lengths));
        for (Op& value : trace) {
            value = random.any();
            kinds_seen.insert(value.index());
        }
        const std::string text = kvcheck::format_trace(trace);
        const Trace parsed = kvcheck::parse_trace(text);
        ASSERT_TRUE(parsed == trace) << "seed " << seed << " trace " << i << ":\n" << text;
        ASSERT_EQ(kvcheck::format_trace(parsed), text) << "seed " << seed << " trace " << i;
        for (std::size_t k = 0; k < trace.size(); ++k) {
            ASSERT_EQ(kvcheck::hash_op(parsed[k]), kvcheck::hash_op(trace[k])) << kvcheck::format_op(trace[k]);
            texts_seen.insert(kvcheck::format_op(trace[k]));
            hashes_seen.insert(kvcheck::hash_op(trace[k]));
        }
    }
    EXPECT_EQ(kinds_seen.size(), kvcheck::op_kind_count) << "the generator must reach every op kind";
    // Distinct ops should almost never share a hash; a hash of the kind alone
    // would be valid but useless to the shrinker's dedup.
    EXPECT_GE(hashes_seen.size() * 100, texts_seen.size() * 99)
        << hashes_seen.size() << " hashes for " << texts_seen.size() << " distinct ops";
}

// ---- errors -----------------------------------------------------------------

TEST(TraceText, ParseErrorsNameTheLineAndTheFault) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"frobnicate a", "unknown operation 'frobnicate'"},
        {"add a", "add: missing field 'cache'"},
        {"generate h1 prompt=5", "generate: missing field 'max'"},
        {"generate h1 max=3 prompt=5", "expected field 'prompt=...', got 'max=3'"},
        {"generate h1 prompt=5,x max=3", "bad number 'x' in field 'prompt'"},
        {"generate h1 prompt=5,,7 max=3", "bad number '' in field 'prompt'"},
        {"dump_crash slot=1 bytes=", "bad number '' in field 'bytes'"},
        {"load slot=+1", "bad number '+1' in field 'slot'"},
        {"dump slot=99999999999999999999", "number '99999999999999999999' in field 'slot' is out of range"},
        {"h2 = clone hx", "clone: bad handle 'hx' in field 'source'"},
        {"h2 = clone h-1", "bad handle 'h-1' in field 'source'"},
        {"h2 = concat h1 3", "bad handle '3' in field 'parts'"},
        {"h99999999999999999999 = get a", "bad handle 'h99999999999999999999' in field 'out'"},
        {"h2 = clone h1 extra", "clone: trailing text 'extra'"},
        {"dump slot=1 slot=2", "dump: trailing text 'slot=2'"},
        {"get a", "get: missing 'h<N> ='"},
        {"h3 = add a modern/f32/1:[]", "add: creates no handle"},
        {"h3 =", "missing operation after 'h3 ='"},
        {"get_by_ids a b!c", "bad id 'b!c' in field 'ids'"},
        {"add_handle a=1 h1", "bad id 'a=1' in field 'id'"},
        {"add a modern/f64/1:[kv1]",
         "add: bad cache spec in field 'cache': cache spec 'modern/f64/1:[kv1]': bad dtype 'f64'"},
        {"add a modern/f32/1:[kv1 kv2", "missing ']'"},
        {"add a modern/f32/1:[kv1]x", "trailing text 'x' after ']'"},
    };
    for (const auto& [line, fault] : cases) {
        const std::string text = "get_all  # fine\n\n" + line + "\nget_all\n";
        try {
            kvcheck::parse_trace(text);
            ADD_FAILURE() << "no error for: " << line;
        } catch (const kvcheck::TraceParseError& error) {
            const std::string message = error.what();
            EXPECT_EQ(message.rfind("line 3: ", 0), 0u) << message;
            EXPECT_NE(message.find(fault), std::string::npos) << "got: " << message << "\nwanted: " << fault;
        }
    }
}

TEST(TraceText, ParseOpAloneHasNoLineNumber) {
    try {
        kvcheck::parse_op("  ");
        ADD_FAILURE() << "no error for an empty operation";
    } catch (const kvcheck::TraceParseError& error) {
        EXPECT_STREQ(error.what(), "empty operation");
    }
}

TEST(TraceText, FormatRejectsWhatTheTextCannotCarry) {
    EXPECT_THROW(kvcheck::format_op(op::Get{HandleName{1}, "a b"}), std::invalid_argument);
    EXPECT_THROW(kvcheck::format_op(op::Get{HandleName{1}, ""}), std::invalid_argument);
    EXPECT_THROW(kvcheck::format_op(op::Delete{{"ok", "#no"}}), std::invalid_argument);
    EXPECT_THROW(kvcheck::format_op(op::Clone{HandleName{1}, HandleName{-1}}), std::invalid_argument);
    EXPECT_THROW(kvcheck::format_op(op::Get{HandleName{-2}, "a"}), std::invalid_argument);
    CacheSpec spec;
    spec.layers = {LayerSpec{0b10000, true, 1}};
    EXPECT_THROW(kvcheck::format_cache_spec(spec), std::invalid_argument);
    spec.layers = {LayerSpec{0b11, true, -1}};
    EXPECT_THROW(kvcheck::format_op(op::Make{HandleName{1}, spec}), std::invalid_argument);
}

// ---- the cache spec text ----------------------------------------------------

TEST(CacheSpecText, RoundTripsAndIsCanonical) {
    EXPECT_EQ(kvcheck::format_cache_spec(example_spec()), "modern/bf16/7:[kv3 k~2 KV4 -0]");
    EXPECT_TRUE(kvcheck::parse_cache_spec("modern/bf16/7:[kv3 k~2 KV4 -0]") == example_spec());
    EXPECT_EQ(kvcheck::format_cache_spec(kvcheck::parse_cache_spec("legacy/f32/0:[]")), "legacy/f32/0:[]");
    EXPECT_EQ(kvcheck::format_cache_spec(kvcheck::parse_cache_spec("modern/f16/01:[VKvk~09 -~0]")),
              "modern/f16/1:[kvKV~9 -~0]");
    const CacheSpec extremes{Layout::legacy, Dtype::f32, uint64_max, {LayerSpec{0b1111, false, int64_max}}};
    EXPECT_TRUE(kvcheck::parse_cache_spec(kvcheck::format_cache_spec(extremes)) == extremes);
}

// A text without a geometry is the default geometry, so every trace written
// before caches had one reads as it did; another geometry is written after
// the seed, and the default never is.
TEST(CacheSpecText, GeometryIsOptionalAndDefaultsToTwoByFour) {
    const CacheSpec plain = kvcheck::parse_cache_spec("modern/bf16/7:[kv3 k~2 KV4 -0]");
    EXPECT_EQ(plain.heads, 2);
    EXPECT_EQ(plain.head_dim, 4);
    EXPECT_TRUE(kvcheck::parse_cache_spec("modern/bf16/7/2x4:[kv3 k~2 KV4 -0]") == plain);
    EXPECT_EQ(kvcheck::format_cache_spec(kvcheck::parse_cache_spec("modern/bf16/7/2x4:[kv3]")), "modern/bf16/7:[kv3]");
    CacheSpec wide = example_spec();
    wide.heads = 8;
    wide.head_dim = 64;
    EXPECT_EQ(kvcheck::format_cache_spec(wide), "modern/bf16/7/8x64:[kv3 k~2 KV4 -0]");
    EXPECT_TRUE(kvcheck::parse_cache_spec("modern/bf16/7/8x64:[kv3 k~2 KV4 -0]") == wide);
    EXPECT_FALSE(wide == example_spec());
    const CacheSpec largest = kvcheck::parse_cache_spec("legacy/f16/0/256x1024:[kv1]");
    EXPECT_EQ(largest.heads, kvcheck::cache_heads_max);
    EXPECT_EQ(largest.head_dim, kvcheck::cache_head_dim_max);
    EXPECT_NE(kvcheck::hash_op(op::Make{HandleName{1}, wide}), kvcheck::hash_op(op::Make{HandleName{1}, example_spec()}));
    CacheSpec bad = example_spec();
    bad.heads = 0;
    EXPECT_THROW(kvcheck::format_cache_spec(bad), std::invalid_argument);
}

TEST(CacheSpecText, NamesOfEnums) {
    EXPECT_STREQ(kvcheck::layout_name(Layout::legacy), "legacy");
    EXPECT_STREQ(kvcheck::dtype_name(Dtype::bf16), "bf16");
    EXPECT_STREQ(kvcheck::slot_name(kvcheck::keys), "keys");
    EXPECT_STREQ(kvcheck::slot_name(kvcheck::value_cache), "value_cache");
}

TEST(CacheSpecText, ParseErrorsNameTheFault) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"sideways/f32/1:[kv1]", "bad layout 'sideways' (expected modern or legacy)"},
        {"modern/f64/1:[kv1]", "bad dtype 'f64' (expected f32, f16 or bf16)"},
        {"modern/f32/1:[kx1]", "bad slot letter 'x' in layer 'kx1'"},
        {"modern/f32/1:[q1]", "bad slot letter 'q' in layer 'q1'"},
        {"modern/f32/1:[kk1]", "slot letter 'k' given twice in layer 'kk1'"},
        {"modern/f32/1:[-k1]", "'-' (no slots) cannot be combined with slot letters in layer '-k1'"},
        {"modern/f32/1:[~1]", "expected slot letters (k, v, K, V) or '-' for none in layer '~1'"},
        {"modern/f32/1:[kv]", "missing token count in layer 'kv'"},
        {"modern/f32/1:[kv-2]", "negative token count '-2' in layer 'kv-2'"},
        {"modern/f32/1:[kv1x]", "bad token count '1x' in layer 'kv1x'"},
        {"modern/f32/1:[kv99999999999999999999]", "token count '99999999999999999999' in layer"},
        {"modern/f32/1:[kv1", "missing ']' closing the layer list"},
        {"modern/f32/1:[kv1] ", "trailing text ' ' after ']'"},
        {"modern/f32/1:kv1]", "missing '[' after ':'"},
        {"modern/f32/1[kv1]", "missing ':' after the seed"},
        {"modern:[kv1]", "expected <layout>/<dtype>/<seed>[/<heads>x<head_dim>]:[<layer> ...]"},
        {"modern/f32/1/4:[kv1]", "bad geometry '4' (expected <heads>x<head_dim>)"},
        {"modern/f32/1/x4:[kv1]", "missing heads in the geometry"},
        {"modern/f32/1/4x:[kv1]", "missing head_dim in the geometry"},
        {"modern/f32/1/0x4:[kv1]", "heads 0 outside [1, 256]"},
        {"modern/f32/1/2x1025:[kv1]", "head_dim 1025 outside [1, 1024]"},
        {"modern/f32/1/2x-4:[kv1]", "negative head_dim '-4' in the geometry"},
        {"modern/f32/1/2x4/1:[kv1]", "bad head_dim '4/1' in the geometry"},
        {"modern/f32/:[]", "missing seed"},
        {"modern/f32/-1:[]", "negative seed '-1'"},
        {"modern/f32/0x10:[]", "bad seed '0x10'"},
        {"modern/f32/18446744073709551616:[]", "seed '18446744073709551616' is out of range"},
    };
    for (const auto& [text, fault] : cases) {
        try {
            kvcheck::parse_cache_spec(text);
            ADD_FAILURE() << "no error for: " << text;
        } catch (const std::invalid_argument& error) {
            const std::string message = error.what();
            EXPECT_EQ(message.rfind("cache spec '" + text + "': ", 0), 0u) << message;
            EXPECT_NE(message.find(fault), std::string::npos) << "got: " << message << "\nwanted: " << fault;
        }
    }
}

}  // namespace
