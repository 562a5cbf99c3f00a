#include "kv/pickle_check.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace kv {
namespace {

// The globals a kvcheck dump names (torch's tensor rebuild and storages),
// with each storage's element size.
const std::map<std::string, std::uint64_t> storage_types{
    {"torch.FloatStorage", 4}, {"torch.HalfStorage", 2}, {"torch.BFloat16Storage", 2}};
const std::set<std::string> other_globals{"torch._utils._rebuild_tensor_v2", "collections.OrderedDict"};

// What the check knows of a stack item: short strings, integers, globals,
// and flat tuples of those (a persistent id is one); nothing else. Kept
// small on purpose, so no stream can make the check copy much.
struct Item {
    enum class Kind { other, text, integer, global, tuple } kind = Kind::other;
    std::string text;         // text (at most text_bytes_max), global "module.name"
    std::int64_t number = 0;  // integer
    std::vector<Item> elements;  // tuple: kept when flat and short
    std::size_t depth = 0;       // tuple: 1 + the depth of its deepest element
};
constexpr std::size_t text_bytes_max = 64;
constexpr std::size_t tuple_elements_max = 8;
// How deeply tuples may nest. torch frees a value by recursion, one stack
// frame per level: a few hundred thousand nested one-element tuples (a
// 200 KB stream) overflow the stack when the loader drops the rejected
// value. A dump nests six deep (dump, items, item, cache, layers, layer).
constexpr std::size_t tuple_depth_max = 32;

class Scan {
  public:
    Scan(const std::string& pickle, const std::map<std::string, std::uint64_t>& storage_bytes)
        : p_(pickle), storage_bytes_(storage_bytes) {}

    std::string run() {
        while (at_ < p_.size()) {
            const std::size_t start = at_;
            const auto op = static_cast<unsigned char>(p_[at_++]);
            if (!step(op)) return problem_ + " at byte " + std::to_string(start);
            if (op == '.') {
                if (at_ != p_.size()) return "bytes after STOP at byte " + std::to_string(at_);
                if (!marks_.empty() || stack_.size() != 1) return "STOP leaves " + std::to_string(stack_.size()) + " items";
                return {};
            }
        }
        return "no STOP";
    }

  private:
    bool fail(const std::string& what) {
        problem_ = what;
        return false;
    }
    bool need(std::size_t bytes) { return p_.size() - at_ >= bytes || fail("operand past the end"); }
    std::uint64_t little(std::size_t bytes) {
        std::uint64_t value = 0;
        for (std::size_t i = 0; i < bytes; ++i) value |= std::uint64_t{static_cast<unsigned char>(p_[at_ + i])} << (8 * i);
        at_ += bytes;
        return value;
    }
    std::size_t free_items() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }
    bool push(Item item) {
        stack_.push_back(std::move(item));
        return true;
    }
    bool integer(std::int64_t value) {
        Item item;
        item.kind = Item::Kind::integer;
        item.number = value;
        return push(std::move(item));
    }
    // Pops the top n items (above the last mark) into a tuple.
    bool tuple_of(std::size_t n) {
        if (free_items() < n) return fail("pops " + std::to_string(n) + " of " + std::to_string(free_items()) + " items");
        Item tuple;
        tuple.kind = Item::Kind::tuple;
        bool flat = n <= tuple_elements_max;
        std::size_t deepest = 0;
        for (std::size_t i = stack_.size() - n; i < stack_.size(); ++i) {
            flat = flat && stack_[i].kind != Item::Kind::tuple;
            deepest = std::max(deepest, stack_[i].depth);
        }
        tuple.depth = deepest + 1;
        if (tuple.depth > tuple_depth_max) {
            return fail("tuples nested more than " + std::to_string(tuple_depth_max) + " deep");
        }
        if (flat) tuple.elements.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        return push(std::move(tuple));
    }
    bool text_op(std::size_t length_bytes) {  // a length, then that many bytes
        if (!need(length_bytes)) return false;
        const std::uint64_t length = little(length_bytes);
        if (length > p_.size() - at_) return fail("a string longer than the stream");
        Item item;
        if (length <= text_bytes_max) {
            item.kind = Item::Kind::text;
            item.text = p_.substr(at_, length);
        }
        at_ += length;
        return push(std::move(item));
    }
    bool long1() {  // a length byte, then a little-endian two's complement integer
        if (!need(1)) return false;
        const std::size_t length = little(1);
        if (!need(length)) return false;
        if (length == 0 || length > 8) {
            at_ += length;
            return push(Item{});
        }
        std::uint64_t value = little(length);
        if (length < 8 && (value >> (8 * length - 1)) != 0) value |= ~std::uint64_t{0} << (8 * length);
        return integer(static_cast<std::int64_t>(value));
    }
    bool put(std::size_t index_bytes) {
        if (!need(index_bytes)) return false;
        if (free_items() == 0) return fail("memo put of an empty stack");
        // torch's unpickler sizes its memo table by the largest index.
        const std::uint64_t index = little(index_bytes);
        if (index > p_.size()) return fail("memo index " + std::to_string(index) + " past the stream's size");
        memo_[index] = stack_.back();
        return true;
    }
    bool get(std::size_t index_bytes) {
        if (!need(index_bytes)) return false;
        const auto found = memo_.find(little(index_bytes));
        if (found == memo_.end()) return fail("memo get of an unset index");
        return push(found->second);
    }
    bool line(std::string* text) {
        const std::size_t end = p_.find('\n', at_);
        if (end == std::string::npos) return fail("unterminated line");
        *text = p_.substr(at_, end - at_);
        at_ = end + 1;
        return true;
    }
    bool global() {
        std::string module, name;
        if (!line(&module) || !line(&name)) return false;
        Item item;
        item.kind = Item::Kind::global;
        item.text = module + "." + name;
        if (storage_types.count(item.text) == 0 && other_globals.count(item.text) == 0) {
            return fail("global " + item.text + " is not one a dump uses");
        }
        return push(std::move(item));
    }
    bool to_mark() {
        if (marks_.empty()) return fail("no mark");
        const std::size_t n = stack_.size() - marks_.back();
        marks_.pop_back();
        return tuple_of(n);
    }
    // BINPERSID: the id must be ('storage', <storage type>, key, location,
    // numel), and the record data/<key> must hold exactly numel elements:
    // torch makes a storage of the size the id claims over the record's
    // bytes, whatever their number.
    bool persistent_id() {
        if (free_items() < 1) return fail("a persistent id of an empty stack");
        const Item id = stack_.back();
        stack_.pop_back();
        const std::vector<Item>& e = id.elements;
        if (id.kind != Item::Kind::tuple || e.size() != 5 || e[0].kind != Item::Kind::text || e[0].text != "storage" ||
            e[1].kind != Item::Kind::global || storage_types.count(e[1].text) == 0 || e[2].kind != Item::Kind::text ||
            e[4].kind != Item::Kind::integer || e[4].number < 0) {
            return fail("a persistent id that is not ('storage', type, key, location, numel)");
        }
        const auto record = storage_bytes_.find(e[2].text);
        if (record == storage_bytes_.end()) return fail("storage '" + e[2].text + "' has no record");
        const std::uint64_t element = storage_types.at(e[1].text);
        const auto numel = static_cast<std::uint64_t>(e[4].number);
        if (numel > record->second / element || numel * element != record->second) {
            return fail("storage '" + e[2].text + "' claims " + std::to_string(numel) + " elements of " +
                        std::to_string(element) + " bytes; its record holds " + std::to_string(record->second) + " bytes");
        }
        return push(Item{});
    }
    bool reduce() {
        if (free_items() < 2) return fail("REDUCE pops 2 of " + std::to_string(free_items()) + " items");
        stack_.resize(stack_.size() - 2);
        return push(Item{});
    }

    bool step(unsigned char op) {
        switch (op) {
            case 0x80: return (at_ == 1 && need(1) && little(1) <= 2) || fail("PROTO not first, or above 2");
            case '.': return true;
            case '(': marks_.push_back(stack_.size()); return true;
            case 't': return to_mark();
            case ')': return tuple_of(0);
            case 'N': case 0x88: case 0x89: return push(Item{});
            case 0x85: return tuple_of(1);
            case 0x86: return tuple_of(2);
            case 0x87: return tuple_of(3);
            case 'K': return need(1) && integer(static_cast<std::int64_t>(little(1)));
            case 'M': return need(2) && integer(static_cast<std::int64_t>(little(2)));
            case 'J': return need(4) && integer(static_cast<std::int32_t>(little(4)));
            case 0x8a: return long1();
            case 'X': return text_op(4);
            case 0x8c: return text_op(1);
            case 'q': return put(1);
            case 'r': return put(4);
            case 'h': return get(1);
            case 'j': return get(4);
            case 'c': return global();
            case 'Q': return persistent_id();
            case 'R': return reduce();
            default: return fail("opcode " + std::to_string(op) + " is not one a dump uses");
        }
    }

    const std::string& p_;
    const std::map<std::string, std::uint64_t>& storage_bytes_;
    std::size_t at_ = 0;
    std::vector<Item> stack_;
    std::vector<std::size_t> marks_;  // the stack size at each mark
    std::map<std::uint64_t, Item> memo_;
    std::string problem_;
};

}  // namespace

std::string pickle_problem(const std::string& pickle, const std::map<std::string, std::uint64_t>& storage_bytes) {
    return Scan(pickle, storage_bytes).run();
}

}  // namespace kv
