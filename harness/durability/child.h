// The forked children of a dump_kill step (docs/durability.md): one runs
// the dump, one loads the states it may leave. A child reports to its
// parent through a pipe in messages of a kind, then a size and the bytes;
// an exception that ends it is reported as an error message.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

namespace kvcheck::durability {

enum Message : std::uint64_t { loaded_message = 1, error_message = 2 };

class Writer {
  public:
    void number(std::uint64_t value) { bytes_.append(reinterpret_cast<const char*>(&value), sizeof value); }
    void text(const std::string& value) {
        number(value.size());
        bytes_ += value;
    }
    const std::string& bytes() const { return bytes_; }

  private:
    std::string bytes_;
};

class Reader {
  public:
    explicit Reader(const std::string& bytes) : bytes_(bytes) {}
    bool done() const { return at_ >= bytes_.size(); }
    std::uint64_t number() {
        std::uint64_t value = 0;
        need(sizeof value);
        std::memcpy(&value, bytes_.data() + at_, sizeof value);
        at_ += sizeof value;
        return value;
    }
    std::string text() {
        const std::uint64_t size = number();
        need(size);
        std::string value = bytes_.substr(at_, size);
        at_ += size;
        return value;
    }

  private:
    void need(std::uint64_t size) const {
        if (bytes_.size() - at_ < size) throw std::runtime_error("a child's report is cut short");
    }
    const std::string& bytes_;
    std::size_t at_ = 0;
};

// Writes every byte to `fd`, or ends the (child) process when the parent is gone.
void write_all(int fd, const std::string& bytes);

struct ChildEnd {
    int status = 0;
    std::string output;
    bool hung = false;
};

// Runs `body` in a forked child, which reports through `out`, and waits for
// it to end. The child dies with this process (PR_SET_PDEATHSIG), ends with
// _exit (no atexit handler, no destructor of the parent's objects), and is
// killed when silent and still for `seconds_max`: still by the rule of
// every limit (process/stillness.h): time the child waited for a CPU that
// other processes had does not count.
ChildEnd run_child(const std::function<void(int out)>& body, double seconds_max);

// The exception a child reported, if any, else "(no message)".
std::string child_error(const std::string& output);

}  // namespace kvcheck::durability
