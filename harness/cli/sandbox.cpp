#include "sandbox.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <stdexcept>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kvcheck::cli {
namespace {

void write_all(int fd, const std::string& bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) ::_exit(70);  // the parent is gone: nothing left to report to
        done += static_cast<std::size_t>(n);
    }
}

// The exit status of a child that reported a fault (exit_with_fault).
constexpr int fault_exit_status = 4;
// The pipe to the parent, in a sandboxed child; -1 elsewhere.
int child_fd = -1;

std::string frame(const std::string& kind, const std::string& payload) {
    // Frame: "<kind> <size>\n<payload>". Sizes make any payload safe.
    return kind + " " + std::to_string(payload.size()) + "\n" + payload;
}

std::int64_t own_resident_bytes(int pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
    }
    return 0;
}

// The resident memory of a child and of every process it started (an
// engine running out of process is part of the engine). Children are
// found through /proc/<pid>/task/<tid>/children; the depth is bounded so
// that a process tree that changes while it is read cannot loop.
std::int64_t resident_bytes(int pid, int depth = 0) {
    std::int64_t total = own_resident_bytes(pid);
    if (depth >= 8) return total;
    std::error_code error;
    for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", error)) {
        std::ifstream children(task.path() / "children");
        int child = 0;
        while (children >> child) total += resident_bytes(child, depth + 1);
    }
    return total;
}

std::string signal_name(int signal) {
    switch (signal) {
        case SIGSEGV: return "SIGSEGV";
        case SIGABRT: return "SIGABRT";
        case SIGBUS: return "SIGBUS";
        case SIGFPE: return "SIGFPE";
        case SIGILL: return "SIGILL";
        case SIGKILL: return "SIGKILL";
        default: return "signal " + std::to_string(signal);
    }
}

}  // namespace

double monotonic_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Sandbox::~Sandbox() {
    for (const auto& job : jobs_) {
        if (job->done) continue;
        ::kill(job->pid, SIGKILL);
        ::waitpid(job->pid, nullptr, 0);
        ::close(job->fd);
    }
}

std::shared_ptr<Job> Sandbox::start(const std::function<void(Channel&)>& body,
                                    std::function<void(const Message&)> on_message) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
        ::close(fds[0]);
        const int fd = fds[1];
        child_fd = fd;
        Channel channel([fd](const std::string& kind, const std::string& payload) { write_all(fd, frame(kind, payload)); });
        int status = 0;
        try {
            body(channel);
        } catch (const std::exception& error) {
            channel.send("error", error.what());
            status = 3;
        }
        std::fflush(nullptr);
        ::_exit(status);  // no atexit handlers, no destructors of the parent's objects
    }
    ::close(fds[1]);
    auto job = std::make_shared<Job>();
    job->pid = pid;
    job->fd = fds[0];
    job->last_heard = monotonic_seconds();
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
    const ssize_t n = ::read(job.fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) return;
    if (n <= 0) {
        finish(job);
        return;
    }
    job.last_heard = monotonic_seconds();
    job.buffer.append(chunk, static_cast<std::size_t>(n));
    for (;;) {
        const std::size_t newline = job.buffer.find('\n');
        if (newline == std::string::npos) return;
        const std::string header = job.buffer.substr(0, newline);
        const std::size_t space = header.rfind(' ');
        const std::size_t size = std::stoul(header.substr(space + 1));
        if (job.buffer.size() < newline + 1 + size) return;
        Message message{header.substr(0, space), job.buffer.substr(newline + 1, size)};
        job.buffer.erase(0, newline + 1 + size);
        if (message.kind == "begin") job.last_begin = message.payload;
        if (job.on_message) job.on_message(message);
        job.messages.push_back(std::move(message));
    }
}

void Sandbox::finish(Job& job) {
    int status = 0;
    struct rusage usage {};
    ::wait4(job.pid, &status, 0, &usage);
    ::close(job.fd);
    job.done = true;
    if (job.fault) return;  // killed by us: the fault says why
    // The peak, not only what the polls saw: a child may cross the limit
    // and finish between two polls (or while the parent shrinks a fault).
    const std::int64_t peak = static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
    if (peak > limits_.memory_bytes) {
        job.fault = Fault{"memory", "peak resident memory " + std::to_string(peak >> 20) + " MiB over the limit of " +
                                        std::to_string(limits_.memory_bytes >> 20) + " MiB"};
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == fault_exit_status) {
        const auto reported = std::find_if(job.messages.rbegin(), job.messages.rend(),
                                           [](const Message& m) { return m.kind == "fault"; });
        if (reported != job.messages.rend()) {
            const std::size_t newline = reported->payload.find('\n');
            job.fault = Fault{reported->payload.substr(0, newline),
                              newline == std::string::npos ? "" : reported->payload.substr(newline + 1)};
            return;
        }
    }
    if (WIFSIGNALED(status)) {
        job.fault = Fault{"crash", signal_name(WTERMSIG(status))};
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3) {
        job.fault = Fault{"exit", "exit status " + std::to_string(WEXITSTATUS(status))};
    }
}

void Sandbox::kill_with(Job& job, Fault fault) {
    job.fault = std::move(fault);
    ::kill(job.pid, SIGKILL);
    finish(job);
}

bool Sandbox::poll(double seconds) {
    jobs_.erase(std::remove_if(jobs_.begin(), jobs_.end(), [](const auto& job) { return job->done; }), jobs_.end());
    std::vector<pollfd> fds;
    std::vector<Job*> polled;
    for (const auto& job : jobs_) {
        if (job->done) continue;
        fds.push_back({job->fd, POLLIN, 0});
        polled.push_back(job.get());
    }
    if (fds.empty()) return false;
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(seconds * 1000));
    if (ready < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    for (std::size_t i = 0; i < fds.size() && ready > 0; ++i) {
        if (fds[i].revents != 0) read_from(*polled[i]);
    }
    const double now = monotonic_seconds();
    for (Job* job : polled) {
        if (job->done) continue;
        // Memory first: a leaking engine is slow too, and would read as hung.
        const std::int64_t resident = resident_bytes(job->pid);
        if (resident > limits_.memory_bytes) {
            kill_with(*job, Fault{"memory", "resident memory " + std::to_string(resident >> 20) + " MiB over the limit of " +
                                                std::to_string(limits_.memory_bytes >> 20) + " MiB"});
            continue;
        }
        if (now - job->last_heard > limits_.silence_seconds) {
            kill_with(*job, Fault{"hang", "no progress for " + std::to_string(static_cast<int>(limits_.silence_seconds)) + " s"});
        }
    }
    return running() > 0;
}

void exit_with_fault(const std::string& kind, const std::string& detail) {
    if (child_fd < 0) return;
    write_all(child_fd, frame("fault", kind + "\n" + detail));
    std::fflush(nullptr);
    ::_exit(fault_exit_status);
}

std::shared_ptr<Job> Sandbox::run(const std::function<void(Channel&)>& body) {
    auto job = start(body);
    while (!job->done) poll(0.1);
    return job;
}

}  // namespace kvcheck::cli
