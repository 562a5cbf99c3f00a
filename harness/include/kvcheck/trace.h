// Operations and traces: one definition of every operation, used by the
// RapidCheck generators, the libFuzzer decoder, the corpus text format, the
// shrinker and the reports.
//
// Each operation is a plain aggregate; Boost.PFR walks its fields for
// printing, parsing and equality. Handles are named by the operation that
// creates them (`out`), so removing an operation never renumbers the rest:
// an operation naming a handle nobody created is skipped when run.
//
// Text form, one operation per line, '#' starts a comment:
//   add a modern/f32/3:[kv2 kv2]
//   h1 = get_cache a b
//   generate h1 prompt=5,7 max=3
#pragma once

#include "kvcheck/content.h"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace kvcheck {

// A handle named in a trace ("h3"); 0 is "no cache".
struct HandleName {
    std::int64_t value = 0;
    friend bool operator==(HandleName a, HandleName b) { return a.value == b.value; }
};

using Ids = std::vector<std::string>;
using Tokens = std::vector<std::int64_t>;
using HandleNames = std::vector<HandleName>;

namespace op {

// Field names: integer and token fields print as name=value, the others by
// position. A variable-length field (Ids, HandleNames) comes last.
struct Add {
    static constexpr const char* name = "add";
    static constexpr std::array<const char*, 2> fields{"id", "cache"};
    std::string id;
    CacheSpec cache;
};
struct AddHandle {
    static constexpr const char* name = "add_handle";
    static constexpr std::array<const char*, 2> fields{"id", "handle"};
    std::string id;
    HandleName handle;
};
struct Get {
    static constexpr const char* name = "get";
    static constexpr std::array<const char*, 2> fields{"out", "id"};
    HandleName out;
    std::string id;
};
struct GetByIds {
    static constexpr const char* name = "get_by_ids";
    static constexpr std::array<const char*, 1> fields{"ids"};
    Ids ids;
};
struct GetAll {
    static constexpr const char* name = "get_all";
    static constexpr std::array<const char*, 0> fields{};
};
struct GetCache {
    static constexpr const char* name = "get_cache";
    static constexpr std::array<const char*, 2> fields{"out", "ids"};
    HandleName out;
    Ids ids;
};
struct Generate {
    static constexpr const char* name = "generate";
    static constexpr std::array<const char*, 3> fields{"source", "prompt", "max"};
    HandleName source;
    Tokens prompt;
    std::int64_t max = 0;
};
struct GenerateStream {
    static constexpr const char* name = "generate_stream";
    static constexpr std::array<const char*, 3> fields{"source", "prompt", "max"};
    HandleName source;
    Tokens prompt;
    std::int64_t max = 0;
};
struct Delete {
    static constexpr const char* name = "delete";
    static constexpr std::array<const char*, 1> fields{"ids"};
    Ids ids;
};
struct DeleteAll {
    static constexpr const char* name = "delete_all";
    static constexpr std::array<const char*, 0> fields{};
};
struct Dump {
    static constexpr const char* name = "dump";
    static constexpr std::array<const char*, 1> fields{"slot"};
    std::int64_t slot = 0;
};
// A dump that crashes after `bytes` bytes are written.
struct DumpCrash {
    static constexpr const char* name = "dump_crash";
    static constexpr std::array<const char*, 2> fields{"slot", "bytes"};
    std::int64_t slot = 0;
    std::int64_t bytes = 0;
};
struct Load {
    static constexpr const char* name = "load";
    static constexpr std::array<const char*, 1> fields{"slot"};
    std::int64_t slot = 0;
};
// Flips one byte of the dump file in a slot (offset modulo its size), or
// truncates it to `offset` bytes when truncate=1.
struct Corrupt {
    static constexpr const char* name = "corrupt";
    static constexpr std::array<const char*, 3> fields{"slot", "offset", "truncate"};
    std::int64_t slot = 0;
    std::int64_t offset = 0;
    std::int64_t truncate = 0;
};
struct Make {
    static constexpr const char* name = "make";
    static constexpr std::array<const char*, 2> fields{"out", "cache"};
    HandleName out;
    CacheSpec cache;
};
struct Clone {
    static constexpr const char* name = "clone";
    static constexpr std::array<const char*, 2> fields{"out", "source"};
    HandleName out;
    HandleName source;
};
struct Concat {
    static constexpr const char* name = "concat";
    static constexpr std::array<const char*, 2> fields{"out", "parts"};
    HandleName out;
    HandleNames parts;
};
struct ToLegacy {
    static constexpr const char* name = "to_legacy";
    static constexpr std::array<const char*, 2> fields{"out", "source"};
    HandleName out;
    HandleName source;
};
struct FromLegacy {
    static constexpr const char* name = "from_legacy";
    static constexpr std::array<const char*, 2> fields{"out", "source"};
    HandleName out;
    HandleName source;
};

}  // namespace op

using Op = std::variant<op::Add, op::AddHandle, op::Get, op::GetByIds, op::GetAll, op::GetCache,
                        op::Generate, op::GenerateStream, op::Delete, op::DeleteAll, op::Dump,
                        op::DumpCrash, op::Load, op::Corrupt, op::Make, op::Clone, op::Concat,
                        op::ToLegacy, op::FromLegacy>;
using Trace = std::vector<Op>;

inline constexpr std::size_t op_kind_count = std::variant_size_v<Op>;

namespace detail {
template <typename T, typename... Alternatives>
constexpr std::size_t index_in(const std::variant<Alternatives...>*) {
    constexpr bool matches[] = {std::is_same_v<T, Alternatives>...};
    for (std::size_t i = 0; i < sizeof...(Alternatives); ++i) {
        if (matches[i]) return i;
    }
    return sizeof...(Alternatives);
}
}  // namespace detail

// The variant index of an operation type: op_kind<op::Add>() == 0.
template <typename T>
constexpr std::size_t op_kind() {
    constexpr std::size_t index = detail::index_in<T>(static_cast<const Op*>(nullptr));
    static_assert(index < op_kind_count, "not an operation type");
    return index;
}

const char* op_name(const Op& op);
const char* op_kind_name(std::size_t kind);  // by variant index

// The handle an operation creates (0 when it creates none).
std::int64_t created_handle(const Op& op);

bool operator==(const Op& a, const Op& b);
inline bool operator!=(const Op& a, const Op& b) { return !(a == b); }
// Op and Trace are std types whose alternatives live in kvcheck::op, so
// argument-dependent lookup searches kvcheck::op, never kvcheck; without these
// using-declarations `trace == trace` (and `op == op` outside namespace
// kvcheck) would pick std::variant's operators, which need an operator== on
// every op struct, and fail to compile.
namespace op {
using kvcheck::operator==;
using kvcheck::operator!=;
}  // namespace op

std::size_t hash_op(const Op& op);

// Throws std::invalid_argument for an operation the text cannot carry: an
// id outside [A-Za-z0-9_.-]+, a negative handle, an invalid cache spec.
std::string format_op(const Op& op);
std::string format_trace(const Trace& trace);  // one op per line, trailing newline

// Parse errors name the line and what is wrong.
class TraceParseError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

Op parse_op(const std::string& line);  // one line, without comment
Trace parse_trace(const std::string& text);

}  // namespace kvcheck
