#include "pickle_precheck.h"

#include <cstdint>
#include <set>
#include <vector>

namespace kvcheck::fuzz {
namespace {

// The globals a kvcheck dump names (torch's tensor rebuild and storages).
const std::set<std::string> allowed_globals{
    "torch._utils\n_rebuild_tensor_v2", "torch\nFloatStorage", "torch\nHalfStorage", "torch\nBFloat16Storage",
    "collections\nOrderedDict"};

class Scan {
  public:
    explicit Scan(const std::string& pickle) : p_(pickle) {}

    std::string run() {
        while (at_ < p_.size()) {
            const std::size_t start = at_;
            const auto op = static_cast<unsigned char>(p_[at_++]);
            if (!step(op)) return problem_ + " at byte " + std::to_string(start);
            if (op == '.') {
                if (at_ != p_.size()) return "bytes after STOP at byte " + std::to_string(at_);
                if (marks_.size() != 0 || depth_ != 1) return "STOP leaves " + std::to_string(depth_) + " items";
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
    // Items above the last mark.
    std::size_t free_items() const { return depth_ - (marks_.empty() ? 0 : marks_.back()); }
    bool pop(std::size_t n) {
        if (free_items() < n) return fail("pops " + std::to_string(n) + " of " + std::to_string(free_items()) + " items");
        depth_ -= n;
        return true;
    }
    bool push() {
        ++depth_;
        return true;
    }
    bool bytes_op(std::size_t length_bytes) {  // a length, then that many bytes
        if (!need(length_bytes)) return false;
        const std::uint64_t length = little(length_bytes);
        if (length > p_.size() - at_) return fail("a string longer than the stream");
        at_ += length;
        return push();
    }
    bool put(std::size_t index_bytes) {
        if (!need(index_bytes)) return false;
        if (free_items() == 0) return fail("memo put of an empty stack");
        memo_.insert(little(index_bytes));
        return true;
    }
    bool get(std::size_t index_bytes) {
        if (!need(index_bytes)) return false;
        if (memo_.count(little(index_bytes)) == 0) return fail("memo get of an unset index");
        return push();
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
        if (allowed_globals.count(module + "\n" + name) == 0) return fail("global " + module + "." + name + " is not one a dump uses");
        return push();
    }
    bool to_mark() {
        if (marks_.empty()) return fail("no mark");
        depth_ = marks_.back();
        marks_.pop_back();
        return push();
    }

    bool step(unsigned char op) {
        switch (op) {
            case 0x80: return at_ == 1 && need(1) && little(1) <= 2 ? true : fail("PROTO not first, or above 2");
            case '.': return true;
            case '(': marks_.push_back(depth_); return true;
            case 't': return to_mark();
            case ')': case 'N': case 0x88: case 0x89: return push();
            case 0x85: return pop(1) && push();
            case 0x86: return pop(2) && push();
            case 0x87: return pop(3) && push();
            case 'K': return need(1) && (little(1), push());
            case 'M': return need(2) && (little(2), push());
            case 'J': return need(4) && (little(4), push());
            case 0x8a: return bytes_op(1);  // LONG1: a length byte, then the digits
            case 'X': return bytes_op(4);
            case 0x8c: return bytes_op(1);
            case 'q': return put(1);
            case 'r': return put(4);
            case 'h': return get(1);
            case 'j': return get(4);
            case 'c': return global();
            case 'Q': return pop(1) && push();  // BINPERSID
            case 'R': return pop(2) && push();  // REDUCE
            default: return fail("opcode " + std::to_string(op) + " is not one a dump uses");
        }
    }

    const std::string& p_;
    std::size_t at_ = 0;
    std::size_t depth_ = 0;
    std::vector<std::size_t> marks_;  // the stack depth at each mark
    std::set<std::uint64_t> memo_;
    std::string problem_;
};

}  // namespace

std::string pickle_problem(const std::string& pickle) { return Scan(pickle).run(); }

}  // namespace kvcheck::fuzz
