// What several checkers share: how messages name things, and storage
// sharing between a handle and its sources.
#include "checkers/checker.h"

#include <algorithm>

namespace kvcheck::checkers {

std::string in_quotes(const std::string& id) { return "\"" + id + "\""; }

std::string handle_text(std::int64_t handle) { return "h" + std::to_string(handle); }

std::string tokens_text(const std::vector<std::int64_t>& tokens) {
    std::string text = "[";
    for (std::size_t i = 0; i < tokens.size(); ++i) text += (i ? "," : "") + std::to_string(tokens[i]);
    return text + "]";
}

std::string id_list(const std::vector<std::string>& ids) {
    std::string text = "[";
    for (std::size_t i = 0; i < ids.size(); ++i) text += (i ? " " : "") + ids[i];
    return text + "]";
}

std::string metadata_text(const Metadata& metadata) {
    std::string text = "{";
    for (const auto& [key, value] : metadata) text += (text.size() > 1 ? ", " : "") + key + "=" + value;
    return text + "}";
}

std::string generation_text(const Generated& generation) {
    const char* what = generation.returned != 0 ? "turn" : generation.stream ? "generate_stream" : "generate";
    return std::string(what) + " from " +
           (generation.source == 0 ? std::string("no cache") : handle_text(generation.source));
}

std::string ids_difference(const std::vector<std::string>& listed, const std::vector<std::string>& expected, bool ordered) {
    if (listed == expected) return {};
    std::vector<std::string> listed_sorted = listed;
    std::vector<std::string> expected_sorted = expected;
    if (!ordered) {
        std::sort(listed_sorted.begin(), listed_sorted.end());
        std::sort(expected_sorted.begin(), expected_sorted.end());
    }
    if (listed_sorted == expected_sorted) return {};
    return "the store holds ids " + id_list(listed_sorted) + ", expected " + id_list(expected_sorted);
}

std::string kv_held(const CacheView& view) {
    for (std::size_t i = 0; i < view.layers.size(); ++i) {
        for (int s = 0; s < slot_count; ++s) {
            const SlotView& slot = view.layers[i].slots[static_cast<std::size_t>(s)];
            if (!slot.present || slot.shape.empty()) continue;
            std::int64_t elements = 1;
            std::string shape;
            for (const std::int64_t size : slot.shape) {
                elements *= size;
                shape += (shape.empty() ? "" : ", ") + std::to_string(size);
            }
            if (elements == 0) continue;
            return "layer " + std::to_string(i) + " " + slot_name(static_cast<Slot>(s)) + " holds [" + shape + "]";
        }
    }
    return {};
}

std::optional<std::int64_t> shared_source(Probe& probe, std::int64_t out, const std::vector<std::int64_t>& sources) {
    if (!probe.capabilities().storage_identity) return std::nullopt;
    std::vector<std::uint64_t> own = probe.handle(out).storage;
    std::sort(own.begin(), own.end());
    for (const std::int64_t source : sources) {
        for (const std::uint64_t identity : probe.handle(source).storage) {
            if (std::binary_search(own.begin(), own.end(), identity)) return source;
        }
    }
    return std::nullopt;
}

}  // namespace kvcheck::checkers
