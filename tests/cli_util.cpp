#include "cli_util.h"

#include "ram_dir.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kvtest::cli {
namespace {

namespace fs = std::filesystem;

// The scratch root, removed when the process that made it exits normally
// (not by forked children: they leave with _exit). In RAM when it can be
// (ram_dir.h): it holds the TMPDIR of every kvcheck run, and so the job
// directories where the engines' dumps are written and fsynced.
class ScratchRoot {
  public:
    ScratchRoot()
        : owner_(::getpid()), path_(kvcheck::posix::ram_backed_temp_dir() / ("kvcheck-cli-" + std::to_string(::getpid()))) {
        fs::remove_all(path_);
        fs::create_directories(path_ / "tmp");
    }
    ~ScratchRoot() {
        if (::getpid() != owner_) return;
        std::error_code ignored;
        fs::remove_all(path_, ignored);
    }
    const fs::path& path() const { return path_; }

  private:
    pid_t owner_;
    fs::path path_;
};

const ScratchRoot& root() {
    static const ScratchRoot instance;
    return instance;
}

double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; }

// With KVCHECK_CLI_TEST_LOG set, each kvcheck start appends a line to that
// file: the test, the wall and CPU (user+sys) seconds of the start, its
// arguments. How the cli suites' time was counted (BENCHMARKS.md).
void log_start(const std::string& arguments, const rusage& before, std::chrono::steady_clock::time_point started) {
    const char* log = std::getenv("KVCHECK_CLI_TEST_LOG");
    if (log == nullptr || *log == '\0') return;
    rusage after{};
    ::getrusage(RUSAGE_CHILDREN, &after);
    const double cpu = seconds(after.ru_utime) + seconds(after.ru_stime) - seconds(before.ru_utime) - seconds(before.ru_stime);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::ofstream(log, std::ios::app) << (test != nullptr ? test->name() : "-") << "\t" << wall << "\t" << cpu << "\t"
                                      << arguments.substr(0, 160) << "\n";
}

}  // namespace

std::string scratch(const std::string& name) { return (root().path() / name).string(); }

std::string kvcheck_tmp() { return (root().path() / "tmp").string(); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string line_starting(const std::string& text, const std::string& start) {
    for (std::size_t at = 0; at < text.size();) {
        const std::size_t end = text.find('\n', at);
        const std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
        if (line.rfind(start, 0) == 0) return line;
        if (end == std::string::npos) break;
        at = end + 1;
    }
    return "";
}

unsigned long number_before(const std::string& text, const std::string& marker) {
    const std::size_t at = text.find(marker);
    if (at == std::string::npos) return 0;
    std::size_t begin = at;
    while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
    return begin == at ? 0 : std::stoul(text.substr(begin, at - begin));
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::vector<std::string> entries(const std::string& dir) {
    std::vector<std::string> names;
    std::error_code error;
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
        names.push_back(it->path().filename().string());
    }
    return names;
}

std::string adds(std::size_t count, std::size_t first) {
    std::string trace;
    for (std::size_t i = first; i < first + count; ++i) {
        trace += "add a" + std::to_string(i) + " modern/f32/" + std::to_string(i) + ":[kv1]\n";
    }
    return trace;
}

bool have(const std::string& program) { return std::system(("command -v " + program + " > /dev/null 2>&1").c_str()) == 0; }

std::string fault_adapter(const std::string& fault) {
    return "--adapter exec:'/usr/bin/python3 " KVCHECK_SOURCE_DIR "/python/adapter_tests/fault_adapter.py --fault " + fault +
           "'";
}

Outcome kvcheck(const std::string& arguments, const std::string& stdout_path) {
    static int count = 0;
    const std::string out = scratch("stdout-" + std::to_string(count));
    const std::string err = scratch("stderr-" + std::to_string(count++));
    const std::string command = "TMPDIR=" + kvcheck_tmp() + " " + KVCHECK_BINARY + " " + arguments + " > " +
                                (stdout_path.empty() ? out : stdout_path) + " 2> " + err;
    Outcome outcome;
    rusage before{};
    ::getrusage(RUSAGE_CHILDREN, &before);
    const auto started = std::chrono::steady_clock::now();
    const int status = std::system(command.c_str());
    log_start(arguments, before, started);
    outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    outcome.stdout_text = read_file(out);
    outcome.stderr_text = read_file(err);
    outcome.out = outcome.stdout_text + outcome.stderr_text;
    fs::remove(out);
    fs::remove(err);
    return outcome;
}

void Cli::SetUp() { fs::create_directories(kvcheck_tmp()); }

void Cli::TearDown() {
    std::string left;
    for (const std::string& name : entries(kvcheck_tmp())) left += " " + name;
    EXPECT_TRUE(left.empty()) << "kvcheck left in its TMPDIR:" << left;
    std::error_code ignored;
    for (const std::string& name : entries(kvcheck_tmp())) fs::remove_all(fs::path(kvcheck_tmp()) / name, ignored);
}

}  // namespace kvtest::cli
