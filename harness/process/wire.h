// The adapter protocol's messages (docs/protocol.md): the version, the frame
// limit, and how kvcheck's types are written into requests and read from
// replies. Reading throws ProtocolError naming the member at fault.
//
//   call(Request("make").field("out", out).field("cache", content));  // segments, not values
//   CacheView view = read_view(reply.at("view"));
#pragma once

#include "json.h"
#include "kvcheck/engine.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvcheck::process {

// The protocol version this kvcheck speaks. Bump it whenever a request or a
// reply changes in a way an adapter written for the old one would misread.
inline constexpr int protocol_version = 4;
// A frame longer than this is not a protocol message (a stray write on the
// reply pipe reads as an absurd length).
inline constexpr std::uint32_t frame_bytes_max = std::uint32_t{64} << 20;

// A reply that breaks the protocol: not JSON, a member missing or of the
// wrong type, an unknown name.
class ProtocolError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// ---- writing requests ------------------------------------------------------

// One request's JSON text, its members in the order given:
//   Request("get").field("id", id).field("out", out).text()
//     == R"({"op":"get","id":"a","out":3})"
class Request {
  public:
    explicit Request(std::string_view op);
    Request& field(std::string_view name, std::string_view text);
    Request& field(std::string_view name, const char* text) { return field(name, std::string_view(text)); }
    Request& field(std::string_view name, const std::string& text) { return field(name, std::string_view(text)); }
    Request& field(std::string_view name, std::int64_t value);
    Request& flag(std::string_view name, bool value);
    Request& field(std::string_view name, const std::vector<std::string>& items);
    Request& field(std::string_view name, const std::vector<std::int64_t>& items);
    Request& field(std::string_view name, const CacheContent& content);
    Request& field(std::string_view name, const Metadata& metadata);
    std::string text() const { return text_ + '}'; }

  private:
    std::string& member(std::string_view name);
    std::string text_;
};

void append_content(std::string& out, const CacheContent& content);
void append_strings(std::string& out, const std::vector<std::string>& items);
void append_ints(std::string& out, const std::vector<std::int64_t>& items);

// ---- reading replies -------------------------------------------------------

// Each reads one member of a reply object, or throws ProtocolError with the
// member's name.
const Json& member(const Json& object, const char* name);
bool read_bool(const Json& object, const char* name);
std::int64_t read_int(const Json& object, const char* name);
std::uint64_t read_uint(const Json& object, const char* name);
std::string read_string(const Json& object, const char* name);
std::vector<std::string> read_strings(const Json& object, const char* name);
std::vector<std::int64_t> read_ints(const Json& object, const char* name);
std::vector<std::uint64_t> read_uints(const Json& object, const char* name);

CacheView read_view(const Json& view);
// A fact object's digest: its "digest", or the digest of its "view" (an
// adapter may report either). nullopt when it has neither.
std::optional<std::uint64_t> read_digest(const Json& facts);
// Missing flags keep the defaults of kvcheck::Capabilities; an unknown flag
// is an error (a misspelt flag would otherwise be silently ignored).
Capabilities read_capabilities(const Json& flags);
// The handshake's "model" (docs/protocol.md): every key required; an
// unknown key, a missing one or a value of the wrong type is an error
// naming it. Declared; capabilities_fault judges the values.
ModelDomain read_model(const Json& object);
// The handshake's "store_policy" (docs/protocol.md section 3): capacity,
// eviction and listing order; every key optional. Throws ProtocolError
// naming an unknown key or value.
StorePolicy read_policy(const Json& object);
// An item's metadata: an object of strings.
Metadata read_metadata(const Json& object);
std::vector<CopyRecord> read_copies(const Json& copies);

// The first bytes of a frame as printable text, for a message about a
// reply that is not one.
std::string printable_prefix(const std::string& bytes, std::size_t count_max = 80);

}  // namespace kvcheck::process
