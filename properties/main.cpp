// The property suites' main: a fixed RapidCheck seed and budget unless
// RC_PARAMS says otherwise, so CI runs are deterministic and a long run is
// RC_PARAMS="seed=7 max_success=100000 max_size=200".
#include "ram_dir.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include <unistd.h>

namespace {

// The suites' dumps (each trace's dump steps, dump_kill's crash states, the
// thread level's dumps) go where TMPDIR says: unless one is given, to a
// directory of this process's own in RAM (ram_dir.h), removed at exit.
// On a disk, their fsyncs were most of a suite's wall time.
class RamTemp {
  public:
    RamTemp() {
        if (std::getenv("TMPDIR") != nullptr) return;
        std::string pattern = (kvcheck::posix::ram_backed_temp_dir() / "kvcheck-tests-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) return;  // the default temporary directory, then
        path_ = pattern;
        ::setenv("TMPDIR", path_.c_str(), 1);
    }
    ~RamTemp() {
        if (path_.empty()) return;
        std::error_code ignored;
        std::filesystem::remove_all(path_, ignored);
    }
    RamTemp(const RamTemp&) = delete;
    RamTemp& operator=(const RamTemp&) = delete;

  private:
    std::string path_;
};

}  // namespace

int main(int argc, char** argv) {
    constexpr const char* ci_params = "seed=20261202 max_success=200";
    if (std::getenv("RC_PARAMS") == nullptr) ::setenv("RC_PARAMS", ci_params, 1);
    std::cout << "RC_PARAMS=\"" << std::getenv("RC_PARAMS") << "\"\n";
    const RamTemp temporary;
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
