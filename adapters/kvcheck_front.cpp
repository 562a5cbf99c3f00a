// The kvcheck executable users run. It links no libtorch: it answers help
// and the usage errors of a command line itself (harness/cli/command_line.h,
// a few milliseconds), and for everything else becomes kvcheck-core, the
// command line with the bundled adapters (kvcheck_main.cpp), installed
// beside it: the same process (its pid, its signals, its exit status), the
// same arguments. A start of kvcheck-core costs 0.4 CPU-s, about 1 s under
// ASan, all of it libtorch's load (BENCHMARKS.md, "kvcheck starts without
// libtorch").
#include "command_line.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <unistd.h>

int main(int argc, char** argv) {
    if (const std::optional<int> status = kvcheck::cli::answer_without_engines(kvcheck::cli::Args(argv + 1, argv + argc))) {
        return *status;
    }
    // Beside this executable, wherever it is installed (the build's bin/,
    // a prefix's bin/, the wheel's kvcheck_adapter/_bin/): kvcheck-core's
    // /proc/self/exe then names the same directory as this one's.
    std::error_code ignored;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ignored);
    const std::string core = (self.parent_path() / KVCHECK_CORE_NAME).string();
    ::execv(core.c_str(), argv);
    std::cerr << "kvcheck: error: cannot run " << core << ": " << std::strerror(errno) << "\n";
    return 2;
}
