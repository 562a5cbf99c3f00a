// The JSON the adapter protocol speaks (docs/protocol.md): a small value
// type, a strict parser and an appending writer, nothing more.
//
// Integers are kept exactly: the protocol's digests, hashes, seeds and
// storage identities are 64-bit unsigned and would lose bits as doubles. A
// number with a fraction or an exponent parses as a real and is an error
// wherever the protocol wants an integer.
//
//   Json reply = Json::parse(R"({"ok": true, "tokens": [3, 1]})");
//   std::int64_t first = reply.at("tokens").as_array()[0].as_int();
//   std::string out; json_append_string(out, "a\"b");   // "a\"b" quoted
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvcheck::process {

// A text that is not JSON, or a value of another type than asked for; the
// message says what and where ("at byte 12: expected ':'", "'tokens': expected
// an array, found a string").
class JsonError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

class Json {
  public:
    enum class Type : std::uint8_t { null, boolean, integer, real, string, array, object };
    using Member = std::pair<std::string, Json>;

    Json() = default;
    static Json parse(std::string_view text);  // throws JsonError

    Type type() const { return type_; }
    bool is_null() const { return type_ == Type::null; }
    const char* type_name() const;

    // Each throws JsonError naming the expected and the found type.
    bool as_bool() const;
    std::int64_t as_int() const;    // in [-2^63, 2^63)
    std::uint64_t as_uint() const;  // in [0, 2^64)
    double as_number() const;       // an integer or a real, as the nearest double
    const std::string& as_string() const;
    const std::vector<Json>& as_array() const;
    const std::vector<Member>& as_object() const;

    // An object's member, or nullptr when it has none of that name (or is
    // not an object).
    const Json* find(std::string_view key) const;
    // The member, or JsonError naming the key.
    const Json& at(std::string_view key) const;

  private:
    friend class JsonParser;
    Type type_ = Type::null;
    bool boolean_ = false;
    bool negative_ = false;
    std::uint64_t magnitude_ = 0;
    double real_ = 0;  // a real's value
    std::string string_;
    std::vector<Json> array_;
    std::vector<Member> object_;
};

// Appending writers: each appends one JSON value to `out`.
void json_append_string(std::string& out, std::string_view text);
void json_append_int(std::string& out, std::int64_t value);
void json_append_uint(std::string& out, std::uint64_t value);
void json_append_bool(std::string& out, bool value);

}  // namespace kvcheck::process
