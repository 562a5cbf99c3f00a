// Dump encoding and decoding. The file is a torch pickle archive (a zip of
// stored records), so Python's torch.load reads it. Loading never trusts
// the file: the records torch will read are decided as torch decides, and
// an ambiguous archive refused (kv/archive.h: which also checks every
// record against the file's real size, so a lying size cannot make torch
// allocate, and against its CRC); the pickle torch will unpickle is
// checked (kv/pickle_check.h); and the unpickled value is checked field by
// field before anything reaches the store.
#include "kv/store.h"

#include "kv/archive.h"
#include "kv/pickle_check.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/serialization/pickle.h>

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
    // The records torch will read (kv/archive.h); an archive whose reading
    // is ambiguous is refused here.
    const std::string_view file(bytes.data(), bytes.size());
    const DumpArchive archive = read_dump_archive(file);
    if (!archive.problem.empty()) reader.fail(archive.problem);
    std::map<std::string, std::uint64_t> storage_bytes;
    for (const auto& [key, record] : archive.storages) storage_bytes[key] = record.size;
    // torch's unpickler trusts its input (kv/pickle_check.h): nothing that
    // is not a well-formed dump pickle reaches it.
    const std::string pickle(file.substr(archive.pickle.offset, archive.pickle.size));
    const std::string problem = pickle_problem(pickle, storage_bytes);
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
