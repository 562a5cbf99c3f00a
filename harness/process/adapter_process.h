// One adapter process: a command kvcheck starts and talks the adapter
// protocol with (docs/protocol.md) over two pipes of its own, never the
// process's stdout.
//
// What it owns: the process (started in its own process group, killed with
// SIGKILL when the process that started it dies, through
// PR_SET_PDEATHSIG, so nothing outlives a sandbox child), the two pipe ends
// kvcheck holds, and nothing else. The process's stdout and stderr go to
// an output file the caller names; its tail goes into every message about
// the process dying.
//
// A process belongs to the process that started it: a forked child that
// inherits the object must not talk to it (the pipes are shared with the
// parent); ~AdapterProcess there only closes the inherited descriptors.
//
//   AdapterProcess process({{"/usr/bin/python3", "my_adapter.py"}, "my_adapter.py"}, "/tmp/out");
//   Json reply = process.call(R"({"op":"stored_ids"})");   // {"ok": true, "ids": [...]}
#pragma once

#include "json.h"
#include "kvcheck/engine.h"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <sys/types.h>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kvcheck::process {

struct ProcessCommand {
    std::vector<std::string> argv;       // argv[0] is looked up on PATH
    std::string text;                    // the command as the user gave it, for messages
    std::vector<std::string> extra_env;  // "NAME=value", added to kvcheck's environment
};

// What the adapter said in the handshake.
struct Hello {
    int protocol = 0;
    std::string name;
    std::string description;
    Capabilities capabilities;
    bool copies_in_replies = false;  // each operation's reply carries its copies
    bool fork = false;               // serves fork requests (offered a fork socket: docs/protocol.md section 10)
    // Serves dump_fork requests (docs/protocol.md section 10a): its dumps
    // run in copies of it with the dump shim kvcheck preloaded armed, so
    // dump_kill applies (Capabilities::dump_kill). Else why not, for the
    // dump-safe row's note.
    bool dump_fork = false;
    std::string dump_fork_absent;
    // The process that serves the pipes, when it is not the one kvcheck
    // started (a zygote's copy, docs/protocol.md section 10b); 0: that one.
    // It is not below the started process: whoever samples the engine's
    // processes (their CPU for the hang rule, their memory) adds its tree.
    int pid = 0;
};

// Why a process cannot be used any more, as a sandbox fault: kind "crash"
// (killed by a signal), "exit" (exited), "protocol" (broke the protocol:
// garbage, a malformed reply), "start" (could not be started, or failed
// its handshake), "version" (speaks another protocol version).
struct ProcessFault {
    std::string kind;
    std::string detail;
};

class ProcessError : public std::runtime_error {
  public:
    explicit ProcessError(ProcessFault fault)
        : std::runtime_error(fault.detail), fault_(std::move(fault)) {}
    const ProcessFault& fault() const { return fault_; }

  private:
    ProcessFault fault_;
};

// Called with a fault before it is thrown as a ProcessError: a sandbox
// child ends itself here so that the fault is reported as one.
using FaultHandler = std::function<void(const ProcessFault&)>;

class AdapterProcess {
  public:
    // Starts the command and shakes hands, giving up once the process stood
    // still for `handshake_seconds` (stillness.h: time it waited for a CPU
    // does not count). Throws ProcessError ("start" or "version") with
    // the process's output tail.
    AdapterProcess(const ProcessCommand& command, const std::string& output_path, double handshake_seconds,
                   FaultHandler on_fault = nullptr);
    // The same, offering the process a fork socket: when its handshake says
    // "fork", other processes may start warm copies of it (below).
    struct OfferFork {};
    AdapterProcess(OfferFork, const ProcessCommand& command, const std::string& output_path, double handshake_seconds);
    // A warm start: asks `server` (a process that answered "fork", started
    // by this process or one it forked from) for a copy of itself talking
    // over new pipes of this process, then shakes hands with the copy. The
    // copy is the server's child: this process learns how it ended from
    // the server (its wait status on a pipe), and the server kills it when
    // this process ends first. `lock_path` serializes the requests of
    // several processes sharing the server. Throws ProcessError: "fork" when
    // the server could not make the copy (the caller may start the command
    // cold instead), else as the constructor above.
    struct ForkFrom {
        const AdapterProcess& server;
        std::string lock_path;
        // Runs with the copy's pid once it runs, before its handshake.
        std::function<void(int)> on_start = nullptr;
    };
    AdapterProcess(const ForkFrom& from, const std::string& output_path, double handshake_seconds,
                   FaultHandler on_fault = nullptr);
    ~AdapterProcess();
    AdapterProcess(const AdapterProcess&) = delete;
    AdapterProcess& operator=(const AdapterProcess&) = delete;

    // One request and its reply. A reply {"ok": false, ...} is returned as
    // it is; the process dying or breaking the protocol is a ProcessError
    // (after the fault handler ran).
    Json call(const std::string& request);
    // One request of several in flight at once, from any thread: for an
    // adapter whose handshake says thread_safe (docs/protocol.md section
    // 11a). The request goes out with a request id ("rid"); its reply is the
    // frame that carries the same id, whatever order the replies come in.
    // Whichever waiting thread reads the pipe keeps the others' replies for
    // them. A fault (the process dying, a reply that names no request in
    // flight) reaches every waiting caller as the same ProcessError.
    // Requests go out in batches: a caller sends every request queued when
    // it comes to wait, each but the last marked "wait" (section 11b).
    // Under the thread level the caller yields (kvcheck::yield "reply")
    // between queueing its request and sending the batch, so that other
    // clients add theirs, and it reads every reply in flight before it
    // returns.
    Json call_concurrent(const std::string& request);

    // Tells the process to exit and waits a moment for it (then kills it).
    void shut_down();

    const Hello& hello() const { return hello_; }
    bool alive() const { return request_fd_ >= 0; }
    pid_t pid() const { return pid_; }
    bool owned_here() const;  // started by this process (not inherited through fork)
    const std::string& output_path() const { return output_path_; }
    // This end of the fork socket offered at the start (-1: none).
    int fork_socket() const { return fork_socket_; }
    // The last `bytes_max` bytes the process wrote to stdout and stderr.
    std::string output_tail(std::size_t bytes_max = 4096) const;
    // Empties the output file (the next tail shows only what follows).
    void clear_output();
    // Empties the output file, but for a note of what was dropped, when it
    // holds more than kvcheck keeps (16 MiB); done after every reply and
    // twice a second while a reply is awaited.
    void limit_output();

  private:
    void start(const ProcessCommand& command, bool offer_fork);
    void start_forked(const ForkFrom& from);
    void handshake(double seconds);
    void read_dump_fork(const Json& reply);
    void send(const std::string& frame);
    // The next reply frame; `still_seconds` > 0: give up once the process
    // stood still that long (stillness.h).
    std::string receive(double still_seconds);
    Json parse_reply(const std::string& frame);
    // call_concurrent's reading, by one caller at a time without
    // requests_mutex_ held: the next reply, kept for the request it names.
    void read_one_reply();
    // Sends the requests queued (call_concurrent's batch), in order.
    void send_unsent();
    [[noreturn]] void fail(const std::string& kind, const std::string& detail);
    // After `pipe` ("reply" or "request") closed: how the process ended, as
    // a fault; a process still running is killed, and its fault says that
    // it closed the pipe, not that kvcheck killed it.
    [[noreturn]] void died(const std::string& when, const char* pipe);
    void reap(double grace_seconds);
    void reap_forked(double grace_seconds);

    std::string command_text_;
    std::string output_path_;
    FaultHandler on_fault_;
    pid_t pid_ = -1;
    pid_t owner_ = -1;
    int request_fd_ = -1;
    int reply_fd_ = -1;
    bool reaped_ = false;
    double handshake_seconds_ = 0;
    int wait_status_ = 0;
    bool killed_here_ = false;  // reap had to kill it (it had not ended by itself)
    // A warm copy: the wait status arrives on status_fd_ from the fork
    // server; life_fd_ is held open while the copy may live.
    bool forked_ = false;
    int status_fd_ = -1;
    int life_fd_ = -1;
    int fork_socket_ = -1;  // this end of a fork server's socket
    std::string buffer_;
    std::uint64_t output_dropped_ = 0;  // bytes of output limit_output dropped since clear_output
    Hello hello_;
    // call_concurrent: the requests in flight and the replies read for
    // them. send_mutex_ keeps two requests' frames apart on the pipe;
    // requests_mutex_ guards the rest.
    std::mutex send_mutex_;
    std::mutex requests_mutex_;
    std::condition_variable replied_;
    std::uint64_t request_id_last_ = 0;
    bool reading_ = false;  // a caller reads the reply pipe
    std::vector<std::string> unsent_;                  // queued, not yet sent (a batch)
    std::unordered_set<std::uint64_t> in_flight_;      // sent or queued, no reply read yet
    std::unordered_map<std::uint64_t, Json> replies_;  // read, not yet taken by their callers
    std::optional<ProcessFault> broken_;                // the fault that ended the process for every caller
};

// A protocol frame: the payload's length as 4 bytes, big-endian, then the payload.
std::string frame_of(const std::string& payload);

// The last `bytes_max` bytes of a file, from a line start, without trailing
// blank space; empty when it cannot be read.
std::string file_tail(const std::string& path, std::size_t bytes_max);


}  // namespace kvcheck::process
