#include "dump_format.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace vector_engine {
namespace {

constexpr char magic[8] = {'V', 'E', 'C', 'K', 'V', 'D', 'M', 'P'};
constexpr std::size_t header_bytes = sizeof magic + 4 + 8 + 8;

std::uint64_t fnv1a(const char* bytes, std::size_t count) {
    // A single changed byte always changes the result: each step is a
    // bijection of the running hash.
    std::uint64_t hash = 0xCBF29CE484222325ull;
    for (std::size_t i = 0; i < count; ++i) {
        hash ^= static_cast<unsigned char>(bytes[i]);
        hash *= 0x100000001B3ull;
    }
    return hash;
}

class Writer {
  public:
    void u8(std::uint8_t v) { bytes_.push_back(static_cast<char>(v)); }
    void u32(std::uint32_t v) {
        for (int i = 0; i < 4; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    }
    void u64(std::uint64_t v) {
        for (int i = 0; i < 8; ++i) u8(static_cast<std::uint8_t>(v >> (8 * i)));
    }
    void f32(float v) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &v, sizeof bits);
        u32(bits);
    }
    void str(const std::string& s) {
        u32(static_cast<std::uint32_t>(s.size()));
        bytes_.insert(bytes_.end(), s.begin(), s.end());
    }
    void tensor(const Tensor& t) {
        u8(t ? 1 : 0);
        if (!t) return;
        u8(static_cast<std::uint8_t>(t->dtype));
        u32(static_cast<std::uint32_t>(t->heads));
        u32(static_cast<std::uint32_t>(t->tokens));
        u32(static_cast<std::uint32_t>(t->head_dim));
        for (float v : t->values) f32(v);
    }
    std::vector<char>& bytes() { return bytes_; }

  private:
    std::vector<char> bytes_;
};

// Reads a payload; every fault throws DumpError naming the file and offset.
class Reader {
  public:
    Reader(const std::vector<char>& bytes, std::size_t at, std::string origin, const DumpLimits& limits)
        : bytes_(bytes), at_(at), origin_(std::move(origin)), limits_(limits) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw DumpError(origin_ + ": " + what + " at byte " + std::to_string(at_));
    }
    std::uint8_t u8() {
        if (at_ >= bytes_.size()) fail("unexpected end of file");
        return static_cast<std::uint8_t>(bytes_[at_++]);
    }
    std::uint32_t u32() {
        std::uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(u8()) << (8 * i);
        return v;
    }
    std::uint64_t u64() {
        std::uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(u8()) << (8 * i);
        return v;
    }
    float f32() {
        const std::uint32_t bits = u32();
        float v = 0;
        std::memcpy(&v, &bits, sizeof v);
        return v;
    }
    bool flag() {
        const std::uint8_t v = u8();
        if (v > 1) fail("a flag is " + std::to_string(v));
        return v == 1;
    }
    std::string str() {
        const std::uint32_t size = u32();
        if (size > limits_.string_bytes_max || size > bytes_.size() - at_) fail("a string of " + std::to_string(size) + " bytes");
        std::string s(bytes_.begin() + static_cast<std::ptrdiff_t>(at_), bytes_.begin() + static_cast<std::ptrdiff_t>(at_ + size));
        at_ += size;
        return s;
    }
    Tensor tensor() {
        if (!flag()) return nullptr;
        const std::uint8_t dtype = u8();
        if (dtype > 2) fail("unknown dtype " + std::to_string(dtype));
        const std::uint32_t heads = u32();
        const std::uint32_t tokens = u32();
        const std::uint32_t head_dim = u32();
        if (tokens > limits_.tokens_max) fail("a tensor of " + std::to_string(tokens) + " tokens");
        if (heads < 1 || heads > limits_.heads_max || head_dim < 1 || head_dim > limits_.heads_max) {
            fail("a tensor of " + std::to_string(heads) + " heads of " + std::to_string(head_dim));
        }
        const std::size_t count = std::size_t{heads} * tokens * head_dim;
        if (count * 4 > bytes_.size() - at_) fail("a tensor longer than the file");
        std::vector<float> values(count);
        for (float& v : values) {
            v = f32();
            if (!is_exact_in(static_cast<DType>(dtype), v)) fail("a value not representable in its dtype");
        }
        return make_tensor(static_cast<DType>(dtype), heads, tokens, head_dim, std::move(values));
    }
    CachePtr cache() {
        const std::uint8_t layout = u8();
        if (layout > 1) fail("unknown layout " + std::to_string(layout));
        const std::uint32_t layers = u32();
        if (layers > limits_.layers_max) fail("a cache of " + std::to_string(layers) + " layers");
        if (layout == 1) {
            auto key_list = std::make_shared<TensorList>();
            auto value_list = std::make_shared<TensorList>();
            for (std::uint32_t i = 0; i < layers; ++i) {
                key_list->push_back(tensor());
                value_list->push_back(tensor());
                if (!key_list->back() || !value_list->back()) fail("a legacy slot is absent");
            }
            return Cache::from_slots(std::move(key_list), std::move(value_list));
        }
        auto list = std::make_shared<LayerList>();
        for (std::uint32_t i = 0; i < layers; ++i) {
            auto layer = std::make_shared<Layer>();
            layer->initialized = flag();
            for (Tensor& slot : layer->slots) slot = tensor();
            list->push_back(std::move(layer));
        }
        return Cache::from_layers(std::move(list));
    }
    std::size_t at() const { return at_; }

  private:
    const std::vector<char>& bytes_;
    std::size_t at_;
    std::string origin_;
    const DumpLimits& limits_;
};

void encode_cache(Writer& out, const Cache& cache) {
    out.u8(cache.layout() == Layout::modern ? 0 : 1);
    out.u32(static_cast<std::uint32_t>(cache.layer_count()));
    if (cache.layout() == Layout::legacy) {
        for (std::size_t i = 0; i < cache.layer_count(); ++i) {
            out.tensor((*cache.key_cache())[i]);
            out.tensor((*cache.value_cache())[i]);
        }
        return;
    }
    for (const LayerPtr& layer : *cache.layers()) {
        out.u8(layer->initialized ? 1 : 0);
        for (const Tensor& slot : layer->slots) out.tensor(slot);
    }
}

std::string system_error(const std::string& what, const std::string& path) {
    return what + " " + path + ": " + std::strerror(errno);
}

}  // namespace

std::vector<char> encode_dump(const std::vector<Item>& items) {
    Writer payload;
    payload.u32(static_cast<std::uint32_t>(items.size()));
    for (const Item& item : items) {
        payload.str(item.id);
        payload.u32(static_cast<std::uint32_t>(item.metadata.size()));
        for (const auto& [key, value] : item.metadata) {
            payload.str(key);
            payload.str(value);
        }
        encode_cache(payload, *item.cache);
    }
    Writer file;
    for (char c : magic) file.u8(static_cast<std::uint8_t>(c));
    file.u32(dump_format_version);
    file.u64(payload.bytes().size());
    file.u64(fnv1a(payload.bytes().data(), payload.bytes().size()));
    std::vector<char> bytes = std::move(file.bytes());
    bytes.insert(bytes.end(), payload.bytes().begin(), payload.bytes().end());
    return bytes;
}

std::vector<Item> decode_dump(const std::vector<char>& bytes, const std::string& origin, const DumpLimits& limits) {
    if (bytes.size() < header_bytes) {
        throw DumpError(origin + ": truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the header");
    }
    if (std::memcmp(bytes.data(), magic, sizeof magic) != 0) throw DumpError(origin + ": not a vector-engine dump (bad magic)");
    Reader header(bytes, sizeof magic, origin, limits);
    const std::uint32_t version = header.u32();
    if (version != dump_format_version) {
        throw DumpError(origin + ": dump format version " + std::to_string(version) + ", this engine reads version " +
                        std::to_string(dump_format_version));
    }
    const std::uint64_t payload_bytes = header.u64();
    const std::uint64_t checksum = header.u64();
    if (payload_bytes != bytes.size() - header_bytes) {
        throw DumpError(origin + ": truncated or extended: the header announces " + std::to_string(payload_bytes) +
                        " payload bytes, the file holds " + std::to_string(bytes.size() - header_bytes));
    }
    if (fnv1a(bytes.data() + header_bytes, bytes.size() - header_bytes) != checksum) {
        throw DumpError(origin + ": corrupt: the payload checksum does not match");
    }
    Reader in(bytes, header_bytes, origin, limits);
    const std::uint32_t count = in.u32();
    if (count > limits.items_max) in.fail(std::to_string(count) + " items");
    std::vector<Item> items;
    std::set<std::string> seen;
    for (std::uint32_t i = 0; i < count; ++i) {
        Item item;
        item.id = in.str();
        if (!seen.insert(item.id).second) in.fail("the id '" + item.id + "' appears twice");
        const std::uint32_t entries = in.u32();
        if (entries > limits.items_max) in.fail(std::to_string(entries) + " metadata entries");
        for (std::uint32_t e = 0; e < entries; ++e) {
            std::string key = in.str();
            item.metadata[key] = in.str();
        }
        item.cache = in.cache();
        items.push_back(std::move(item));
    }
    if (in.at() != bytes.size()) in.fail("trailing bytes");
    return items;
}

// ---- Disk --------------------------------------------------------------------------

void Disk::write_file(const std::string& path, const std::vector<char>& bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw DumpError(system_error("cannot create", path));
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const std::string message = system_error("cannot write", path);
            ::close(fd);
            throw DumpError(message);
        }
        done += static_cast<std::size_t>(n);
    }
    // The bytes reach the disk before the rename makes them the dump.
    if (::fsync(fd) != 0 || ::close(fd) != 0) throw DumpError(system_error("cannot flush", path));
}

void Disk::rename(const std::string& from, const std::string& to) {
    if (std::rename(from.c_str(), to.c_str()) != 0) throw DumpError(system_error("cannot rename " + from + " to", to));
    // The rename itself reaches the disk: flush the directory that holds it.
    const std::string dir = std::filesystem::path(to).parent_path().string();
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw DumpError(system_error("cannot open directory", dir));
    const bool flushed = ::fsync(fd) == 0;
    ::close(fd);
    if (!flushed) throw DumpError(system_error("cannot flush directory", dir));
}

void Disk::make_dirs(const std::string& path) {
    std::error_code error;
    std::filesystem::create_directories(path, error);
    if (error) throw DumpError("cannot create " + path + ": " + error.message());
}

void Disk::remove(const std::string& path) { ::unlink(path.c_str()); }

std::vector<char> Disk::read_file(const std::string& path, std::int64_t bytes_max) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw DumpError(system_error("cannot open dump", path));
    struct stat status {};
    if (::fstat(fd, &status) != 0 || status.st_size > bytes_max) {
        ::close(fd);
        throw DumpError("cannot load dump " + path + ": missing or larger than " + std::to_string(bytes_max) + " bytes");
    }
    std::vector<char> bytes(static_cast<std::size_t>(status.st_size));
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    bytes.resize(done);
    return bytes;
}

void CrashingDisk::write_file(const std::string& path, const std::vector<char>& bytes) {
    if (budget_ < 0) throw PowerCut{};
    const auto size = static_cast<std::int64_t>(bytes.size());
    if (size <= budget_) {
        budget_ -= size;
        Disk::write_file(path, bytes);
        return;
    }
    Disk::write_file(path, std::vector<char>(bytes.begin(), bytes.begin() + budget_));
    budget_ = -1;
    throw PowerCut{};
}

void CrashingDisk::rename(const std::string& from, const std::string& to) {
    if (budget_ <= 0) {
        budget_ = -1;
        throw PowerCut{};
    }
    budget_ -= 1;  // a crash can land just before the rename
    Disk::rename(from, to);
}

}  // namespace vector_engine
