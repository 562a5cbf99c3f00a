// The text form of a cache spec:
// "<layout>/<dtype>/<seed>[/<heads>x<head_dim>]:[<layer> ...]", the geometry
// only when it is not the default (so every text written before caches had
// a geometry reads as it did).
//
// The text is syntactic only: it carries every CacheSpec whose fields are in
// range (slots within the four slot bits, tokens not negative), including
// combinations that mean nothing for a legacy cache; giving those a meaning
// is expand()'s job, not the parser's.
#include "kvcheck/content.h"
#include "kvcheck/limits.h"

#include <cctype>
#include <charconv>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace kvcheck {
namespace {

// Slot letters in bit order: bit i of LayerSpec::slots is slot_letters[i].
constexpr std::string_view slot_letters = "kvKV";
constexpr std::uint8_t slot_bits_all = 0b1111;

bool is_blank(char c) { return c == ' ' || c == '\t'; }

// A long spec is quoted by its start, so that the fault stays in view.
[[noreturn]] void fail(std::string_view text, const std::string& fault) {
    constexpr std::size_t quoted_max = 80;
    const std::string quoted = text.size() <= quoted_max
                                   ? std::string(text)
                                   : std::string(text.substr(0, quoted_max)) + "... (" + std::to_string(text.size()) + " bytes)";
    throw std::invalid_argument("cache spec '" + quoted + "': " + fault);
}

Layout parse_layout(std::string_view spec, std::string_view word) {
    for (Layout layout : {Layout::modern, Layout::legacy}) {
        if (word == layout_name(layout)) return layout;
    }
    fail(spec, "bad layout '" + std::string(word) + "' (expected modern or legacy)");
}

Dtype parse_dtype(std::string_view spec, std::string_view word) {
    for (Dtype dtype : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
        if (word == dtype_name(dtype)) return dtype;
    }
    fail(spec, "bad dtype '" + std::string(word) + "' (expected f32, f16 or bf16)");
}

// Digits only: no sign, no spaces, the whole word. `where` says which part
// of the spec the number is, for the message.
template <typename Integer>
Integer parse_count(std::string_view spec, std::string_view word, const std::string& what,
                    const std::string& where) {
    const std::string quoted = what + " '" + std::string(word) + "'";
    if (word.empty()) fail(spec, "missing " + what + where);
    if (word.front() == '-') fail(spec, "negative " + quoted + where);
    Integer value = 0;
    const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), value);
    if (error == std::errc::result_out_of_range) {
        fail(spec, quoted + where + " is out of range (at most " +
                       std::to_string(std::numeric_limits<Integer>::max()) + ")");
    }
    if (error != std::errc() || end != word.data() + word.size()) {
        fail(spec, "bad " + quoted + where + " (expected decimal digits)");
    }
    return value;
}

// One layer: slot letters or "-", then "~" when uninitialized, then tokens.
LayerSpec parse_layer(std::string_view spec, std::string_view word) {
    const std::string where = " in layer '" + std::string(word) + "'";
    LayerSpec layer;
    layer.slots = 0;
    std::size_t at = 0;
    if (at < word.size() && word[at] == '-') {
        ++at;
        if (at < word.size() && slot_letters.find(word[at]) != std::string_view::npos) {
            fail(spec, "'-' (no slots) cannot be combined with slot letters" + where);
        }
    } else {
        for (; at < word.size(); ++at) {
            const std::size_t bit = slot_letters.find(word[at]);
            if (bit == std::string_view::npos) break;
            const auto mask = static_cast<std::uint8_t>(1u << bit);
            if (layer.slots & mask) {
                fail(spec, "slot letter '" + std::string(1, word[at]) + "' given twice" + where);
            }
            layer.slots |= mask;
        }
        // A letter that is no slot falls through to the "bad slot letter" below.
        if (at == 0 && !word.empty() && !std::isalpha(static_cast<unsigned char>(word.front()))) {
            fail(spec, "expected slot letters (k, v, K, V) or '-' for none" + where);
        }
    }
    if (at < word.size() && word[at] == '~') {
        layer.initialized = false;
        ++at;
    }
    const std::string_view count = word.substr(at);
    if (!count.empty() && std::isalpha(static_cast<unsigned char>(count.front()))) {
        fail(spec, "bad slot letter '" + std::string(1, count.front()) + "'" + where +
                       " (expected k, v, K, V or '-' for none)");
    }
    layer.tokens = parse_count<std::int64_t>(spec, count, "token count", where);
    return layer;
}

// "<heads>x<head_dim>", each at least 1 and at most its maximum.
void parse_geometry(std::string_view spec, std::string_view word, CacheSpec& result) {
    const std::size_t x = word.find('x');
    if (x == std::string_view::npos) fail(spec, "bad geometry '" + std::string(word) + "' (expected <heads>x<head_dim>)");
    result.heads = parse_count<std::int64_t>(spec, word.substr(0, x), "heads", " in the geometry");
    result.head_dim = parse_count<std::int64_t>(spec, word.substr(x + 1), "head_dim", " in the geometry");
    if (result.heads < 1 || result.heads > cache_heads_max) {
        fail(spec, "heads " + std::to_string(result.heads) + " outside [1, " + std::to_string(cache_heads_max) + "]");
    }
    if (result.head_dim < 1 || result.head_dim > cache_head_dim_max) {
        fail(spec, "head_dim " + std::to_string(result.head_dim) + " outside [1, " + std::to_string(cache_head_dim_max) + "]");
    }
}

std::string format_layer(const LayerSpec& layer) {
    if (layer.slots & ~slot_bits_all) {
        throw std::invalid_argument("cache spec layer slots " + std::to_string(layer.slots) +
                                    " name bits beyond the four slots");
    }
    if (layer.tokens < 0) {
        throw std::invalid_argument("cache spec layer has negative tokens " + std::to_string(layer.tokens));
    }
    std::string text;
    for (std::size_t bit = 0; bit < slot_letters.size(); ++bit) {
        if (layer.slots & (1u << bit)) text += slot_letters[bit];
    }
    if (text.empty()) text = "-";
    if (!layer.initialized) text += '~';
    return text + std::to_string(layer.tokens);
}

}  // namespace

const char* layout_name(Layout layout) {
    switch (layout) {
        case Layout::modern: return "modern";
        case Layout::legacy: return "legacy";
    }
    return "invalid-layout";
}

const char* dtype_name(Dtype dtype) {
    switch (dtype) {
        case Dtype::f32: return "f32";
        case Dtype::f16: return "f16";
        case Dtype::bf16: return "bf16";
    }
    return "invalid-dtype";
}

const char* slot_name(Slot slot) {
    switch (slot) {
        case Slot::keys: return "keys";
        case Slot::values: return "values";
        case Slot::key_cache: return "key_cache";
        case Slot::value_cache: return "value_cache";
    }
    return "invalid-slot";
}

std::string format_cache_spec(const CacheSpec& spec) {
    if (spec.layout != Layout::modern && spec.layout != Layout::legacy) {
        throw std::invalid_argument("cache spec has an invalid layout");
    }
    if (spec.dtype != Dtype::f32 && spec.dtype != Dtype::f16 && spec.dtype != Dtype::bf16) {
        throw std::invalid_argument("cache spec has an invalid dtype");
    }
    if (spec.heads < 1 || spec.heads > cache_heads_max || spec.head_dim < 1 || spec.head_dim > cache_head_dim_max) {
        throw std::invalid_argument("cache spec has an invalid geometry " + std::to_string(spec.heads) + "x" +
                                    std::to_string(spec.head_dim));
    }
    std::string text = std::string(layout_name(spec.layout)) + '/' + dtype_name(spec.dtype) + '/' + std::to_string(spec.seed);
    if (spec.heads != cache_heads || spec.head_dim != cache_head_dim) {
        text += '/' + std::to_string(spec.heads) + 'x' + std::to_string(spec.head_dim);
    }
    text += ":[";
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        if (i > 0) text += ' ';
        text += format_layer(spec.layers[i]);
    }
    return text + ']';
}

std::string spec_over_limits(const CacheSpec& spec) {
    if (static_cast<std::int64_t>(spec.layers.size()) > spec_layers_max) {
        return std::to_string(spec.layers.size()) + " layers, more than " + std::to_string(spec_layers_max) +
               " (the most a generated trace holds)";
    }
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        const std::int64_t tokens = spec.layers[i].tokens;
        if (tokens > spec_layer_tokens_max) {
            return "layer " + std::to_string(i) + " holds " + std::to_string(tokens) + " tokens, more than " +
                   std::to_string(spec_layer_tokens_max) + " (the most a generated trace holds)";
        }
        if (tokens * spec.heads * spec.head_dim > spec_slot_values_max) {
            return "layer " + std::to_string(i) + " holds " + std::to_string(tokens) + " tokens of " + std::to_string(spec.heads) +
                   "x" + std::to_string(spec.head_dim) + ", more than " + std::to_string(spec_slot_values_max) + " values a slot";
        }
    }
    return "";
}

CacheSpec parse_cache_spec(const std::string& text) {
    const std::string_view spec = text;
    const std::size_t slash_1 = spec.find('/');
    const std::size_t slash_2 = slash_1 == std::string_view::npos ? slash_1 : spec.find('/', slash_1 + 1);
    if (slash_2 == std::string_view::npos) fail(spec, "expected <layout>/<dtype>/<seed>[/<heads>x<head_dim>]:[<layer> ...]");
    const std::size_t colon = spec.find(':', slash_2 + 1);
    if (colon == std::string_view::npos) fail(spec, "missing ':' after the seed");
    const std::size_t slash_3 = spec.substr(0, colon).find('/', slash_2 + 1);
    if (colon + 1 >= spec.size() || spec[colon + 1] != '[') fail(spec, "missing '[' after ':'");
    const std::size_t close = spec.find(']', colon + 2);
    if (close == std::string_view::npos) fail(spec, "missing ']' closing the layer list");
    if (close + 1 != spec.size()) fail(spec, "trailing text '" + std::string(spec.substr(close + 1)) + "' after ']'");

    CacheSpec result;
    result.layout = parse_layout(spec, spec.substr(0, slash_1));
    result.dtype = parse_dtype(spec, spec.substr(slash_1 + 1, slash_2 - slash_1 - 1));
    const std::size_t seed_end = slash_3 == std::string_view::npos ? colon : slash_3;
    result.seed = parse_count<std::uint64_t>(spec, spec.substr(slash_2 + 1, seed_end - slash_2 - 1), "seed", "");
    if (slash_3 != std::string_view::npos) parse_geometry(spec, spec.substr(slash_3 + 1, colon - slash_3 - 1), result);
    std::string_view layers = spec.substr(colon + 2, close - colon - 2);
    while (!layers.empty()) {
        if (is_blank(layers.front())) {
            layers.remove_prefix(1);
            continue;
        }
        std::size_t end = 0;
        while (end < layers.size() && !is_blank(layers[end])) ++end;
        result.layers.push_back(parse_layer(spec, layers.substr(0, end)));
        layers.remove_prefix(end);
    }
    return result;
}

}  // namespace kvcheck
