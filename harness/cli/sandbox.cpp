#include "sandbox.h"

#include "interrupt.h"
#include "proc_file.h"
#include "ram_dir.h"
#include "text.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVCHECK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVCHECK_ASAN 1
#endif
#endif

namespace kvcheck::cli {
namespace {

namespace fs = std::filesystem;

// ASan reserves terabytes of address space for its shadow memory: an
// address-space limit would fail its start-up. Under ASan the polls alone
// bound memory.
#ifdef KVCHECK_ASAN
constexpr bool address_space_limit_works = false;
#else
constexpr bool address_space_limit_works = true;
#endif

// Address space a child may take beyond its start: twice the memory limit
// and a GiB. Thread stacks, malloc arenas and allocators reserve address
// space they never touch, which the memory limit (on resident memory) does
// not count; the polls enforce that limit, and this bounds what a leak can
// reach between two polls, or while kvcheck is busy.
constexpr std::int64_t address_space_slack_bytes = std::int64_t{1} << 30;
constexpr std::int64_t address_space_per_memory_byte = 2;

// The parent's ends of every job's pipes: a child closes those of the
// other jobs, which are none of its business.
std::vector<int>& parent_fds() {
    static std::vector<int> fds;
    return fds;
}

void forget_fd(int fd) {
    auto& fds = parent_fds();
    fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
}

void close_fd(int& fd) {
    if (fd < 0) return;
    forget_fd(fd);
    ::close(fd);
    fd = -1;
}

void write_all(int fd, const std::string& bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) ::_exit(70);  // the parent is gone: nothing left to report to
        done += static_cast<std::size_t>(n);
    }
}

// A "kB" field of /proc/<pid>/status, in bytes; 0 when absent.
std::int64_t status_bytes(const std::string& pid, const char* field) {
    std::istringstream status(posix::read_proc_file("/proc/" + pid + "/status"));
    std::string line;
    const std::size_t length = std::strlen(field);
    while (std::getline(status, line)) {
        if (line.compare(0, length, field) == 0) return std::atoll(line.c_str() + length) * 1024;
    }
    return 0;
}

// The children of every thread of `pid`, from /proc (none when it is gone,
// or ends while it is read: no error, and no exception).
std::vector<int> children_of(int pid) {
    std::vector<int> children;
    const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
    std::error_code error;
    for (fs::directory_iterator task(tasks, error), end; !error && task != end; task.increment(error)) {
        std::istringstream listed(posix::read_proc_file((task->path() / "children").string()));
        for (int child = 0; listed >> child;) children.push_back(child);
    }
    return children;
}

// The resident memory of a child and of every process it started (an
// engine running out of process is part of the engine). Children are
// found through /proc/<pid>/task/<tid>/children; the depth is bounded so
// that a process tree that changes while it is read cannot loop.
std::int64_t tree_resident_bytes(int pid, int depth = 0) {
    std::int64_t total = status_bytes(std::to_string(pid), "VmRSS:");
    if (depth >= 8) return total;
    for (const int child : children_of(pid)) total += tree_resident_bytes(child, depth + 1);
    return total;
}

// Every process below `pid` (its children, theirs, ...), found as above;
// a process that escaped its parent (a double fork and setsid) is among
// them, because every sandbox child and kvcheck itself are subreapers
// (PR_SET_CHILD_SUBREAPER): an orphan below them is given to them, not to
// init.
void collect_descendants(int pid, std::vector<int>& found, int depth = 0) {
    if (depth >= 64) return;
    for (const int child : children_of(pid)) {
        found.push_back(child);
        collect_descendants(child, found, depth + 1);
    }
}

// The parent process of `pid` from /proc (0 when it is gone).
int parent_of(int pid) {
    const std::string text = posix::read_proc_file("/proc/" + std::to_string(pid) + "/stat");
    const std::size_t close = text.rfind(')');
    if (close == std::string::npos) return 0;
    char state = 0;
    int parent = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %d", &state, &parent) != 2) return 0;
    return parent;
}

// The exit status of a child that reported a fault (exit_with_fault).
constexpr int fault_exit_status = 4;

// A job's limits (its memory, its stillness) are checked at most this
// often, and at every poll that waited this long.
constexpr double limits_check_seconds = 0.05;

std::string mebibytes(std::int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The child's end of its channel, for the allocation-failure handler.
int child_channel_fd = -1;

// operator new failed (the address-space limit): say so, and end the
// process before anything else needs memory.
void on_allocation_failure() {
    static const char frame[] = "memory 0\n";
    if (::write(child_channel_fd, frame, sizeof frame - 1) < 0) {
        // Nothing more can be said: the exit status tells the parent.
    }
    ::_exit(memory_exit_status);
}

void limit_child(std::int64_t memory_bytes) {
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    if (!address_space_limit_works) return;
    rlimit limit{};
    ::getrlimit(RLIMIT_AS, &limit);
    const std::int64_t now = status_bytes("self", "VmSize:");
    auto wanted = static_cast<rlim_t>(now + address_space_per_memory_byte * memory_bytes + address_space_slack_bytes);
    if (limit.rlim_max != RLIM_INFINITY) wanted = std::min(wanted, limit.rlim_max);
    if (limit.rlim_cur != RLIM_INFINITY) wanted = std::min(wanted, limit.rlim_cur);
    limit.rlim_cur = wanted;
    ::setrlimit(RLIMIT_AS, &limit);
}

// In the child, right after fork: its own process group (the terminal's
// Ctrl-C is for kvcheck), death with its parent, default signal actions,
// none of the parent's other pipes.
void detach_child(pid_t parent) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // What the engine starts stays below this process, even a process that
    // leaves its parent and its session (end_descendants kills it).
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (::getppid() != parent) ::_exit(70);  // the parent died before the line above
    for (const int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) std::signal(signal, SIG_DFL);
    for (const int fd : parent_fds()) ::close(fd);
    parent_fds().clear();
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string job_dir_prefix() { return "kvcheck-job-" + std::to_string(::getpid()) + "-"; }

// Where job directories go (ram_dir.h): a job's dumps are written, fsynced,
// renamed and removed there, trace after trace.
fs::path job_dirs_base() {
    static const fs::path base = posix::ram_backed_temp_dir();
    return base;
}

// The directories kvcheck makes in $TMPDIR (and job_dirs_base) whose kvcheck was killed
// outright (kill -9, a second Ctrl-C) before it could remove them:
// kvcheck-job-<pid>-* (a job's) and kvcheck-adapter-<pid>-* (an adapter
// process's output files, process_engine.cpp) of pids that no longer run.
void remove_stale_job_dirs(const fs::path& in) {
    std::error_code error;
    for (fs::directory_iterator it(in, error), end; !error && it != end; it.increment(error)) {
        const std::string name = it->path().filename().string();
        std::size_t prefix = 0;
        for (const char* kind : {"kvcheck-job-", "kvcheck-adapter-"}) {
            if (name.rfind(kind, 0) == 0) prefix = std::strlen(kind);
        }
        if (prefix == 0) continue;
        const std::size_t dash = name.find('-', prefix);
        if (dash == std::string::npos || dash == prefix || dash - prefix > 9) continue;
        const std::string pid_text = name.substr(prefix, dash - prefix);
        if (pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
        const auto pid = static_cast<pid_t>(std::stol(pid_text));
        if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
        std::error_code ignored;
        fs::remove_all(it->path(), ignored);
    }
}

void remove_stale_job_dirs() {
    std::error_code error;
    const fs::path temporary = fs::temp_directory_path(error);
    if (!error) remove_stale_job_dirs(temporary);
    if (job_dirs_base() != temporary) remove_stale_job_dirs(job_dirs_base());
}

std::string make_job_dir() {
    std::string pattern = (job_dirs_base() / (job_dir_prefix() + "XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
        throw std::runtime_error("cannot create a directory for an engine process under " +
                                 job_dirs_base().string() + ": " + std::strerror(errno));
    }
    return pattern;
}

}  // namespace

void end_descendants() {
    for (int round = 0; round < 200; ++round) {
        std::vector<int> below;
        collect_descendants(::getpid(), below);
        for (const int pid : below) ::kill(pid, SIGKILL);
        bool any = false;
        for (;;) {
            const pid_t reaped = ::waitpid(-1, nullptr, WNOHANG);
            if (reaped > 0) {
                any = true;
                continue;
            }
            if (reaped < 0 && errno == EINTR) continue;
            if (reaped < 0) return;  // ECHILD: none left
            break;                   // some still dying
        }
        if (!any) ::usleep(5000);
    }
}

double monotonic_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Channel::send(const std::string& kind, const std::string& payload) {
    if (progress_ != nullptr && kind == "begin") {
        progress_->position.store(++traces_ << 32);
        progress_->ticks.fetch_add(1);
    }
    sink_(kind, payload);
}

void Channel::step(std::size_t index) {
    if (progress_ == nullptr) return;
    progress_->position.store((traces_ << 32) | std::min<std::uint64_t>(index, Progress::step_max));
    progress_->ticks.fetch_add(1);
}

std::uint64_t Channel::engine_phase(bool making) {
    if (progress_ == nullptr) return 0;
    const std::uint64_t before = progress_->position.load();
    progress_->position.store((traces_ << 32) | (making ? Progress::making_engine : Progress::destroying_engine));
    progress_->ticks.fetch_add(1);
    return before;
}

void Channel::restore(std::uint64_t position) {
    if (progress_ != nullptr) progress_->position.store(position);
}

void CapturedOutput::append(const char* data, std::size_t size) {
    bytes += size;
    tail.append(data, size);
    if (tail.size() > tail_bytes_max) tail.erase(0, tail.size() - tail_bytes_max);
}

Sandbox::Sandbox(Limits limits) : limits_(limits) {
    static const bool swept = (remove_stale_job_dirs(), true);
    (void)swept;
    // A child killed (or crashed) leaves what its engine started to
    // kvcheck rather than to init: finish() kills what it last saw of the
    // job's tree.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

Sandbox::~Sandbox() {
    for (const auto& job : jobs_) {
        if (!job->done) kill_with(*job, Fault{"stopped", "kvcheck stopped it"});
    }
}

std::shared_ptr<Job> Sandbox::start(const std::function<void(Channel&)>& body,
                                    std::function<void(const Message&)> on_message, std::optional<Limits> limits) {
    auto job = std::make_shared<Job>();
    job->limits = limits.value_or(limits_);
    int frames[2];
    int out[2];
    int err[2];
    if (::pipe2(frames, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
        throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    }
    void* page = ::mmap(nullptr, sizeof(Progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) throw std::runtime_error(std::string("mmap: ") + std::strerror(errno));
    job->progress = new (page) Progress();
    job->work_dir = make_job_dir();
    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
        detach_child(parent);
        ::close(frames[0]);
        ::close(out[0]);
        ::close(err[0]);
        ::dup2(out[1], STDOUT_FILENO);
        ::dup2(err[1], STDERR_FILENO);
        ::close(out[1]);
        ::close(err[1]);
        limit_child(job->limits.memory_bytes);
        const int fd = frames[1];
        child_channel_fd = fd;
        parent_fds().push_back(fd);  // a job this child starts in turn must not keep it
        std::set_new_handler(on_allocation_failure);
        // Frame: "<kind> <size>\n<payload>". Sizes make any payload safe.
        Channel channel([fd](const std::string& kind, const std::string& payload) {
            write_all(fd, kind + " " + std::to_string(payload.size()) + "\n" + payload);
        }, job->progress, job->work_dir);
        int status = 0;
        try {
            body(channel);
        } catch (const std::exception& error) {
            channel.send("error", error.what());
            status = 3;
        }
        channel.send("end", "");
        std::fflush(nullptr);
        end_descendants();
        ::_exit(status);  // no atexit handlers, no destructors of the parent's objects
    }
    ::setpgid(pid, pid);  // also here: the child may not have run its own call yet when we signal the group
    ::close(frames[1]);
    ::close(out[1]);
    ::close(err[1]);
    job->pid = pid;
    job->fd = frames[0];
    job->output_fds = {out[0], err[0]};
    for (const int fd : {frames[0], out[0], err[0]}) {
        set_nonblocking(fd);
        parent_fds().push_back(fd);
    }
    job->started = monotonic_seconds();
    job->stillness.restart(process::sample_processes({pid}, job->started));
    job->on_message = std::move(on_message);
    jobs_.push_back(job);
    return job;
}

std::size_t Sandbox::running() const {
    std::size_t count = 0;
    for (const auto& job : jobs_) count += job->done ? 0 : 1;
    return count;
}

void Sandbox::read_from(Job& job) {
    char chunk[65536];
    for (;;) {
        const ssize_t n = ::read(job.fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return;  // EAGAIN: all there is for now
        if (n == 0) {
            close_fd(job.fd);  // the child is ending; wait4 will tell how
            return;
        }
        job.heard = true;
        job.buffer.append(chunk, static_cast<std::size_t>(n));
        for (;;) {
            const std::size_t newline = job.buffer.find('\n');
            if (newline == std::string::npos) break;
            const std::string header = job.buffer.substr(0, newline);
            const std::size_t space = header.rfind(' ');
            const std::string size_text = space == std::string::npos ? "" : header.substr(space + 1);
            if (size_text.empty() || size_text.size() > 12 || size_text.find_first_not_of("0123456789") != std::string::npos) {
                job.buffer.clear();
                close_fd(job.fd);
                kill_with(job, Fault{"crash", "its messages to kvcheck were garbled (did the engine write to a file "
                                              "descriptor it does not own?)"});
                return;
            }
            const std::size_t size = std::stoul(size_text);
            if (job.buffer.size() < newline + 1 + size) break;
            Message message{header.substr(0, space), job.buffer.substr(newline + 1, size)};
            job.buffer.erase(0, newline + 1 + size);
            if (job.on_message) job.on_message(message);
            if (message.kind == "begin") {
                job.operations_begun += static_cast<std::size_t>(std::count(message.payload.begin(), message.payload.end(), '\n'));
                job.last_begin = std::move(message.payload);
                ++job.begins;
            } else if (message.kind == "end") {
                job.ended = true;
            } else if (message.kind == "adopt") {
                const long pid = std::strtol(message.payload.c_str(), nullptr, 10);
                if (pid > 0) job.adopted.push_back(static_cast<int>(pid));
            } else {
                job.messages.push_back(std::move(message));
            }
        }
    }
}

void Sandbox::read_output(Job& job, std::size_t stream) {
    char chunk[65536];
    for (;;) {
        const ssize_t n = ::read(job.output_fds[stream], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return;
        if (n == 0) {
            close_fd(job.output_fds[stream]);
            return;
        }
        job.output[stream].append(chunk, static_cast<std::size_t>(n));
    }
}

namespace {

// How a child that kvcheck did not kill ended, when it is a fault.
std::optional<Fault> ending_fault(const Job& job, int status, const struct rusage& usage) {
    const bool said_memory = std::any_of(job.messages.begin(), job.messages.end(),
                                         [](const Message& m) { return m.kind == "memory"; });
    if (WIFEXITED(status) && WEXITSTATUS(status) == fault_exit_status) {
        const auto reported = std::find_if(job.messages.rbegin(), job.messages.rend(),
                                           [](const Message& m) { return m.kind == "fault"; });
        if (reported != job.messages.rend()) {
            const std::size_t newline = reported->payload.find('\n');
            return Fault{reported->payload.substr(0, newline),
                         newline == std::string::npos ? "" : reported->payload.substr(newline + 1)};
        }
    }
    if (said_memory && WIFEXITED(status) && WEXITSTATUS(status) == memory_exit_status) {
        return Fault{"memory", "an allocation failed at the address-space limit that backs the memory limit of " +
                                   mebibytes(job.limits.memory_bytes)};
    }
    // The peak, not only what the polls saw: a child may cross the limit
    // and finish between two polls.
    const std::int64_t peak = static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
    if (peak > job.limits.memory_bytes) {
        return Fault{"memory", "peak resident memory " + mebibytes(peak) + " over the limit of " +
                                   mebibytes(job.limits.memory_bytes)};
    }
    if (WIFSIGNALED(status)) return Fault{"crash", signal_name(WTERMSIG(status))};
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3) {
        return Fault{"exit", "exit status " + std::to_string(WEXITSTATUS(status))};
    }
    if (!job.ended) return Fault{"exit", "exit status " + std::to_string(WEXITSTATUS(status)) + " before its work was done"};
    return std::nullopt;
}

}  // namespace

void Sandbox::finish(Job& job) {
    int status = 0;
    struct rusage usage {};
    while (::wait4(job.pid, &status, 0, &usage) < 0 && errno == EINTR) {
    }
    // What the child left behind (it crashed, or was killed) is kvcheck's
    // now: killed and reaped. Only kvcheck's own children are touched, so
    // a pid reused since the last poll is safe.
    for (const int pid : job.tree) {
        const bool a_job = std::any_of(jobs_.begin(), jobs_.end(), [pid](const auto& other) { return other->pid == pid; });
        if (a_job || parent_of(pid) != ::getpid()) continue;
        ::kill(pid, SIGKILL);
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
    }
    job.tree.clear();
    // Whatever the child wrote before it ended is in the pipes.
    if (job.fd >= 0) read_from(job);
    for (std::size_t stream = 0; stream < 2; ++stream) {
        if (job.output_fds[stream] >= 0) read_output(job, stream);
        close_fd(job.output_fds[stream]);
    }
    close_fd(job.fd);
    // The step is known only for the trace whose "begin" the parent read.
    const std::uint64_t position = job.progress->position.load();
    std::string phase;
    if (job.begins > 0 && Progress::trace_of(position) == job.begins) {
        const std::uint64_t step = Progress::step_of(position);
        if (step == Progress::making_engine) {
            phase = ", while the engine for the trace below was being made (before its first step)";
        } else if (step == Progress::destroying_engine) {
            phase = ", while the engine of the trace below was being destroyed (after its last step)";
        } else {
            job.last_step = step;
        }
    }
    ::munmap(job.progress, sizeof(Progress));
    job.progress = nullptr;
    std::error_code ignored;
    fs::remove_all(job.work_dir, ignored);
    job.done = true;
    // Killed by us, the fault already says why.
    if (!job.fault) job.fault = ending_fault(job, status, usage);
    if (job.fault && !phase.empty()) job.fault->detail += phase;
}

void Sandbox::kill_with(Job& job, Fault fault) {
    job.fault = std::move(fault);
    // The tree first (a process that left the group and the session is
    // still below the child, a subreaper), then the group and the child.
    std::vector<int> below;
    collect_descendants(job.pid, below);
    job.tree.insert(job.tree.end(), below.begin(), below.end());
    for (const int pid : below) ::kill(pid, SIGKILL);
    ::kill(-job.pid, SIGKILL);  // the group: whatever the engine started dies too
    ::kill(job.pid, SIGKILL);
    finish(job);
}

void Sandbox::check_limits(Job& job, double now) {
    // The tree as last seen: what finish() kills if the child dies and
    // leaves it to kvcheck.
    job.tree.clear();
    collect_descendants(job.pid, job.tree);
    // Its processes, and the adopted ones with theirs: how long the engine
    // has stood still since the last progress (stillness.h).
    std::vector<int> engine{job.pid};
    engine.insert(engine.end(), job.tree.begin(), job.tree.end());
    for (const int pid : job.adopted) {
        const std::vector<int> below = process::process_tree(pid);
        engine.insert(engine.end(), below.begin(), below.end());
    }
    const process::ActivitySample sample = process::sample_processes(engine, now);
    const std::uint64_t ticks = job.progress->ticks.load();
    if (ticks != job.ticks_seen || job.heard) {
        job.ticks_seen = ticks;
        job.heard = false;
        job.stillness.restart(sample);
    } else {
        job.stillness.observe(sample);
    }
    // Memory first: a leaking engine is slow too, and would read as hung.
    std::int64_t resident = tree_resident_bytes(job.pid);
    for (const int pid : job.adopted) resident += tree_resident_bytes(pid);
    if (resident > job.limits.memory_bytes) {
        kill_with(job, Fault{"memory", "resident memory " + mebibytes(resident) + " over the limit of " +
                                           mebibytes(job.limits.memory_bytes)});
        return;
    }
    if (job.stillness.hung(job.limits.silence_seconds)) {
        const bool stood_still = job.stillness.still_seconds() >= job.limits.silence_seconds;
        kill_with(job, Fault{"hang", stood_still ? "no progress for " + seconds_text(job.limits.silence_seconds) + " s"
                                                 : "no progress for " + seconds_text(job.stillness.silent_seconds()) +
                                                       " s of wall time, " + seconds_text(process::hang_wall_factor) +
                                                       " times the limit, though waiting on the machine"});
        return;
    }
    if (job.limits.total_seconds > 0 && now - job.started > job.limits.total_seconds) {
        kill_with(job, Fault{"time", "still running after " + seconds_text(job.limits.total_seconds) +
                                         " s, the limit for one job in all (--total-timeout)"});
    }
}

bool Sandbox::poll(double seconds) {
    jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(), [](const auto& job) { return job->done; }), jobs_.end());
    std::vector<pollfd> fds;
    std::vector<std::pair<Job*, int>> polled;  // the job, and -1 (messages) or the output stream
    for (const auto& job : jobs_) {
        if (job->fd >= 0) {
            fds.push_back({job->fd, POLLIN, 0});
            polled.emplace_back(job.get(), -1);
        }
        for (int stream = 0; stream < 2; ++stream) {
            if (job->output_fds[stream] < 0) continue;
            fds.push_back({job->output_fds[stream], POLLIN, 0});
            polled.emplace_back(job.get(), stream);
        }
    }
    if (jobs_.empty()) return false;
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(seconds * 1000));
    if (ready < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    for (std::size_t i = 0; i < fds.size() && ready > 0; ++i) {
        auto [job, stream] = polled[i];
        if (fds[i].revents == 0 || job->done) continue;
        if (stream < 0) {
            if (job->fd >= 0) read_from(*job);
        } else if (job->output_fds[stream] >= 0) {
            read_output(*job, static_cast<std::size_t>(stream));
        }
    }
    const double now = monotonic_seconds();
    for (const auto& job : jobs_) {
        if (job->done) continue;
        // Reaped here, not at the end of its pipe: a process the engine
        // started may hold the pipe open after the child is gone.
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(job->pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == job->pid) {
            finish(*job);
            continue;
        }
        // Not at every message (a search sends one per trace, hundreds a
        // second): the limits are read from /proc, which costs more than
        // the message.
        if (now - job->limits_checked < limits_check_seconds) continue;
        job->limits_checked = now;
        check_limits(*job, now);
    }
    return running() > 0;
}

void exit_with_fault(const std::string& kind, const std::string& detail) {
    if (child_channel_fd < 0) return;
    const std::string payload = kind + "\n" + detail;
    write_all(child_channel_fd, "fault " + std::to_string(payload.size()) + "\n" + payload);
    std::fflush(nullptr);
    ::_exit(fault_exit_status);
}

void report_adopted_process(int pid) {
    if (child_channel_fd < 0) return;
    const std::string payload = std::to_string(pid);
    write_all(child_channel_fd, "adopt " + std::to_string(payload.size()) + "\n" + payload);
}

void Sandbox::stop_all(const std::string& why) {
    for (const auto& job : jobs_) {
        if (!job->done) kill_with(*job, Fault{"stopped", why});
    }
}

std::shared_ptr<Job> Sandbox::run(const std::function<void(Channel&)>& body) {
    auto job = start(body);
    while (!job->done) {
        poll(0.1);
        if (interrupted_by() != 0 && !job->done) stop_all("interrupted by " + signal_name(interrupted_by()));
    }
    return job;
}

}  // namespace kvcheck::cli
