#include "paged_wire.h"

#include "wire.h"

#include <string>

namespace kvcheck::process {
namespace {

// Reads member `name` of `object` with `read`, naming it in an error.
template <typename Read>
auto within(const std::string& name, Read read) -> decltype(read()) {
    try {
        return read();
    } catch (const JsonError& error) {
        throw ProtocolError("'" + name + "': " + error.what());
    } catch (const ProtocolError& error) {
        throw ProtocolError("'" + name + "': " + error.what());
    }
}

}  // namespace

PagedKey read_paged_key(const Json& key) {
    PagedKey read;
    read.parent = read_uint(key, "parent");
    read.tokens = read_ints(key, "tokens");
    read.extra = read_string(key, "extra");
    return read;
}

PagedState read_paged_state(const Json& json) {
    PagedState state;
    state.block_tokens = read_int(json, "block_tokens");
    if (state.block_tokens < 1) throw ProtocolError("'block_tokens' is " + std::to_string(state.block_tokens) + ", not >= 1");
    // The model's attention window: absent (or 0) for full attention.
    if (const Json* window = json.find("window"); window != nullptr && !window->is_null()) {
        state.window = read_int(json, "window");
        if (state.window < 0) throw ProtocolError("'window' is " + std::to_string(state.window) + ", not >= 0");
    }
    const std::vector<Json>& blocks = member(json, "blocks").as_array();
    for (std::size_t b = 0; b < blocks.size(); ++b) {
        state.blocks.push_back(within("blocks[" + std::to_string(b) + "]", [&] {
            const Json& facts = blocks[b];
            PagedBlock block;
            block.count = read_int(facts, "count");
            if (const Json* key = facts.find("key"); key != nullptr && !key->is_null()) {
                block.keyed = true;
                block.key = within("key", [&] { return read_paged_key(*key); });
            }
            block.tokens = read_ints(facts, "tokens");
            block.written = read_int(facts, "written");
            const std::optional<std::uint64_t> digest = read_digest(facts);
            block.digest = digest ? *digest : 0;
            return block;
        }));
    }
    state.free_queue = read_ints(json, "free_queue");
    const std::vector<Json>& index = member(json, "index").as_array();
    for (std::size_t i = 0; i < index.size(); ++i) {
        state.index.push_back(within("index[" + std::to_string(i) + "]", [&] {
            PagedIndexEntry entry;
            entry.key = within("key", [&] { return read_paged_key(member(index[i], "key")); });
            entry.blocks = read_ints(index[i], "blocks");
            return entry;
        }));
    }
    const std::vector<Json>& tables = member(json, "tables").as_array();
    for (std::size_t i = 0; i < tables.size(); ++i) {
        within("tables[" + std::to_string(i) + "]", [&] {
            const std::int64_t seq = read_int(tables[i], "seq");
            if (state.tables.count(seq) != 0) throw ProtocolError("sequence " + std::to_string(seq) + " twice");
            state.tables[seq] = read_ints(tables[i], "blocks");
            state.tokens[seq] = read_ints(tables[i], "tokens");
            return 0;
        });
    }
    const std::vector<Json>& copies = member(json, "copies").as_array();
    for (std::size_t i = 0; i < copies.size(); ++i) {
        state.copies.push_back(within("copies[" + std::to_string(i) + "]", [&] {
            return PagedCopy{read_int(copies[i], "source"), read_int(copies[i], "destination")};
        }));
    }
    return state;
}

}  // namespace kvcheck::process
