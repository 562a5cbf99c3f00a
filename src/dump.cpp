// Dump encoding and decoding. The file is a torch pickle archive (a zip of
// stored records), so Python's torch.load reads it. Loading never trusts
// the file: the zip directory is checked against the file's real size
// before torch reads a record (a lying size cannot make it allocate), every
// record's CRC is verified by the reader, and the unpickled value is checked
// field by field before anything reaches the store.
#include "kv/store.h"

#include "kv/pickle_check.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <array>
#include <cstring>
#include <map>

namespace kv {
namespace {

constexpr const char* dump_magic = "kvcheck.store";

using c10::IValue;

IValue tuple(std::vector<IValue> elements) {
    return c10::ivalue::Tuple::create(std::move(elements));
}

IValue encode_tensor(const at::Tensor& t) {
    if (!t.defined()) return IValue();
    // Only the logical bytes go to disk, never a larger storage behind a view.
    if (!t.is_contiguous() || t.storage().nbytes() != t.nbytes() || t.storage_offset() != 0) {
        return IValue(t.clone(at::MemoryFormat::Contiguous));
    }
    return IValue(t);
}

IValue encode_tensors(const TensorList& list) {
    std::vector<IValue> elements;
    for (const at::Tensor& t : list) elements.push_back(encode_tensor(t));
    return tuple(std::move(elements));
}

IValue encode_cache(const Cache& cache) {
    if (cache.layout() == Layout::legacy) {
        return tuple({IValue(std::string("legacy")), encode_tensors(*cache.key_cache()),
                      encode_tensors(*cache.value_cache())});
    }
    std::vector<IValue> layers;
    for (const LayerPtr& layer : *cache.layers()) {
        layers.push_back(tuple({IValue(layer->is_initialized), encode_tensor(layer->keys),
                                encode_tensor(layer->values), encode_tensor(layer->key_cache),
                                encode_tensor(layer->value_cache)}));
    }
    return tuple({IValue(std::string("modern")), tuple(std::move(layers))});
}

IValue encode_metadata(const Metadata& metadata) {
    std::vector<IValue> pairs;
    for (const auto& [key, value] : metadata) pairs.push_back(tuple({IValue(key), IValue(value)}));
    return tuple(std::move(pairs));
}

// ---- decoding -------------------------------------------------------------

class Reader {
  public:
    Reader(std::string origin, const LoadLimits& limits) : origin_(std::move(origin)), limits_(limits) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw DumpError("corrupt dump " + origin_ + ": " + what);
    }

    std::vector<IValue> elements(const IValue& value, std::size_t count,
                                 const std::string& what) const {
        if (!value.isTuple()) fail(what + " is not a tuple");
        std::vector<IValue> elements = value.toTupleRef().elements().vec();
        if (count != any_count && elements.size() != count) {
            fail(what + " has " + std::to_string(elements.size()) + " fields, expected " +
                 std::to_string(count));
        }
        return elements;
    }

    std::string string(const IValue& value, const std::string& what) const {
        if (!value.isString()) fail(what + " is not a string");
        return value.toStringRef();
    }

    at::Tensor tensor(const IValue& value, const std::string& what) {
        if (value.isNone()) return {};
        if (!value.isTensor()) fail(what + " is neither a tensor nor None");
        at::Tensor t = value.toTensor();
        const auto dtype = t.scalar_type();
        if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) {
            fail(what + " has dtype " + std::string(c10::toString(dtype)) +
                 "; float32, float16 or bfloat16 expected");
        }
        if (!t.device().is_cpu()) fail(what + " is not a CPU tensor");
        if (t.dim() != 4 && t.numel() != 0) {
            fail(what + " has " + std::to_string(t.dim()) + " dimensions; 4 expected");
        }
        // A dump holds each tensor's logical bytes, contiguous, as its whole
        // storage (encode_tensor): anything else could reach past the storage.
        if (!t.is_contiguous() || t.storage_offset() != 0 || t.storage().nbytes() != t.nbytes()) {
            fail(what + " does not fill its storage exactly (offset, strides or sizes disagree with it)");
        }
        tensor_bytes_ += static_cast<std::int64_t>(t.nbytes());
        if (tensor_bytes_ > limits_.tensor_bytes_max) fail("tensors exceed the load limit");
        return t;
    }

    TensorList tensors(const IValue& value, const std::string& what) {
        const auto list = elements(value, any_count, what);
        check_layers(list.size(), what);
        TensorList result;
        for (std::size_t i = 0; i < list.size(); ++i) {
            at::Tensor t = tensor(list[i], what + "[" + std::to_string(i) + "]");
            if (!t.defined()) fail(what + "[" + std::to_string(i) + "] is None");
            result.push_back(std::move(t));
        }
        return result;
    }

    CachePtr cache(const IValue& value, const std::string& what) {
        const auto fields = elements(value, any_count, what);
        if (fields.empty()) fail(what + " is an empty tuple");
        const std::string layout = string(fields[0], what + " layout");
        if (layout == "legacy") {
            if (fields.size() != 3) fail(what + " (legacy) needs 3 fields");
            auto keys = std::make_shared<TensorList>(tensors(fields[1], what + " key_cache"));
            auto values = std::make_shared<TensorList>(tensors(fields[2], what + " value_cache"));
            if (keys->size() != values->size()) fail(what + " key_cache and value_cache differ in length");
            return Cache::from_slots(std::move(keys), std::move(values));
        }
        if (layout != "modern") fail(what + " has unknown layout '" + layout + "'");
        if (fields.size() != 2) fail(what + " (modern) needs 2 fields");
        const auto list = elements(fields[1], any_count, what + " layers");
        check_layers(list.size(), what);
        auto layers = std::make_shared<LayerList>();
        for (std::size_t i = 0; i < list.size(); ++i) {
            const std::string name = what + " layer " + std::to_string(i);
            const auto slots = elements(list[i], 5, name);
            if (!slots[0].isBool()) fail(name + " is_initialized is not a bool");
            auto layer = std::make_shared<Layer>();
            layer->is_initialized = slots[0].toBool();
            layer->keys = tensor(slots[1], name + " keys");
            layer->values = tensor(slots[2], name + " values");
            layer->key_cache = tensor(slots[3], name + " key_cache");
            layer->value_cache = tensor(slots[4], name + " value_cache");
            layers->push_back(std::move(layer));
        }
        return Cache::from_layers(std::move(layers));
    }

    Metadata metadata(const IValue& value, const std::string& what) const {
        Metadata result;
        for (const IValue& pair : elements(value, any_count, what)) {
            const auto kv = elements(pair, 2, what + " entry");
            result[string(kv[0], what + " key")] = string(kv[1], what + " value");
        }
        return result;
    }

    static constexpr std::size_t any_count = static_cast<std::size_t>(-1);

  private:
    void check_layers(std::size_t count, const std::string& what) const {
        if (static_cast<std::int64_t>(count) > limits_.layers_max) fail(what + " has too many layers");
    }

    std::string origin_;
    LoadLimits limits_;
    std::int64_t tensor_bytes_ = 0;
};

// ---- the zip directory, checked before torch reads it ---------------------

std::uint32_t read_u32(const std::vector<char>& bytes, std::size_t at) {
    std::uint32_t value = 0;
    for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
    return value;
}

std::uint16_t read_u16(const std::vector<char>& bytes, std::size_t at) {
    return static_cast<std::uint16_t>(static_cast<unsigned char>(bytes[at]) |
                                      (static_cast<unsigned char>(bytes[at + 1]) << 8));
}

std::uint32_t crc32(const char* data, std::size_t size) {
    static const auto table = [] {
        std::array<std::uint32_t, 256> t{};
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    std::uint32_t crc = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < size; ++i) {
        crc = table[(crc ^ static_cast<unsigned char>(data[i])) & 0xFF] ^ (crc >> 8);
    }
    return crc ^ 0xFFFFFFFFu;
}

// What the zip holds that the pickle check needs: the pickle stream and the
// size of each storage record, by key.
struct Archive {
    std::string pickle;
    std::map<std::string, std::uint64_t> storage_bytes;
};

bool ends_with(const std::string& text, const std::string& end) {
    return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

// Every record must be stored (not compressed), lie inside the file (no
// record can claim more bytes than the file has) and match its CRC-32:
// torch's reader checks none of this, and misreads damaged records.
Archive check_archive(const std::vector<char>& bytes, const Reader& reader) {
    Archive archive;
    bool have_pickle = false;
    constexpr std::size_t eocd_size = 22;
    constexpr std::size_t central_size = 46;
    constexpr std::size_t local_size = 30;
    if (bytes.size() < eocd_size) reader.fail("the file is truncated (" + std::to_string(bytes.size()) + " bytes)");
    const std::size_t eocd = bytes.size() - eocd_size;  // torch writes no archive comment
    if (read_u32(bytes, eocd) != 0x06054b50) reader.fail("no zip end record: truncated or not a dump");
    const std::size_t entries = read_u16(bytes, eocd + 10);
    const std::size_t directory_size = read_u32(bytes, eocd + 12);
    std::size_t at = read_u32(bytes, eocd + 16);
    if (at > eocd || directory_size > eocd - at) reader.fail("the zip directory lies outside the file");
    for (std::size_t i = 0; i < entries; ++i) {
        if (at + central_size > eocd || read_u32(bytes, at) != 0x02014b50) {
            reader.fail("zip directory entry " + std::to_string(i) + " is damaged");
        }
        const std::uint16_t flags = read_u16(bytes, at + 8);
        const std::uint16_t method = read_u16(bytes, at + 10);
        const std::uint32_t attributes = read_u32(bytes, at + 38);
        const std::uint32_t crc = read_u32(bytes, at + 16);
        const std::uint32_t packed = read_u32(bytes, at + 20);
        const std::uint32_t unpacked = read_u32(bytes, at + 24);
        const std::size_t name_size = read_u16(bytes, at + 28);
        const std::size_t extra_size = read_u16(bytes, at + 30);
        const std::size_t comment_size = read_u16(bytes, at + 32);
        const std::size_t local = read_u32(bytes, at + 42);
        const std::string record = "zip record " + std::to_string(i);
        if (method != 0 || packed != unpacked) reader.fail(record + " is compressed");
        // Encrypted or directory entries never occur in a dump; miniz would
        // hand them to torch as empty records.
        if ((flags & 0x1) != 0 || (attributes & 0x10) != 0) reader.fail(record + " has unexpected flags");
        if (local + local_size > eocd || unpacked > eocd - local - local_size) {
            reader.fail(record + " claims " + std::to_string(unpacked) + " bytes the file does not have");
        }
        if (read_u32(bytes, local) != 0x04034b50) reader.fail(record + " has a damaged header");
        const std::size_t data = local + local_size + read_u16(bytes, local + 26) + read_u16(bytes, local + 28);
        if (data > eocd || unpacked > eocd - data) {
            reader.fail(record + " claims " + std::to_string(unpacked) + " bytes the file does not have");
        }
        if (crc32(bytes.data() + data, unpacked) != crc) reader.fail(record + " fails its CRC-32 check");
        if (at + central_size + name_size > eocd) reader.fail(record + " has a name past the directory");
        const std::string name(bytes.data() + at + central_size, name_size);
        if (ends_with(name, "/data.pkl")) {
            if (have_pickle) reader.fail("two pickle records");
            archive.pickle.assign(bytes.data() + data, unpacked);
            have_pickle = true;
        }
        const std::size_t slash = name.rfind("/data/");
        if (slash != std::string::npos) archive.storage_bytes[name.substr(slash + 6)] = unpacked;
        at += central_size + name_size + extra_size + comment_size;
    }
    if (!have_pickle) reader.fail("no pickle record (data.pkl)");
    return archive;
}

}  // namespace

std::vector<char> encode_dump(const std::vector<ItemPtr>& items) {
    std::vector<IValue> encoded;
    for (const ItemPtr& item : items) {
        encoded.push_back(tuple({IValue(item->id), encode_metadata(item->metadata),
                                 encode_cache(*item->cache)}));
    }
    return torch::jit::pickle_save(tuple({IValue(std::string(dump_magic)),
                                          IValue(dump_format_version), tuple(std::move(encoded))}));
}

std::vector<Item> decode_dump(const std::vector<char>& bytes, const std::string& origin,
                              const LoadLimits& limits) {
    Reader reader(origin, limits);
    const Archive archive = check_archive(bytes, reader);
    // torch's unpickler trusts its input (kv/pickle_check.h): nothing that
    // is not a well-formed dump pickle reaches it.
    const std::string problem = pickle_problem(archive.pickle, archive.storage_bytes);
    if (!problem.empty()) reader.fail("malformed pickle: " + problem);
    IValue root;
    try {
        root = torch::jit::pickle_load(bytes);
    } catch (const std::exception& error) {
        // The first line of a c10::Error says what; the rest is a backtrace.
        std::string what = error.what();
        what = what.substr(0, what.find('\n'));
        reader.fail("unreadable archive: " + what);
    }
    const auto top = reader.elements(root, 3, "the top-level value");
    if (reader.string(top[0], "the magic") != dump_magic) reader.fail("not a kvcheck dump");
    if (!top[1].isInt()) reader.fail("the version is not an integer");
    if (top[1].toInt() != dump_format_version) {
        throw DumpError("dump " + origin + " has format version " + std::to_string(top[1].toInt()) +
                        "; this build reads version " + std::to_string(dump_format_version));
    }
    const auto entries = reader.elements(top[2], Reader::any_count, "the item list");
    if (static_cast<std::int64_t>(entries.size()) > limits.items_max) reader.fail("too many items");
    std::vector<Item> items;
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const std::string what = "item " + std::to_string(i);
        const auto fields = reader.elements(entries[i], 3, what);
        Item item;
        item.id = reader.string(fields[0], what + " id");
        item.metadata = reader.metadata(fields[1], what + " metadata");
        item.cache = reader.cache(fields[2], what + " ('" + item.id + "') cache");
        items.push_back(std::move(item));
    }
    return items;
}

}  // namespace kv
