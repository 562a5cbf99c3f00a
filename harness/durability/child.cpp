#include "durability/child.h"

#include "process/stillness.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kvcheck::durability {
namespace {

// OpenMP's worker threads do not survive a fork, and its next parallel
// region in the child waits for them for ever (libtorch's intra-op
// parallelism is OpenMP). The child runs OpenMP with one thread, when the
// process has it, without linking it.
void one_openmp_thread() {
    void* symbol = ::dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (symbol == nullptr) return;
    void (*set_threads)(int) = nullptr;
    std::memcpy(&set_threads, &symbol, sizeof symbol);
    set_threads(1);
}

double monotonic_seconds() {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) / 1e9;
}

// How often a silent child's processes are sampled: often enough for a
// short limit, at most every 250 ms.
int poll_ms(double seconds_max) {
    return static_cast<int>(std::clamp(seconds_max * 1000 / 10, 10.0, 250.0));
}

}  // namespace

void write_all(int fd, const std::string& bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) ::_exit(70);  // the parent is gone
        done += static_cast<std::size_t>(n);
    }
}


ChildEnd run_child(const std::function<void(int out)>& body, double seconds_max) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
        ::close(pipe_fds[0]);
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        one_openmp_thread();
        int status = 0;
        try {
            body(pipe_fds[1]);
        } catch (const std::exception& error) {
            Writer report;
            report.number(error_message);
            report.text(error.what());
            write_all(pipe_fds[1], report.bytes());
            status = 3;
        }
        ::_exit(status);
    }
    ::close(pipe_fds[1]);
    ChildEnd end;
    char chunk[65536];
    // Hung by the rule of every limit (process/stillness.h): still for
    // `seconds_max` with the CPU, not merely silent on a loaded machine.
    process::Stillness still;
    still.restart(process::sample_processes(process::process_tree(pid), monotonic_seconds()));
    for (;;) {
        pollfd ready{pipe_fds[0], POLLIN, 0};
        const int polled = ::poll(&ready, 1, poll_ms(seconds_max));
        if (polled < 0 && errno == EINTR) continue;
        if (polled == 0) {
            still.observe(process::sample_processes(process::process_tree(pid), monotonic_seconds()));
            if (!still.hung(seconds_max)) continue;
            end.hung = true;
            ::kill(pid, SIGKILL);
            break;
        }
        const ssize_t n = ::read(pipe_fds[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        end.output.append(chunk, static_cast<std::size_t>(n));
    }
    ::close(pipe_fds[0]);
    while (::waitpid(pid, &end.status, 0) < 0 && errno == EINTR) {
    }
    return end;
}

// The messages before the error are skipped.
std::string child_error(const std::string& output) {
    Reader messages(output);
    try {
        while (!messages.done()) {
            const std::uint64_t kind = messages.number();
            const std::string text = messages.text();
            if (kind == error_message) return text;
        }
    } catch (const std::runtime_error&) {
        // Cut short by the child's death: no error was reported whole.
    }
    return "(no message)";
}

}  // namespace kvcheck::durability
