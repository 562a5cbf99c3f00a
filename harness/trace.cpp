// Operations as text, equality and hashing. Each is written once, over the
// op structs' fields (Boost.PFR) and the handful of field types, never once
// per operation: adding an op to the variant needs no change here, and the
// static_asserts below say what its fields must look like.
#include "kvcheck/trace.h"

#include <boost/pfr.hpp>

#include <algorithm>
#include <charconv>
#include <functional>
#include <optional>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace kvcheck {
namespace {

// ---- what an op struct may contain -----------------------------------------

// Printed as name=value, by the op's `fields` name.
template <typename T>
inline constexpr bool is_named_v = std::is_same_v<T, std::int64_t> || std::is_same_v<T, Tokens>;
// Any number of words; only the last field may be one.
template <typename T>
inline constexpr bool is_variable_v = std::is_same_v<T, Ids> || std::is_same_v<T, HandleNames>;
template <typename T>
inline constexpr bool is_field_type_v = is_named_v<T> || is_variable_v<T> || std::is_same_v<T, HandleName> ||
                                        std::is_same_v<T, std::string> || std::is_same_v<T, CacheSpec>;

// An op whose first field is named "out" creates that handle: "h2 = get a".
template <typename O>
constexpr bool has_out() {
    if constexpr (O::fields.size() == 0) {
        return false;
    } else {
        return std::string_view(O::fields[0]) == "out";
    }
}

template <typename O, std::size_t... I>
constexpr bool field_types_supported(std::index_sequence<I...>) {
    return (is_field_type_v<boost::pfr::tuple_element_t<I, O>> && ...);
}

template <typename O, std::size_t... I>
constexpr bool variable_field_last(std::index_sequence<I...>) {
    return ((!is_variable_v<boost::pfr::tuple_element_t<I, O>> || I + 1 == sizeof...(I)) && ...);
}

// The traits every operation states (trace.h, "operation traits"), with the
// types the harness reads them as: an operation missing one does not compile.
template <typename O>
constexpr bool op_traits_stated() {
    static_assert(std::is_same_v<decltype(O::reach), const StoreReach>, "an op must state its `reach`");
    static_assert(std::is_same_v<decltype(O::changes_ids), const bool>, "an op must state `changes_ids`");
    static_assert(std::is_same_v<decltype(O::needs), const std::uint8_t>, "an op must state the capabilities it `needs`");
    static_assert(std::is_same_v<decltype(O::list_min), const std::size_t>, "an op must state `list_min`");
    static_assert(std::is_same_v<decltype(std::declval<const O&>().well_formed()), bool>,
                  "an op must say when it is `well_formed()`");
    return true;
}

template <typename O>
constexpr bool op_struct_valid() {
    static_assert(op_traits_stated<O>());
    constexpr std::size_t count = boost::pfr::tuple_size_v<O>;
    static_assert(count == O::fields.size(), "an op's `fields` must name each of its fields");
    static_assert(field_types_supported<O>(std::make_index_sequence<count>{}),
                  "an op field must be HandleName, std::string, CacheSpec, std::int64_t, Tokens, Ids or HandleNames");
    static_assert(variable_field_last<O>(std::make_index_sequence<count>{}),
                  "only an op's last field may be variable-length (Ids, HandleNames)");
    if constexpr (has_out<O>()) {
        static_assert(std::is_same_v<boost::pfr::tuple_element_t<0, O>, HandleName>,
                      "an `out` field must be a HandleName");
    }
    return true;
}

template <std::size_t... K>
constexpr std::array<const char*, op_kind_count> names_of_kinds(std::index_sequence<K...>) {
    static_assert((op_struct_valid<std::variant_alternative_t<K, Op>>() && ...));
    return {std::variant_alternative_t<K, Op>::name...};
}

constexpr std::array<const char*, op_kind_count> kind_names = names_of_kinds(std::make_index_sequence<op_kind_count>{});

template <std::size_t... K>
constexpr std::array<std::uint8_t, op_kind_count> needs_of_kinds(std::index_sequence<K...>) {
    return {std::variant_alternative_t<K, Op>::needs...};
}

constexpr std::array<std::uint8_t, op_kind_count> kind_needs = needs_of_kinds(std::make_index_sequence<op_kind_count>{});

constexpr bool kind_names_unique() {
    for (std::size_t a = 0; a < op_kind_count; ++a) {
        for (std::size_t b = a + 1; b < op_kind_count; ++b) {
            if (std::string_view(kind_names[a]) == kind_names[b]) return false;
        }
    }
    return true;
}
static_assert(kind_names_unique(), "two ops share a name; the text could not tell them apart");

// ---- words shared by formatting and parsing --------------------------------

bool is_id_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == '-';
}

bool is_id(std::string_view text) {
    if (text.empty()) return false;
    for (char c : text) {
        if (!is_id_char(c)) return false;
    }
    return true;
}

std::string id_fault(std::string_view text, const char* field) {
    return "bad id '" + std::string(text) + "' in field '" + field + "' (ids are [A-Za-z0-9_.-]+)";
}

// Appends a word, space-separated.
void put(std::string& line, std::string_view word) {
    if (!line.empty()) line += ' ';
    line += word;
}

// ---- formatting: one overload per field type --------------------------------

std::string handle_text(HandleName handle, const char* field) {
    if (handle.value < 0) {
        throw std::invalid_argument("negative handle " + std::to_string(handle.value) + " in field '" + field + "'");
    }
    return "h" + std::to_string(handle.value);
}

void format_field(std::string& line, const char* field, HandleName handle) { put(line, handle_text(handle, field)); }

void format_field(std::string& line, const char* field, const std::string& id) {
    if (!is_id(id)) throw std::invalid_argument(id_fault(id, field));
    put(line, id);
}

void format_field(std::string& line, const char*, const CacheSpec& spec) { put(line, format_cache_spec(spec)); }

void format_field(std::string& line, const char* field, std::int64_t value) {
    put(line, std::string(field) + '=' + std::to_string(value));
}

void format_field(std::string& line, const char* field, const Tokens& tokens) {
    std::string text = std::string(field) + '=';
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (i > 0) text += ',';
        text += std::to_string(tokens[i]);
    }
    put(line, text);
}

template <typename T>
void format_field(std::string& line, const char* field, const std::vector<T>& words) {
    static_assert(is_variable_v<std::vector<T>>);
    for (const T& word : words) format_field(line, field, word);
}

template <typename O>
std::string format_fields(const O& op) {
    std::string line;
    if constexpr (has_out<O>()) {
        put(line, handle_text(boost::pfr::get<0>(op), "out"));
        put(line, "=");
    }
    put(line, O::name);
    boost::pfr::for_each_field(op, [&line](const auto& field, auto index) {
        if constexpr (!has_out<O>() || decltype(index)::value != 0) {
            format_field(line, O::fields[decltype(index)::value], field);
        }
    });
    return line;
}

// ---- parsing ----------------------------------------------------------------

[[noreturn]] void fail(const std::string& fault) { throw TraceParseError(fault); }

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// The words of one line. A bracketed group is one word, blanks included, so
// that a cache spec's layer list "[kv2 k~1]" stays whole.
class Cursor {
  public:
    explicit Cursor(std::string_view line) : rest_(line) {}

    bool at_end() {
        skip_blanks();
        return rest_.empty();
    }

    // The next word; empty at the end of the line.
    std::string_view word() {
        skip_blanks();
        std::size_t end = 0;
        bool bracketed = false;
        for (; end < rest_.size(); ++end) {
            const char c = rest_[end];
            if (!bracketed && is_blank(c)) break;
            if (c == '[') bracketed = true;
            if (c == ']') bracketed = false;
        }
        const std::string_view result = rest_.substr(0, end);
        rest_.remove_prefix(end);
        return result;
    }

    std::string_view rest() {
        skip_blanks();
        return rest_;
    }

  private:
    void skip_blanks() {
        while (!rest_.empty() && is_blank(rest_.front())) rest_.remove_prefix(1);
    }

    std::string_view rest_;
};

std::string_view require_word(Cursor& in, const char* field) {
    const std::string_view word = in.word();
    if (word.empty()) fail("missing field '" + std::string(field) + "'");
    return word;
}

std::int64_t parse_number(std::string_view text, const char* field) {
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    const std::string quoted = "'" + std::string(text) + "' in field '" + field + "'";
    if (error == std::errc::result_out_of_range) fail("number " + quoted + " is out of range for int64");
    if (error != std::errc() || end != text.data() + text.size()) {
        fail("bad number " + quoted + " (expected a decimal int64)");
    }
    return value;
}

HandleName parse_handle(std::string_view text, const char* field) {
    const bool digits = text.size() >= 2 && text[0] == 'h' && text[1] >= '0' && text[1] <= '9';
    HandleName handle;
    const auto [end, error] =
        digits ? std::from_chars(text.data() + 1, text.data() + text.size(), handle.value) : std::from_chars_result{};
    if (!digits || error != std::errc() || end != text.data() + text.size()) {
        fail("bad handle '" + std::string(text) + "' in field '" + field + "' (expected h<N>, N a decimal int64 >= 0)");
    }
    return handle;
}

// The value of a name=value word; the name must be the field's.
std::string_view named_value(Cursor& in, const char* field) {
    const std::string_view word = require_word(in, field);
    const std::string prefix = std::string(field) + '=';
    if (word.substr(0, prefix.size()) != prefix) {
        fail("expected field '" + prefix + "...', got '" + std::string(word) + "'");
    }
    return word.substr(prefix.size());
}

// ---- parsing: one overload per field type -----------------------------------

void parse_field(Cursor& in, const char* field, HandleName& handle) {
    handle = parse_handle(require_word(in, field), field);
}

void parse_field(Cursor& in, const char* field, std::string& id) {
    const std::string_view word = require_word(in, field);
    if (!is_id(word)) fail(id_fault(word, field));
    id = word;
}

void parse_field(Cursor& in, const char* field, CacheSpec& spec) {
    const std::string_view word = require_word(in, field);
    try {
        spec = parse_cache_spec(std::string(word));
    } catch (const std::invalid_argument& error) {
        fail("bad cache spec in field '" + std::string(field) + "': " + error.what());
    }
}

void parse_field(Cursor& in, const char* field, std::int64_t& value) {
    value = parse_number(named_value(in, field), field);
}

void parse_field(Cursor& in, const char* field, Tokens& tokens) {
    std::string_view list = named_value(in, field);
    tokens.clear();
    if (list.empty()) return;
    for (;;) {
        const std::size_t comma = list.find(',');
        tokens.push_back(parse_number(list.substr(0, comma), field));
        if (comma == std::string_view::npos) return;
        list.remove_prefix(comma + 1);
    }
}

void parse_field(Cursor& in, const char* field, Ids& ids) {
    ids.clear();
    while (!in.at_end()) {
        const std::string_view word = in.word();
        if (!is_id(word)) fail(id_fault(word, field));
        ids.emplace_back(word);
    }
}

void parse_field(Cursor& in, const char* field, HandleNames& handles) {
    handles.clear();
    while (!in.at_end()) handles.push_back(parse_handle(in.word(), field));
}

template <typename O>
void parse_fields_into(Cursor& in, const std::optional<HandleName>& out, O& op) {
    if constexpr (has_out<O>()) {
        if (!out) fail("missing 'h<N> =' before the operation, naming the handle it creates");
        boost::pfr::get<0>(op) = *out;
    } else if (out) {
        fail("creates no handle, so takes no 'h" + std::to_string(out->value) + " ='");
    }
    boost::pfr::for_each_field(op, [&in](auto& field, auto index) {
        if constexpr (!has_out<O>() || decltype(index)::value != 0) {
            parse_field(in, O::fields[decltype(index)::value], field);
        }
    });
    if (!in.at_end()) fail("trailing text '" + std::string(in.rest()) + "'");
}

// Errors name the operation: "generate: bad number 'x' in field 'max' ...".
template <typename O>
Op parse_fields(Cursor& in, const std::optional<HandleName>& out) {
    O op{};
    try {
        parse_fields_into(in, out, op);
    } catch (const TraceParseError& error) {
        fail(std::string(O::name) + ": " + error.what());
    }
    return op;
}

using OpParser = Op (*)(Cursor&, const std::optional<HandleName>&);

template <std::size_t... K>
constexpr std::array<OpParser, op_kind_count> parsers_of_kinds(std::index_sequence<K...>) {
    return {&parse_fields<std::variant_alternative_t<K, Op>>...};
}

constexpr std::array<OpParser, op_kind_count> kind_parsers =
    parsers_of_kinds(std::make_index_sequence<op_kind_count>{});

std::optional<std::size_t> kind_of_name(std::string_view name) {
    for (std::size_t kind = 0; kind < op_kind_count; ++kind) {
        if (name == kind_names[kind]) return kind;
    }
    return std::nullopt;
}

// ---- hashing: one overload per field type -----------------------------------

void mix(std::size_t& seed, std::size_t value) {
    seed ^= value + static_cast<std::size_t>(0x9e3779b97f4a7c15ULL) + (seed << 6) + (seed >> 2);
}

std::size_t field_hash(HandleName handle) { return std::hash<std::int64_t>{}(handle.value); }
std::size_t field_hash(std::int64_t value) { return std::hash<std::int64_t>{}(value); }
std::size_t field_hash(const std::string& id) { return std::hash<std::string>{}(id); }

std::size_t field_hash(const CacheSpec& spec) {
    std::size_t seed = 0;
    mix(seed, static_cast<std::size_t>(spec.layout));
    mix(seed, static_cast<std::size_t>(spec.dtype));
    mix(seed, std::hash<std::uint64_t>{}(spec.seed));
    mix(seed, spec.layers.size());
    for (const LayerSpec& layer : spec.layers) {
        mix(seed, layer.slots);
        mix(seed, layer.initialized);
        mix(seed, field_hash(layer.tokens));
    }
    return seed;
}

template <typename T>
std::size_t field_hash(const std::vector<T>& values) {
    std::size_t seed = values.size();
    for (const T& value : values) mix(seed, field_hash(value));
    return seed;
}

}  // namespace

// A valueless Op (index variant_npos) throws std::out_of_range.
const char* op_name(const Op& op) { return op_kind_name(op.index()); }

const char* op_kind_name(std::size_t kind) {
    if (kind >= op_kind_count) throw std::out_of_range("op kind " + std::to_string(kind) + " is out of range");
    return kind_names[kind];
}

StoreReach op_reach(const Op& op) {
    return std::visit([](const auto& o) { return std::decay_t<decltype(o)>::reach; }, op);
}

bool op_changes_ids(const Op& op) {
    return std::visit([](const auto& o) { return std::decay_t<decltype(o)>::changes_ids; }, op);
}

std::uint8_t op_needs(std::size_t kind) {
    if (kind >= op_kind_count) throw std::out_of_range("op kind " + std::to_string(kind) + " is out of range");
    return kind_needs[kind];
}

bool op_well_formed(const Op& op) {
    return std::visit([](const auto& o) { return o.well_formed(); }, op);
}

bool engine_supports(const Capabilities& capabilities, std::uint8_t needs) {
    if ((needs & needs_dump) && !capabilities.dump) return false;
    if ((needs & needs_dump_crash) && !capabilities.dump_crash) return false;
    if ((needs & needs_stream) && !capabilities.generate_stream) return false;
    if ((needs & needs_conversions) && !(capabilities.conversions && capabilities.legacy_layout)) return false;
    return true;
}

bool engine_supports(const Capabilities& capabilities, const CacheSpec& spec) {
    if (spec.layout == Layout::legacy && !capabilities.legacy_layout) return false;
    if (spec.dtype != Dtype::f32 && !capabilities.half_dtypes) return false;
    for (const LayerSpec& layer : spec.layers) {
        const bool one_sided = (layer.slots & 0b11) == 0b01 || (layer.slots & 0b11) == 0b10;
        if (one_sided && !capabilities.one_sided_layers) return false;
        if ((layer.slots & 0b1100) != 0 && !capabilities.legacy_slot_names) return false;
        if (!layer.initialized && !capabilities.uninitialized_layers) return false;
    }
    return true;
}

bool engine_supports(const Capabilities& capabilities, const Op& op) {
    if (!engine_supports(capabilities, op_needs(op.index()))) return false;
    bool supported = true;
    std::visit(
        [&](const auto& o) {
            boost::pfr::for_each_field(o, [&](const auto& field) {
                if constexpr (std::is_same_v<std::decay_t<decltype(field)>, CacheSpec>) {
                    supported = supported && engine_supports(capabilities, field);
                }
            });
        },
        op);
    return supported;
}

std::int64_t created_handle(const Op& op) {
    return std::visit(
        [](const auto& alternative) -> std::int64_t {
            if constexpr (has_out<std::decay_t<decltype(alternative)>>()) {
                return boost::pfr::get<0>(alternative).value;
            } else {
                return 0;
            }
        },
        op);
}

bool operator==(const Op& a, const Op& b) {
    if (a.index() != b.index()) return false;
    return std::visit(
        [&b](const auto& alternative) {
            return boost::pfr::eq_fields(alternative, std::get<std::decay_t<decltype(alternative)>>(b));
        },
        a);
}

std::size_t hash_op(const Op& op) {
    std::size_t seed = op.index();
    std::visit([&seed](const auto& alternative) {
        boost::pfr::for_each_field(alternative, [&seed](const auto& field) { mix(seed, field_hash(field)); });
    }, op);
    return seed;
}

std::string format_op(const Op& op) {
    return std::visit([](const auto& alternative) { return format_fields(alternative); }, op);
}

std::string format_trace(const Trace& trace) {
    std::string text;
    for (const Op& op : trace) text += format_op(op) + '\n';
    return text;
}

Op parse_op(const std::string& line) {
    Cursor in(line);
    if (in.at_end()) fail("empty operation");
    const std::string_view first = in.word();
    std::string_view name = first;
    std::optional<HandleName> out;
    Cursor after_first = in;
    if (after_first.word() == "=") {
        in = after_first;
        out = parse_handle(first, "out");
        name = in.word();
        if (name.empty()) fail("missing operation after '" + std::string(first) + " ='");
    }
    const std::optional<std::size_t> kind = kind_of_name(name);
    if (!kind) {
        const bool glued = name.find('=') != std::string_view::npos;
        fail("unknown operation '" + std::string(name) + "'" + (glued ? " (write 'h<N> = <op>', spaced)" : ""));
    }
    return kind_parsers[*kind](in, out);
}

Trace parse_trace(const std::string& text) {
    Trace trace;
    std::size_t line_number = 0;
    std::size_t start = 0;
    while (start < text.size()) {
        ++line_number;
        const std::size_t newline = std::min(text.find('\n', start), text.size());
        std::string line = text.substr(start, newline - start);
        start = newline + 1;
        line = line.substr(0, line.find('#'));
        if (Cursor(line).at_end()) continue;
        try {
            trace.push_back(parse_op(line));
        } catch (const TraceParseError& error) {
            fail("line " + std::to_string(line_number) + ": " + error.what());
        }
    }
    return trace;
}

}  // namespace kvcheck
