#include "adapter_process.h"

#include "durability/dump_kill.h"

#include "signal_name.h"
#include "stillness.h"
#include "wire.h"

#include "kvcheck/domain.h"
#include "kvcheck/yield.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <fstream>
#include <poll.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace kvcheck::process {

namespace {

// The descriptors the adapter finds its pipes on (docs/protocol.md).
constexpr int request_fd_in_child = 3;
constexpr int reply_fd_in_child = 4;
// Where the child reports a failed exec (close-on-exec: closed by a
// successful one).
constexpr int exec_status_fd_in_child = 5;
// Where a process offered a fork socket finds it (docs/protocol.md section 10).
constexpr int fork_fd_in_child = 6;

double now_seconds() {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

void ignore_sigpipe_once() {
    // A write to the pipe of a process that died must fail with EPIPE (and
    // be reported as its death), not kill kvcheck with SIGPIPE.
    static const bool done = [] {
        std::signal(SIGPIPE, SIG_IGN);
        return true;
    }();
    (void)done;
}

// The dump shim, preloaded into every adapter process (inert until a
// dump_fork copy arms it: docs/durability.md); empty when it cannot be.
const std::string& preloaded_shim(std::string& why_not) {
    static std::string why;
    static const std::string path = durability::shim_library_path(why);
    why_not = why;
    return path;
}

std::vector<std::string> child_environment(const ProcessCommand& command, bool offer_fork) {
    std::vector<std::string> names_set = {"KVCHECK_PROTOCOL", "KVCHECK_REQUEST_FD", "KVCHECK_REPLY_FD",
                                          "KVCHECK_FORK_FD", "PYTHONUNBUFFERED", "LD_PRELOAD", "ASAN_OPTIONS"};
    std::string preload;  // the user's, then the shim
    std::string asan_options;
    for (const std::string& extra : command.extra_env) names_set.push_back(extra.substr(0, extra.find('=')));
    std::vector<std::string> env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
        const std::string text = *entry;
        const std::string name = text.substr(0, text.find('='));
        if (name == "LD_PRELOAD") preload = text.substr(text.find('=') + 1);
        if (name == "ASAN_OPTIONS") asan_options = text.substr(text.find('=') + 1);
        if (std::find(names_set.begin(), names_set.end(), name) == names_set.end()) env.push_back(text);
    }
    std::string why_not;
    const std::string& shim = preloaded_shim(why_not);
    if (!shim.empty()) preload += (preload.empty() ? "" : ":") + shim;
    if (!preload.empty()) env.push_back("LD_PRELOAD=" + preload);
    // An adapter built with a dynamic ASan runtime (g++ -fsanitize=address)
    // refuses to start when a preloaded library comes before the runtime;
    // the shim only passes calls on, so that order is safe. The user's own
    // setting, after ours, still wins.
    if (!shim.empty()) asan_options = "verify_asan_link_order=0" + (asan_options.empty() ? "" : ":" + asan_options);
    if (!asan_options.empty()) env.push_back("ASAN_OPTIONS=" + asan_options);
    env.push_back("KVCHECK_PROTOCOL=" + std::to_string(protocol_version));
    env.push_back("KVCHECK_REQUEST_FD=" + std::to_string(request_fd_in_child));
    env.push_back("KVCHECK_REPLY_FD=" + std::to_string(reply_fd_in_child));
    if (offer_fork) env.push_back("KVCHECK_FORK_FD=" + std::to_string(fork_fd_in_child));
    // Whatever the engine prints reaches the output file before a crash.
    env.push_back("PYTHONUNBUFFERED=1");
    env.insert(env.end(), command.extra_env.begin(), command.extra_env.end());
    return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
    std::vector<char*> list;
    for (std::string& text : strings) list.push_back(text.data());
    list.push_back(nullptr);
    return list;
}

void close_quietly(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
}

// The child's side of the fork, up to exec: async-signal-safe calls only.
[[noreturn]] void become_adapter(pid_t parent, int request_read, int reply_write, int output, int null_input,
                                 int exec_status, int fork_socket, char* const* argv, char* const* envp) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(111);  // the parent died before prctl took effect
    ::setpgid(0, 0);
    // Copies above every target first, so that no dup2 below overwrites a
    // descriptor another one still needs.
    const int sources[] = {null_input, output, output, request_read, reply_write, exec_status, fork_socket};
    const int count = fork_socket >= 0 ? 7 : 6;
    int copies[7];
    for (int i = 0; i < count; ++i) {
        copies[i] = ::fcntl(sources[i], F_DUPFD_CLOEXEC, 16);
        if (copies[i] < 0) ::_exit(112);
    }
    for (int target = 0; target < count; ++target) {
        if (::dup2(copies[target], target) < 0) ::_exit(113);
    }
    ::fcntl(exec_status_fd_in_child, F_SETFD, FD_CLOEXEC);
    // Nothing else of kvcheck's (other jobs' pipes) leaks into the adapter.
    const unsigned first_closed = static_cast<unsigned>(count);
    if (::syscall(SYS_close_range, first_closed, ~0u, 0u) != 0) {
        for (int fd = count; fd < 65536; ++fd) ::close(fd);
    }
    ::signal(SIGPIPE, SIG_DFL);
    ::execvpe(argv[0], argv, envp);
    const int error = errno;
    ssize_t ignored = ::write(exec_status_fd_in_child, &error, sizeof error);
    (void)ignored;
    ::_exit(127);
}

// Sends `payload` as one message with `fds` attached (SCM_RIGHTS).
bool send_with_fds(int socket, const std::string& payload, const std::vector<int>& fds) {
    iovec data{const_cast<char*>(payload.data()), payload.size()};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
    ssize_t n = 0;
    do {
        n = ::sendmsg(socket, &message, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n == static_cast<ssize_t>(payload.size());
}

// An exclusive lock on a file, held while the object lives (released by
// the kernel too when its holder dies).
class FileLock {
  public:
    explicit FileLock(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
        if (fd_ >= 0) {
            while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {}
        }
    }
    ~FileLock() {
        if (fd_ >= 0) ::close(fd_);
    }
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;

  private:
    int fd_;
};

// How much of an adapter's standard output and error its output file may
// hold: only its tail is ever shown, and an engine that writes without end
// must not fill the disk. Over it, the file is emptied but for a note.
constexpr std::int64_t output_bytes_max = std::int64_t{16} << 20;
// While kvcheck waits for a reply, it looks at the output file this often.
constexpr int output_check_ms = 500;
// While it waits for the handshake, it samples the process (stillness.h)
// this often.
constexpr int still_sample_ms = 100;

// How long a fork server may take to answer a fork request: it forks and
// answers, nothing more, but the machine may be loaded.
constexpr double fork_answer_seconds = 30;

}  // namespace

std::string frame_of(const std::string& payload) {
    std::string frame(4, '\0');
    const auto size = static_cast<std::uint32_t>(payload.size());
    for (std::size_t i = 0; i < 4; ++i) frame[i] = static_cast<char>((size >> (24 - 8 * i)) & 0xFF);
    return frame + payload;
}


AdapterProcess::AdapterProcess(const ProcessCommand& command, const std::string& output_path, double handshake_seconds,
                               FaultHandler on_fault)
    : command_text_(command.text), output_path_(output_path), on_fault_(std::move(on_fault)) {
    start(command, false);
    handshake(handshake_seconds);
}

AdapterProcess::AdapterProcess(OfferFork, const ProcessCommand& command, const std::string& output_path,
                               double handshake_seconds)
    : command_text_(command.text), output_path_(output_path) {
    start(command, true);
    handshake(handshake_seconds);
    if (!hello_.fork) close_quietly(fork_socket_);
}

AdapterProcess::AdapterProcess(const ForkFrom& from, const std::string& output_path, double handshake_seconds,
                               FaultHandler on_fault)
    : command_text_(from.server.command_text_), output_path_(output_path), on_fault_(std::move(on_fault)) {
    start_forked(from);
    if (from.on_start) from.on_start(pid_);
    handshake(handshake_seconds);
}

AdapterProcess::~AdapterProcess() {
    if (owned_here()) {
        shut_down();
    } else {
        close_quietly(request_fd_);
        close_quietly(reply_fd_);
        close_quietly(status_fd_);
        close_quietly(life_fd_);
    }
    close_quietly(fork_socket_);
}

bool AdapterProcess::owned_here() const { return owner_ == ::getpid(); }

void AdapterProcess::start(const ProcessCommand& command, bool offer_fork) {
    if (command.argv.empty() || command.argv.front().empty()) {
        throw ProcessError({"start", "the adapter command is empty"});
    }
    ignore_sigpipe_once();
    int request[2], reply[2], status[2];
    if (::pipe2(request, O_CLOEXEC) != 0 || ::pipe2(reply, O_CLOEXEC) != 0 || ::pipe2(status, O_CLOEXEC) != 0) {
        throw ProcessError({"start", std::string("cannot make the adapter's pipes: ") + std::strerror(errno)});
    }
    const int output = ::open(output_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const int null_input = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (output < 0 || null_input < 0) {
        throw ProcessError({"start", "cannot open the adapter's output file " + output_path_ + ": " + std::strerror(errno)});
    }
    int fork_pair[2] = {-1, -1};
    if (offer_fork && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fork_pair) != 0) {
        throw ProcessError({"start", std::string("cannot make the adapter's fork socket: ") + std::strerror(errno)});
    }
    std::vector<std::string> argv_strings = command.argv;
    std::vector<std::string> env_strings = child_environment(command, offer_fork);
    std::vector<char*> argv = pointers(argv_strings);
    std::vector<char*> envp = pointers(env_strings);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw ProcessError({"start", std::string("fork: ") + std::strerror(errno)});
    if (pid == 0) {
        become_adapter(parent, request[0], reply[1], output, null_input, status[1], fork_pair[1], argv.data(), envp.data());
    }
    pid_ = pid;
    owner_ = parent;
    if (offer_fork) {
        ::close(fork_pair[1]);
        fork_socket_ = fork_pair[0];
    }
    ::close(request[0]);
    ::close(reply[1]);
    ::close(status[1]);
    ::close(output);
    ::close(null_input);
    request_fd_ = request[1];
    reply_fd_ = reply[0];
    int exec_error = 0;
    ssize_t n = 0;
    do {
        n = ::read(status[0], &exec_error, sizeof exec_error);
    } while (n < 0 && errno == EINTR);
    ::close(status[0]);
    if (n == static_cast<ssize_t>(sizeof exec_error)) {
        reap(5);
        throw ProcessError({"start", "cannot run the adapter command '" + command_text_ + "': " + command.argv.front() +
                                         ": " + std::strerror(exec_error)});
    }
}

void AdapterProcess::start_forked(const ForkFrom& from) {
    const int socket = from.server.fork_socket_;
    if (socket < 0 || !from.server.hello_.fork) throw ProcessError({"fork", "the adapter serves no fork requests"});
    ignore_sigpipe_once();
    int request[2] = {-1, -1}, reply[2] = {-1, -1}, status[2] = {-1, -1}, life[2] = {-1, -1};
    const auto close_all = [&] {
        for (int* pair : {request, reply, status, life}) {
            close_quietly(pair[0]);
            close_quietly(pair[1]);
        }
    };
    if (::pipe2(request, O_CLOEXEC) != 0 || ::pipe2(reply, O_CLOEXEC) != 0 || ::pipe2(status, O_CLOEXEC) != 0 ||
        ::pipe2(life, O_CLOEXEC) != 0) {
        const int error = errno;
        close_all();
        throw ProcessError({"start", std::string("cannot make the adapter's pipes: ") + std::strerror(error)});
    }
    int output = ::open(output_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (output < 0) {
        const int error = errno;
        close_all();
        throw ProcessError({"start", "cannot open the adapter's output file " + output_path_ + ": " + std::strerror(error)});
    }
    // The copy lives under this process's address-space limit (the sandbox's
    // memory limit), as a command started here would.
    rlimit limit{};
    ::getrlimit(RLIMIT_AS, &limit);
    static std::int64_t requests_sent = 0;
    const std::string id = std::to_string(::getpid()) + "." + std::to_string(++requests_sent);
    Request fork_request("fork");
    fork_request.field("id", id);
    if (limit.rlim_cur != RLIM_INFINITY) fork_request.field("address_space_bytes", static_cast<std::int64_t>(limit.rlim_cur));
    std::string problem;
    Json answer;
    {
        const FileLock lock(from.lock_path);
        if (!send_with_fds(socket, fork_request.text(), {request[0], reply[1], output, status[1], life[0]})) {
            problem = std::string("cannot send the fork request: ") + std::strerror(errno);
        }
        // The answer carries the request's id: one meant for a process that
        // died waiting for it is passed over.
        const double deadline = now_seconds() + fork_answer_seconds;
        while (problem.empty()) {
            const double left = deadline - now_seconds();
            pollfd ready{socket, POLLIN, 0};
            const int polled = left > 0 ? ::poll(&ready, 1, static_cast<int>(left * 1000) + 1) : 0;
            if (polled < 0 && errno == EINTR) continue;
            if (polled <= 0) {
                problem = "no answer to the fork request";
                break;
            }
            char text[4096];
            const ssize_t n = ::recv(socket, text, sizeof text, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                problem = "the fork server closed its socket";
                break;
            }
            try {
                answer = Json::parse(std::string(text, static_cast<std::size_t>(n)));
                const Json* answered = answer.find("id");
                if (answered != nullptr && answered->type() == Json::Type::string && answered->as_string() == id) break;
            } catch (const std::exception& error) {
                problem = "the fork server's answer is not JSON: " + std::string(error.what());
            }
        }
    }
    for (int* end : {&request[0], &reply[1], &status[1], &life[0], &output}) close_quietly(*end);
    std::int64_t pid = 0;
    if (problem.empty()) {
        try {
            if (!read_bool(answer, "ok")) {
                problem = "the fork server refused: " + read_string(answer, "error");
            } else {
                pid = answer.at("pid").as_int();
                if (pid <= 0) problem = "the fork server answered pid " + std::to_string(pid);
            }
        } catch (const std::exception& error) {
            problem = "the fork server's answer breaks the protocol: " + std::string(error.what());
        }
    }
    if (!problem.empty()) {
        close_all();
        throw ProcessError({"fork", problem});
    }
    pid_ = static_cast<pid_t>(pid);
    owner_ = ::getpid();
    forked_ = true;
    request_fd_ = request[1];
    reply_fd_ = reply[0];
    status_fd_ = status[0];
    life_fd_ = life[1];
}

void AdapterProcess::handshake(double seconds) {
    send(Request("hello").field("protocol", std::int64_t{protocol_version}).field("kvcheck", KVCHECK_VERSION_TEXT).text());
    handshake_seconds_ = seconds;
    const std::string frame = receive(seconds);
    Json reply;
    try {
        reply = Json::parse(frame);
    } catch (const JsonError& error) {
        fail("start", "the adapter's handshake reply is not JSON (" + std::string(error.what()) + "): '" +
                          printable_prefix(frame) + "'");
    }
    try {
        const Json* version = reply.find("protocol");
        const int theirs = version ? static_cast<int>(version->as_int()) : 0;
        if (version != nullptr && theirs != protocol_version) {
            fail("version", "the adapter '" + command_text_ + "' speaks protocol version " + std::to_string(theirs) +
                                "; this kvcheck speaks version " + std::to_string(protocol_version) +
                                (reply.find("error") ? ": " + reply.at("error").as_string() : std::string()));
        }
        if (!read_bool(reply, "ok")) {
            const Json* traceback = reply.find("traceback");
            fail("start", "the adapter '" + command_text_ + "' refused the handshake: " + read_string(reply, "error") +
                              (traceback != nullptr && traceback->type() == Json::Type::string ? "\n" + traceback->as_string()
                                                                                              : std::string()));
        }
        if (version == nullptr) throw ProtocolError("missing member 'protocol'");
        hello_.protocol = theirs;
        hello_.name = read_string(reply, "name");
        if (hello_.name.empty()) throw ProtocolError("'name' is empty");
        if (reply.find("description")) hello_.description = read_string(reply, "description");
        if (const Json* flags = reply.find("capabilities")) hello_.capabilities = read_capabilities(*flags);
        if (const Json* model = reply.find("model")) hello_.capabilities.model = read_model(*model);
        if (const Json* policy = reply.find("store_policy")) hello_.capabilities.policy = read_policy(*policy);
        const std::string fault = capabilities_fault(hello_.capabilities);
        if (!fault.empty()) throw ProtocolError(fault);
        if (reply.find("copies_in_replies")) hello_.copies_in_replies = read_bool(reply, "copies_in_replies");
        if (reply.find("fork")) hello_.fork = read_bool(reply, "fork");
        if (const Json* served = reply.find("pid")) {
            const std::int64_t pid = served->as_int();
            if (pid <= 0) throw ProtocolError("'pid' is " + std::to_string(pid) + ", not a process");
            if (pid != pid_) hello_.pid = static_cast<int>(pid);
        }
        read_dump_fork(reply);
    } catch (const ProcessError&) {
        throw;
    } catch (const std::exception& error) {
        fail("start", "the adapter's handshake reply breaks the protocol: " + std::string(error.what()));
    }
}

void AdapterProcess::read_dump_fork(const Json& reply) {
    if (reply.find("dump_fork")) hello_.dump_fork = read_bool(reply, "dump_fork");
    std::string why_not;
    const bool preloaded = !preloaded_shim(why_not).empty();
    if (!hello_.capabilities.dump) {
        hello_.dump_fork = false;  // nothing to kill
    } else if (!hello_.dump_fork) {
        const std::string said = reply.find("dump_fork_absent") ? read_string(reply, "dump_fork_absent") : "";
        hello_.dump_fork_absent = !preloaded ? why_not
                                  : !said.empty() ? said
                                                  : "the adapter process does not serve dump_fork requests (docs/protocol.md "
                                                    "section 10a: the SDK serves them when the dump shim is loaded in it)";
    }
    // Its dump runs in a copy the adapter forks (docs/durability.md), never
    // in a fork of kvcheck's process. Not under a content tolerance: the
    // states a kill leaves are compared with the dump's expected digests
    // exactly (docs/semantics.md#content-tolerance).
    hello_.capabilities.dump_kill = hello_.dump_fork && !hello_.capabilities.content_tolerance.declared();
    if (hello_.dump_fork && !hello_.capabilities.dump_kill) {
        hello_.dump_fork_absent = "the adapter declares a content tolerance: killed dumps are compared exactly";
    }
}

Json AdapterProcess::call(const std::string& request) {
    send(request);
    const std::string frame = receive(0);
    limit_output();
    return parse_reply(frame);
}

Json AdapterProcess::call_concurrent(const std::string& request) {
    std::unique_lock<std::mutex> lock(requests_mutex_);
    if (broken_) throw ProcessError(*broken_);
    const std::uint64_t id = ++request_id_last_;
    in_flight_.insert(id);
    std::string tagged = request;
    tagged.insert(1, "\"rid\":" + std::to_string(id) + ",");
    unsent_.push_back(std::move(tagged));
    lock.unlock();
    try {
        // The thread level (kvcheck/yield.h): other clients may run here and
        // add their requests to this batch, so that several requests are in
        // flight to the adapter at once. Outside it, nothing.
        kvcheck::yield("reply");
        send_unsent();
        // Under the thread level the one client running reads every reply
        // in flight before it goes on: the next batch reaches an adapter
        // with nothing in flight, and the adapter's interleaving of a batch
        // is a function of its seed and the batch (docs/protocol.md 11b).
        const bool every_reply = kvcheck::yield_hook != nullptr;
        lock.lock();
        for (;;) {
            if (const auto found = replies_.find(id); found != replies_.end() && (!every_reply || in_flight_.empty())) {
                Json reply = std::move(found->second);
                replies_.erase(found);
                return reply;
            }
            if (broken_) throw ProcessError(*broken_);
            if (reading_) {
                replied_.wait(lock);
                continue;
            }
            reading_ = true;
            lock.unlock();
            read_one_reply();
            lock.lock();
            reading_ = false;
            replied_.notify_all();
        }
    } catch (const ProcessError& error) {
        if (!lock.owns_lock()) lock.lock();
        reading_ = false;
        if (!broken_) broken_ = error.fault();
        replied_.notify_all();
        throw;
    }
}

void AdapterProcess::send_unsent() {
    const std::lock_guard<std::mutex> sending(send_mutex_);
    std::vector<std::string> batch;
    {
        const std::lock_guard<std::mutex> lock(requests_mutex_);
        batch.swap(unsent_);
    }
    for (std::size_t k = 0; k + 1 < batch.size(); ++k) batch[k].insert(1, R"("wait":true,)");
    for (const std::string& frame : batch) send(frame);
}

void AdapterProcess::read_one_reply() {
    const std::string frame = receive(0);
    limit_output();
    Json reply = parse_reply(frame);
    const Json* rid = reply.find("rid");
    if (rid == nullptr || rid->type() != Json::Type::integer || rid->as_int() <= 0) {
        fail("protocol", "the adapter declared thread_safe, and its reply carries no request id ('rid'): '" +
                             printable_prefix(frame) + "'");
    }
    const auto id = static_cast<std::uint64_t>(rid->as_int());
    std::unique_lock<std::mutex> lock(requests_mutex_);
    if (in_flight_.erase(id) == 0) {
        lock.unlock();
        fail("protocol", "the adapter's reply carries the request id " + std::to_string(id) +
                             ", of no request in flight: '" + printable_prefix(frame) + "'");
    }
    replies_.emplace(id, std::move(reply));
}

Json AdapterProcess::parse_reply(const std::string& frame) {
    Json reply;
    try {
        reply = Json::parse(frame);
    } catch (const JsonError& error) {
        fail("protocol", "the adapter answered with a frame that is not JSON (" + std::string(error.what()) + "): '" +
                             printable_prefix(frame) + "'");
    }
    const Json* ok = reply.find("ok");
    if (ok == nullptr || ok->type() != Json::Type::boolean) {
        fail("protocol", "the adapter's reply has no boolean 'ok': '" + printable_prefix(frame) + "'");
    }
    return reply;
}

void AdapterProcess::send(const std::string& payload) {
    const std::string frame = frame_of(payload);
    std::size_t done = 0;
    while (done < frame.size()) {
        const ssize_t n = ::write(request_fd_, frame.data() + done, frame.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) died(hello_.protocol == 0 ? "before answering the handshake" : "while kvcheck sent it a request", "request");
        done += static_cast<std::size_t>(n);
    }
}

std::string AdapterProcess::receive(double still_seconds) {
    // The handshake's limit is on the time the process stood still
    // (stillness.h): a loaded machine slows an import, it does not hang it.
    Stillness still;
    if (still_seconds > 0) still.restart(sample_processes(process_tree(pid_), now_seconds()));
    for (;;) {
        if (buffer_.size() >= 4) {
            std::uint32_t size = 0;
            for (int i = 0; i < 4; ++i) size = (size << 8) | static_cast<unsigned char>(buffer_[static_cast<std::size_t>(i)]);
            if (size > frame_bytes_max) {
                fail("protocol", "the adapter wrote something that is not a protocol frame on its reply pipe (a length of " +
                                     std::to_string(size) + " bytes, over the limit of " + std::to_string(frame_bytes_max) +
                                     "): '" + printable_prefix(buffer_) + "'");
            }
            if (buffer_.size() >= 4 + std::size_t{size}) {
                std::string frame = buffer_.substr(4, size);
                buffer_.erase(0, 4 + std::size_t{size});
                return frame;
            }
        }
        if (still_seconds > 0) {
            pollfd ready{reply_fd_, POLLIN, 0};
            const int polled = ::poll(&ready, 1, still_sample_ms);
            if (polled < 0 && errno == EINTR) continue;
            if (polled == 0) {
                still.observe(sample_processes(process_tree(pid_), now_seconds()));
                if (still.hung(still_seconds)) {
                    char seconds[32];
                    std::snprintf(seconds, sizeof seconds, "%g", handshake_seconds_);
                    char silent[32];
                    std::snprintf(silent, sizeof silent, "%.0f", still.silent_seconds());
                    fail("start", "the adapter '" + command_text_ + "' did not answer the handshake within " + seconds +
                                      " s of its own time (running or blocked; " + silent +
                                      " s of wall time, time it waited for a CPU not counted)");
                }
                continue;
            }
        } else {
            // A long operation may be one that writes without end.
            pollfd ready{reply_fd_, POLLIN, 0};
            const int polled = ::poll(&ready, 1, output_check_ms);
            if (polled < 0 && errno == EINTR) continue;
            if (polled == 0) {
                limit_output();
                continue;
            }
        }
        char chunk[65536];
        const ssize_t n = ::read(reply_fd_, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) died(hello_.protocol == 0 ? "before answering the handshake" : "before answering a request", "reply");
        buffer_.append(chunk, static_cast<std::size_t>(n));
    }
}

void AdapterProcess::reap(double grace_seconds) {
    if (reaped_ || pid_ <= 0) return;
    if (forked_) {
        reap_forked(grace_seconds);
        return;
    }
    const double until = now_seconds() + grace_seconds;
    // Woken when the process ends (a pidfd), not at the next look; where
    // there is none (Linux before 5.3), a look every 2 ms.
    const int ended = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    for (;;) {
        const pid_t done = ::waitpid(pid_, &wait_status_, WNOHANG);
        if (done == pid_ || (done < 0 && errno != EINTR)) break;
        const double left = until - now_seconds();
        if (left <= 0) {
            ::kill(-pid_, SIGKILL);
            ::kill(pid_, SIGKILL);
            while (::waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {}
            killed_here_ = true;
            break;
        }
        if (ended >= 0) {
            pollfd exit{ended, POLLIN, 0};
            ::poll(&exit, 1, static_cast<int>(left * 1000) + 1);
        } else {
            ::usleep(2000);
        }
    }
    if (ended >= 0) ::close(ended);
    // Whatever the adapter started in its process group goes with it.
    ::kill(-pid_, SIGKILL);
    reaped_ = true;
}

// A warm copy is the fork server's child: the server sends its wait status
// (four bytes, this machine's byte order) when it ends, and kills it when
// the life pipe closes. (The server kills the one it knows is its live
// child: a pid killed from here might have been reaped and reused.)
void AdapterProcess::reap_forked(double grace_seconds) {
    const auto wait_for_status = [this](double seconds) {
        const double until = now_seconds() + seconds;
        std::string bytes;
        while (bytes.size() < sizeof wait_status_) {
            const double left = until - now_seconds();
            pollfd ready{status_fd_, POLLIN, 0};
            const int polled = left > 0 ? ::poll(&ready, 1, static_cast<int>(left * 1000) + 1) : 0;
            if (polled < 0 && errno == EINTR) continue;
            if (polled <= 0) return false;
            char chunk[sizeof wait_status_];
            const ssize_t n = ::read(status_fd_, chunk, sizeof chunk - bytes.size());
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return false;
            bytes.append(chunk, static_cast<std::size_t>(n));
        }
        std::memcpy(&wait_status_, bytes.data(), sizeof wait_status_);
        return true;
    };
    if (!wait_for_status(grace_seconds)) {
        killed_here_ = true;  // closing the life pipe has the server kill it
        close_quietly(life_fd_);
        if (!wait_for_status(10)) {
            // The server is gone or stuck: kill the copy from here.
            ::kill(-pid_, SIGKILL);
            ::kill(pid_, SIGKILL);
            wait_status_ = SIGKILL;  // as waitpid reports a death by SIGKILL
        }
    }
    close_quietly(life_fd_);
    close_quietly(status_fd_);
    reaped_ = true;
}

void AdapterProcess::fail(const std::string& kind, const std::string& detail) {
    std::string text = detail;
    if (kind == "start" || kind == "version") {
        const std::string tail = output_tail();
        if (!tail.empty()) text += "\nthe adapter's output ends with:\n" + tail;
    }
    close_quietly(request_fd_);
    close_quietly(reply_fd_);
    reap(kind == "start" || kind == "version" ? 2 : 0);
    const ProcessFault fault{kind, text};
    if (on_fault_) on_fault_(fault);
    throw ProcessError(fault);
}

void AdapterProcess::died(const std::string& when, const char* pipe) {
    close_quietly(request_fd_);
    close_quietly(reply_fd_);
    // A process that is ending closes its pipes moments before it can be
    // reaped; one still running after this long closed its pipe and went on.
    constexpr double grace_seconds = 2;
    reap(grace_seconds);
    const std::string who = "the adapter process '" + command_text_ + "' (pid " + std::to_string(pid_) + ")";
    std::string kind = "exit";
    std::string detail;
    if (killed_here_) {
        // kvcheck's own SIGKILL says nothing of the adapter: what it did was
        // close its pipe and go on running.
        kind = "protocol";
        detail = who + " closed its " + pipe + " pipe " + when + " but went on running (kvcheck killed it " +
                 std::to_string(static_cast<int>(grace_seconds)) + " s later)";
    } else if (WIFSIGNALED(wait_status_)) {
        kind = "crash";
        detail = who + " was killed by " + posix::signal_name(WTERMSIG(wait_status_)) + " " + when;
    } else {
        detail = who + " exited with status " + std::to_string(WEXITSTATUS(wait_status_)) + " " + when;
    }
    if (hello_.protocol == 0) kind = "start";
    fail(kind, detail);
}

void AdapterProcess::shut_down() {
    if (!owned_here() || reaped_) return;
    if (request_fd_ >= 0) {
        // Best effort: a process that is gone already is reaped below.
        const std::string frame = frame_of(Request("shutdown").text());
        ssize_t ignored = ::write(request_fd_, frame.data(), frame.size());
        (void)ignored;
    }
    close_quietly(request_fd_);
    close_quietly(reply_fd_);
    reap(2);
}

std::string AdapterProcess::output_tail(std::size_t bytes_max) const { return file_tail(output_path_, bytes_max); }

std::string file_tail(const std::string& path, std::size_t bytes_max) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return {};
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    const std::streamoff from = std::max<std::streamoff>(0, size - static_cast<std::streamoff>(bytes_max));
    in.seekg(from);
    std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (from > 0) {
        const std::size_t newline = tail.find('\n');
        if (newline != std::string::npos) tail.erase(0, newline + 1);
    }
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
    return tail;
}

void AdapterProcess::limit_output() {
    struct stat info {};
    if (::stat(output_path_.c_str(), &info) != 0 || info.st_size <= output_bytes_max) return;
    // The adapter appends (O_APPEND): what it writes next lands after the note.
    if (::truncate(output_path_.c_str(), 0) != 0) return;
    output_dropped_ += static_cast<std::uint64_t>(info.st_size);
    const std::string note = "[kvcheck: " + std::to_string(output_dropped_) +
                             " bytes of the adapter's output dropped so far: an output file keeps at most " +
                             std::to_string(output_bytes_max >> 20) + " MiB]\n";
    const int fd = ::open(output_path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return;
    const ssize_t ignored = ::write(fd, note.data(), note.size());
    (void)ignored;
    ::close(fd);
}

void AdapterProcess::clear_output() {
    // A failure leaves more than the last trace's output in the tail: harmless.
    const int ignored = ::truncate(output_path_.c_str(), 0);
    (void)ignored;
    output_dropped_ = 0;
}

}  // namespace kvcheck::process
