// Operations as text: formatting and parsing, each written once over the op
// structs' fields (Boost.PFR) and the handful of field types, never once
// per operation: adding an op to the variant needs no change here
// (harness/ops.cpp asserts what its fields must look like).
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

void format_field(std::string& line, const char* field, MetaSeed meta) {
    if (meta.value != 0) put(line, std::string(field) + '=' + std::to_string(meta.value));
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
    static_assert(detail::is_variable_v<std::vector<T>>);
    for (const T& word : words) format_field(line, field, word);
}

template <typename O>
std::string format_fields(const O& op) {
    std::string line;
    if constexpr (detail::has_out<O>()) {
        put(line, handle_text(boost::pfr::get<0>(op), "out"));
        put(line, "=");
    }
    put(line, O::name);
    boost::pfr::for_each_field(op, [&line](const auto& field, auto index) {
        if constexpr (!detail::has_out<O>() || decltype(index)::value != 0) {
            format_field(line, O::fields[decltype(index)::value], field);
        }
    });
    return line;
}

// ---- parsing ----------------------------------------------------------------

// A NUL of the text quoted is written \x00, as a report prints any other
// control byte: what() is a C string, cut at the first NUL.
[[noreturn]] void fail(const std::string& fault) {
    std::string text;
    for (const char c : fault) text += c == '\0' ? std::string("\\x00") : std::string(1, c);
    throw TraceParseError(text);
}

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

void parse_field(Cursor& in, const char* field, MetaSeed& meta) {
    meta.value = in.at_end() ? 0 : parse_number(named_value(in, field), field);
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
    if constexpr (detail::has_out<O>()) {
        if (!out) fail("missing 'h<N> =' before the operation, naming the handle it creates");
        boost::pfr::get<0>(op) = *out;
    } else if (out) {
        fail("creates no handle, so takes no 'h" + std::to_string(out->value) + " ='");
    }
    boost::pfr::for_each_field(op, [&in](auto& field, auto index) {
        if constexpr (!detail::has_out<O>() || decltype(index)::value != 0) {
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
        if (name == op_kind_name(kind)) return kind;
    }
    return std::nullopt;
}

}  // namespace
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
