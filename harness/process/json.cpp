#include "json.h"

#include <charconv>
#include <cstdio>

namespace kvcheck::process {

namespace {

// Nesting deeper than this is not a protocol message: refusing it keeps a
// garbage frame of '[' from exhausting the stack.
constexpr int depth_max = 64;

void append_utf8(std::string& out, std::uint32_t code) {
    if (code < 0x80) {
        out += static_cast<char>(code);
    } else if (code < 0x800) {
        out += static_cast<char>(0xC0 | (code >> 6));
        out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
        out += static_cast<char>(0xE0 | (code >> 12));
        out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (code >> 18));
        out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (code & 0x3F));
    }
}

}  // namespace

class JsonParser {
  public:
    explicit JsonParser(std::string_view text) : text_(text) {}

    Json document() {
        Json value = parse_value(0);
        skip_space();
        if (at_ != text_.size()) fail("trailing text after the value");
        return value;
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        throw JsonError("not valid JSON at byte " + std::to_string(at_) + ": " + what);
    }

    void skip_space() {
        while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t' || text_[at_] == '\r')) {
            ++at_;
        }
    }

    char peek() {
        skip_space();
        if (at_ >= text_.size()) fail("unexpected end of text");
        return text_[at_];
    }

    void expect(char c) {
        if (peek() != c) fail(std::string("expected '") + c + "'");
        ++at_;
    }

    void literal(std::string_view word) {
        if (text_.substr(at_, word.size()) != word) fail("expected a value");
        at_ += word.size();
    }

    Json parse_value(int depth) {
        if (depth > depth_max) fail("nested deeper than " + std::to_string(depth_max) + " levels");
        Json value;
        const char c = peek();
        if (c == '{') {
            value.type_ = Json::Type::object;
            ++at_;
            if (peek() == '}') {
                ++at_;
                return value;
            }
            for (;;) {
                if (peek() != '"') fail("expected a member name");
                std::string key = parse_string();
                expect(':');
                value.object_.emplace_back(std::move(key), parse_value(depth + 1));
                if (peek() == ',') {
                    ++at_;
                    continue;
                }
                expect('}');
                return value;
            }
        }
        if (c == '[') {
            value.type_ = Json::Type::array;
            ++at_;
            if (peek() == ']') {
                ++at_;
                return value;
            }
            for (;;) {
                value.array_.push_back(parse_value(depth + 1));
                if (peek() == ',') {
                    ++at_;
                    continue;
                }
                expect(']');
                return value;
            }
        }
        if (c == '"') {
            value.type_ = Json::Type::string;
            value.string_ = parse_string();
            return value;
        }
        if (c == 't' || c == 'f') {
            value.type_ = Json::Type::boolean;
            value.boolean_ = c == 't';
            literal(c == 't' ? "true" : "false");
            return value;
        }
        if (c == 'n') {
            literal("null");
            return value;
        }
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        fail(std::string("unexpected character '") + c + "'");
    }

    Json parse_number() {
        Json value;
        const std::size_t start = at_;
        if (text_[at_] == '-') {
            value.negative_ = true;
            ++at_;
        }
        const std::size_t digits = at_;
        while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
        if (at_ == digits) fail("expected digits");
        const std::size_t integer_end = at_;
        bool real = false;
        if (at_ < text_.size() && text_[at_] == '.') {
            real = true;
            ++at_;
            if (!skip_digits()) fail("expected digits after '.'");
        }
        if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
            real = true;
            ++at_;
            if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
            if (!skip_digits()) fail("expected digits in the exponent");
        }
        if (real) {
            const auto [end, error] = std::from_chars(text_.data() + start, text_.data() + at_, value.real_);
            if (error != std::errc() || end != text_.data() + at_) {
                at_ = start;
                fail("real number out of the double range");
            }
            value.type_ = Json::Type::real;
            return value;
        }
        const auto [end, error] = std::from_chars(text_.data() + digits, text_.data() + integer_end, value.magnitude_);
        if (error != std::errc() || end != text_.data() + integer_end) {
            at_ = start;
            fail("integer out of the 64-bit range");
        }
        value.type_ = Json::Type::integer;
        return value;
    }

    bool skip_digits() {
        const std::size_t start = at_;
        while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
        return at_ > start;
    }

    std::uint32_t hex4() {
        if (at_ + 4 > text_.size()) fail("truncated \\u escape");
        std::uint32_t code = 0;
        for (int i = 0; i < 4; ++i) {
            const char h = text_[at_++];
            code <<= 4;
            if (h >= '0' && h <= '9') code |= static_cast<std::uint32_t>(h - '0');
            else if (h >= 'a' && h <= 'f') code |= static_cast<std::uint32_t>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') code |= static_cast<std::uint32_t>(h - 'A' + 10);
            else fail("bad \\u escape");
        }
        return code;
    }

    std::string parse_string() {
        ++at_;  // the opening quote
        std::string out;
        for (;;) {
            if (at_ >= text_.size()) fail("unterminated string");
            const char c = text_[at_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (at_ >= text_.size()) fail("unterminated string");
            const char e = text_[at_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    std::uint32_t code = hex4();
                    if (code >= 0xD800 && code < 0xDC00 && text_.substr(at_, 2) == "\\u") {
                        at_ += 2;
                        const std::uint32_t low = hex4();
                        if (low < 0xDC00 || low >= 0xE000) fail("bad surrogate pair");
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                    }
                    append_utf8(out, code);
                    break;
                }
                default: fail(std::string("bad escape '\\") + e + "'");
            }
        }
    }

    std::string_view text_;
    std::size_t at_ = 0;
};

Json Json::parse(std::string_view text) { return JsonParser(text).document(); }

const char* Json::type_name() const {
    switch (type_) {
        case Type::null: return "null";
        case Type::boolean: return "a boolean";
        case Type::integer: return "an integer";
        case Type::real: return "a real number";
        case Type::string: return "a string";
        case Type::array: return "an array";
        case Type::object: return "an object";
    }
    return "?";
}

namespace {
[[noreturn]] void wrong_type(const Json& value, const char* expected) {
    throw JsonError(std::string("expected ") + expected + ", found " + value.type_name());
}
}  // namespace

bool Json::as_bool() const {
    if (type_ != Type::boolean) wrong_type(*this, "a boolean");
    return boolean_;
}

std::int64_t Json::as_int() const {
    if (type_ != Type::integer) wrong_type(*this, "an integer");
    const std::uint64_t limit = negative_ ? (std::uint64_t{1} << 63) : (std::uint64_t{1} << 63) - 1;
    if (magnitude_ > limit) throw JsonError("integer out of the signed 64-bit range");
    return negative_ ? static_cast<std::int64_t>(~magnitude_ + 1) : static_cast<std::int64_t>(magnitude_);
}

double Json::as_number() const {
    if (type_ == Type::real) return real_;
    if (type_ != Type::integer) wrong_type(*this, "a number");
    const double magnitude = static_cast<double>(magnitude_);
    return negative_ ? -magnitude : magnitude;
}

std::uint64_t Json::as_uint() const {
    if (type_ != Type::integer) wrong_type(*this, "an integer");
    if (negative_ && magnitude_ != 0) throw JsonError("expected an unsigned integer, found a negative one");
    return magnitude_;
}

const std::string& Json::as_string() const {
    if (type_ != Type::string) wrong_type(*this, "a string");
    return string_;
}

const std::vector<Json>& Json::as_array() const {
    if (type_ != Type::array) wrong_type(*this, "an array");
    return array_;
}

const std::vector<Json::Member>& Json::as_object() const {
    if (type_ != Type::object) wrong_type(*this, "an object");
    return object_;
}

const Json* Json::find(std::string_view key) const {
    for (const Member& member : object_) {
        if (member.first == key) return &member.second;
    }
    return nullptr;
}

const Json& Json::at(std::string_view key) const {
    if (type_ != Type::object) wrong_type(*this, "an object");
    const Json* found = find(key);
    if (found == nullptr) throw JsonError("missing member '" + std::string(key) + "'");
    return *found;
}

void json_append_string(std::string& out, std::string_view text) {
    out += '"';
    for (const char c : text) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char escaped[8];
                    std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
                    out += escaped;
                } else {
                    out += c;
                }
        }
    }
    out += '"';
}

void json_append_int(std::string& out, std::int64_t value) {
    char digits[24];
    const auto result = std::to_chars(digits, digits + sizeof digits, value);
    out.append(digits, result.ptr);
}

void json_append_uint(std::string& out, std::uint64_t value) {
    char digits[24];
    const auto result = std::to_chars(digits, digits + sizeof digits, value);
    out.append(digits, result.ptr);
}

void json_append_bool(std::string& out, bool value) { out += value ? "true" : "false"; }

}  // namespace kvcheck::process
