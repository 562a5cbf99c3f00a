// Running an engine in a child process, so that a crash, an abort, a leak or
// a hang in an adapter is reported instead of taking kvcheck down.
//
// The child talks to the parent through a pipe of framed messages. Before
// each trace it runs, it sends the trace (kind "begin"): when the child
// dies, the parent knows which trace killed it. The parent enforces the
// limits: no message for `silence_seconds` is a hang; a resident set over
// `memory_bytes` is a leak. Either gets the child killed.
//
//   Sandbox sandbox(limits);
//   auto job = sandbox.start([](Channel& out) { out.send("result", "ok"); });
//   while (sandbox.poll(0.1)) {}       // messages arrive in job->messages
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck::cli {

struct Limits {
    double silence_seconds = 30;              // one trace may take this long at most
    std::int64_t memory_bytes = std::int64_t{4} << 30;
};

struct Message {
    std::string kind;
    std::string payload;
};

// Where a job sends its messages: the pipe to the parent in a child, or a
// plain callback when a job runs in-process (--no-isolate).
class Channel {
  public:
    using Sink = std::function<void(const std::string& kind, const std::string& payload)>;
    explicit Channel(Sink sink) : sink_(std::move(sink)) {}
    void send(const std::string& kind, const std::string& payload) { sink_(kind, payload); }

  private:
    Sink sink_;
};

// Why a child did not end normally.
struct Fault {
    std::string kind;    // "crash", "hang", "memory", "exit", or one a child reported (exit_with_fault)
    std::string detail;  // "SIGSEGV", "no progress for 30 s", ...
};

struct Job {
    int pid = -1;
    int fd = -1;
    bool done = false;
    std::vector<Message> messages;
    std::optional<Fault> fault;  // set when the child ended abnormally
    std::string last_begin;      // payload of the last "begin" message
    double last_heard = 0;       // monotonic seconds
    std::string buffer;
    std::function<void(const Message&)> on_message;
};

class Sandbox {
  public:
    explicit Sandbox(Limits limits) : limits_(limits) {}
    ~Sandbox();
    Sandbox(const Sandbox&) = delete;
    Sandbox& operator=(const Sandbox&) = delete;

    // Forks a child that runs `body` and then exits 0. `on_message` sees
    // each message as it arrives (in the parent).
    std::shared_ptr<Job> start(const std::function<void(Channel&)>& body,
                               std::function<void(const Message&)> on_message = nullptr);
    // Waits up to `seconds` for messages and exits; enforces the limits.
    // Returns false when no job is running any more.
    bool poll(double seconds);
    std::size_t running() const;

    // Runs one body to its end and returns the finished job.
    std::shared_ptr<Job> run(const std::function<void(Channel&)>& body);

  private:
    void read_from(Job& job);
    void finish(Job& job);
    void kill_with(Job& job, Fault fault);

    Limits limits_;
    std::vector<std::shared_ptr<Job>> jobs_;
};

double monotonic_seconds();

// In a sandboxed child: reports a fault of `kind` with `detail` to the
// parent and ends the child, which the parent then reports as that fault
// (an engine running out of process whose process died, or broke its
// protocol, is a fault of the engine, like a crash of one loaded in
// process). Elsewhere (a run with --no-isolate) it returns, and the caller
// goes on to throw.
void exit_with_fault(const std::string& kind, const std::string& detail);

}  // namespace kvcheck::cli
