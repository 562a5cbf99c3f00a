// Running an engine in a child process, so that a crash, an abort, a leak, a
// hang or an exit in an adapter is reported instead of taking kvcheck down,
// and whatever it prints stays out of kvcheck's reports.
//
// The child talks to the parent through a pipe of framed messages. Before
// each trace it runs, it sends the trace (kind "begin"); before each
// operation it marks its progress (Channel::step) in a page of memory the
// parent reads: when the child dies, the parent knows which trace and which
// step killed it. The parent enforces the limits (Limits): no progress for
// `silence_seconds` of the job's own time is a hang (stillness.h: time its
// processes ran or sat blocked counts, time they waited for a CPU the
// machine gave to others does not), a job running longer than `total_seconds` in
// all is out of time, a resident set over `memory_bytes` is a leak; each
// gets the child killed. The child also runs under a hard address-space
// limit (setrlimit; not in ASan builds, whose shadow memory needs terabytes
// of address space), so memory stays bounded even between two polls.
//
// Each child is a process group of its own (a Ctrl-C at the terminal reaches
// kvcheck, which stops its children and writes what it has), dies with its
// parent, is a subreaper (PR_SET_CHILD_SUBREAPER, as kvcheck is: a process
// the engine starts stays below it even after a double fork and setsid,
// counted against the memory limit and killed when the job ends), writes
// no core file, and gets a fresh directory of its own
// (Channel::work_dir) that the parent removes when the child ends, however
// it ends. Its standard output and error go to pipes: the parent keeps the
// last bytes of each (Job::output) for the report.
//
//   Sandbox sandbox(limits);
//   auto job = sandbox.start([](Channel& out) { out.send("result", "ok"); });
//   while (sandbox.poll(0.1)) {}       // messages arrive in job->messages
#pragma once

#include "stillness.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck::cli {

struct Limits {
    double silence_seconds = 30;   // one operation may stand still this long (stillness.h) without progress
    double total_seconds = 3600;   // one job may run this long in all; 0: no limit
    std::int64_t memory_bytes = std::int64_t{4} << 30;
};

struct Message {
    std::string kind;
    std::string payload;
};

// The page a child marks its progress in and the parent reads.
struct Progress {
    std::atomic<std::uint64_t> ticks{0};  // moves at every begin and step
    // The trace (the number of "begin" messages sent) in the high 32 bits,
    // the operation of it being run in the low 32: one word, so that a
    // child killed at any instant leaves a consistent pair.
    std::atomic<std::uint64_t> position{0};
    static std::uint64_t trace_of(std::uint64_t position) { return position >> 32; }
    static std::uint64_t step_of(std::uint64_t position) { return position & 0xffffffffu; }
    // In place of a step: the trace's engine is being made (before its
    // first step) or destroyed (after its last).
    static constexpr std::uint64_t making_engine = 0xfffffffeu;
    static constexpr std::uint64_t destroying_engine = 0xffffffffu;
    static constexpr std::uint64_t step_max = 0xfffffffdu;
};

// Where a job sends its messages: the pipe to the parent in a child, or a
// plain callback when a job runs in-process (--no-isolate).
class Channel {
  public:
    using Sink = std::function<void(const std::string& kind, const std::string& payload)>;
    explicit Channel(Sink sink, Progress* progress = nullptr, std::string work_dir = {})
        : sink_(std::move(sink)), progress_(progress), work_dir_(std::move(work_dir)) {}
    // A "begin" message also starts a new trace's step count.
    void send(const std::string& kind, const std::string& payload);
    // Called before operation `index` of the current trace runs.
    void step(std::size_t index);
    // Called before the current trace's engine is made (`making`) or
    // destroyed: a death there is not pinned on a step. Returns the
    // position to restore after (restore).
    std::uint64_t engine_phase(bool making);
    void restore(std::uint64_t position);
    // A directory of this job's own, removed by the parent when the job
    // ends; "" when the job runs in-process (the executor makes its own).
    const std::string& work_dir() const { return work_dir_; }

  private:
    Sink sink_;
    Progress* progress_;
    std::string work_dir_;
    std::uint64_t traces_ = 0;
};

// Why a child did not end normally.
struct Fault {
    std::string kind;    // "crash", "hang", "time", "memory", "exit", or one a child reported (exit_with_fault)
    std::string detail;  // "SIGSEGV", "no progress for 30 s", ...
};

// The last bytes a child wrote to one of its standard streams.
struct CapturedOutput {
    static constexpr std::size_t tail_bytes_max = 8192;
    std::string tail;
    std::uint64_t bytes = 0;  // all it wrote
    void append(const char* data, std::size_t size);
};

struct Job {
    int pid = -1;
    int fd = -1;                    // framed messages
    std::array<int, 2> output_fds{-1, -1};  // the child's stdout and stderr
    bool done = false;
    Limits limits;                  // may be changed while the job runs
    std::vector<Message> messages;  // all but "begin" (counted, and the last one kept)
    std::optional<Fault> fault;     // set when the child ended abnormally
    std::string last_begin;         // payload of the last "begin" message
    std::size_t begins = 0;
    std::size_t operations_begun = 0;  // in the traces of every "begin" (a line each)
    // The operation of the last trace that was running when the child
    // ended (from its progress page); nullopt when it had not begun one,
    // or when it ended while the trace's engine was made or destroyed
    // (the fault's detail says which).
    std::optional<std::size_t> last_step;
    double started = 0;             // monotonic seconds
    bool heard = false;             // a message arrived since the limits were last checked: progress
    double limits_checked = 0;      // monotonic seconds
    process::Stillness stillness;   // since the last progress
    std::array<CapturedOutput, 2> output;  // stdout, stderr
    std::string work_dir;
    std::string buffer;
    std::function<void(const Message&)> on_message;
    Progress* progress = nullptr;   // shared with the child until it ends
    std::uint64_t ticks_seen = 0;
    bool ended = false;             // the child said its work was done
    // Processes the child reported as part of its engine without being its
    // descendants (warm adapter copies, children of a fork server): their
    // memory counts with the child's.
    std::vector<int> adopted;
    // The processes below the child at the last poll (sandbox.cpp kills
    // those the child leaves to kvcheck when it ends).
    std::vector<int> tree;
};

class Sandbox {
  public:
    explicit Sandbox(Limits limits);
    ~Sandbox();
    Sandbox(const Sandbox&) = delete;
    Sandbox& operator=(const Sandbox&) = delete;

    // Forks a child that runs `body` and then exits 0. `on_message` sees
    // each message as it arrives (in the parent). `limits`: this job's, if
    // not the sandbox's.
    std::shared_ptr<Job> start(const std::function<void(Channel&)>& body,
                               std::function<void(const Message&)> on_message = nullptr,
                               std::optional<Limits> limits = std::nullopt);
    // Waits up to `seconds` for messages, enforces the limits, reaps the
    // children that ended. Returns early when a signal arrives (see
    // interrupt.h), and false when no job is running any more.
    bool poll(double seconds);
    std::size_t running() const;
    // Kills every running job (a Ctrl-C): each ends with a fault of kind
    // "stopped".
    void stop_all(const std::string& why);

    // Runs one body to its end and returns the finished job.
    std::shared_ptr<Job> run(const std::function<void(Channel&)>& body);

  private:
    void read_from(Job& job);
    void read_output(Job& job, std::size_t stream);
    void check_limits(Job& job, double now);
    void finish(Job& job);
    void kill_with(Job& job, Fault fault);

    Limits limits_;
    std::vector<std::shared_ptr<Job>> jobs_;
};

double monotonic_seconds();

// Kills and reaps every process below this one, escaped ones too (a
// double fork and setsid: this process is a subreaper, so they are its
// children by then). A sandbox child calls it at the end of its work, so
// that nothing an engine started outlives its job; kvcheck at its end, so
// that nothing an adapter started (for the handshake too) outlives it.
void end_descendants();

// In a sandboxed child: reports a fault of `kind` with `detail` to the
// parent and ends the child, which the parent then reports as that fault
// (an engine running out of process whose process died, or broke its
// protocol, is a fault of the engine, like a crash of one loaded in
// process). Elsewhere (a run with --no-isolate) it returns, and the caller
// goes on to throw.
void exit_with_fault(const std::string& kind, const std::string& detail);

// In a sandboxed child: tells the parent that process `pid`, which is not
// the child's descendant, is part of its engine (its resident memory counts
// against the child's limit). Elsewhere it does nothing.
void report_adopted_process(int pid);

// The exit status of a child whose allocation failed at its address-space
// limit (it says so in a "memory" message first).
inline constexpr int memory_exit_status = 86;

}  // namespace kvcheck::cli
