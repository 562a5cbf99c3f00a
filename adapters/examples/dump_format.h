// The vector engine's dump file: its own binary format, written to a
// temporary file and renamed over the previous dump, so that a crash at any
// point leaves the previous dump readable; read back only after its size
// and checksum match, so that a truncated or corrupt file is rejected as a
// whole and never half-applied.
//
// Layout (integers little-endian):
//   header  "VECKVDMP" | u32 version | u64 payload bytes | u64 FNV-1a-64 of the payload
//   payload u32 items, then per item: str id | u32 n | n x (str key, str value) | cache
//   cache   u8 layout (0 modern, 1 legacy) | u32 layers | per layer:
//           modern: u8 initialized | 4 tensors (keys, values, key_cache, value_cache)
//           legacy: 2 tensors (key_cache[i], value_cache[i])
//   tensor  u8 present | if present: u8 dtype (0 f32, 1 f16, 2 bf16) | u32 heads |
//           u32 tokens | u32 head_dim | heads*tokens*head_dim f32 values
//   str     u32 length | bytes
//
//   std::vector<char> bytes = encode_dump(items);
//   std::vector<Item> back = decode_dump(bytes, "dir/vector-engine.dump");  // throws DumpError
#pragma once

#include "cache.h"

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace vector_engine {

using Metadata = std::map<std::string, std::string>;

struct Item {
    std::string id;
    CachePtr cache;  // never null
    Metadata metadata;
};

// A dump that cannot be read: missing, truncated, corrupt, of another
// version or over a limit. The message names the file and the fault.
class DumpError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

inline constexpr const char* dump_file_name = "vector-engine.dump";
inline constexpr std::uint32_t dump_format_version = 2;

// Bounds a load never exceeds, whatever a file claims.
struct DumpLimits {
    std::int64_t file_bytes_max = std::int64_t{1} << 30;
    std::uint32_t items_max = 1u << 20;
    std::uint32_t layers_max = 1u << 12;  // per cache
    std::uint32_t tokens_max = 1u << 20;  // per tensor
    std::uint32_t heads_max = 1u << 10;   // per tensor, and as many head_dim
    std::uint32_t string_bytes_max = 1u << 16;
};

std::vector<char> encode_dump(const std::vector<Item>& items);
std::vector<Item> decode_dump(const std::vector<char>& bytes, const std::string& origin,
                              const DumpLimits& limits = DumpLimits{});

// Where dumps are written. The real disk, or one that "loses power" after a
// byte budget (dump_interrupted): it keeps the bytes that fit of the file
// being written, and every later write or rename throws PowerCut.
class Disk {
  public:
    virtual ~Disk() = default;
    virtual void write_file(const std::string& path, const std::vector<char>& bytes);  // created or truncated
    virtual void rename(const std::string& from, const std::string& to);
    void make_dirs(const std::string& path);
    void remove(const std::string& path);  // a missing file is fine; so is one that cannot be removed
    std::vector<char> read_file(const std::string& path, std::int64_t bytes_max);  // throws DumpError
};

class CrashingDisk final : public Disk {
  public:
    struct PowerCut {};
    explicit CrashingDisk(std::int64_t bytes_budget) : budget_(bytes_budget) {}
    void write_file(const std::string& path, const std::vector<char>& bytes) override;
    void rename(const std::string& from, const std::string& to) override;  // costs one unit of budget

  private:
    std::int64_t budget_;
};

}  // namespace vector_engine
