// The property suites' main: a fixed RapidCheck seed and budget unless
// RC_PARAMS says otherwise, so CI runs are deterministic and a long run is
// RC_PARAMS="seed=7 max_success=100000 max_size=200".
#include "ram_dir.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
    constexpr const char* ci_params = "seed=20261202 max_success=200";
    if (std::getenv("RC_PARAMS") == nullptr) ::setenv("RC_PARAMS", ci_params, 1);
    std::cout << "RC_PARAMS=\"" << std::getenv("RC_PARAMS") << "\"\n";
    // The suites' dumps in RAM (ram_dir.h): on a disk, their fsyncs were
    // most of a suite's wall time.
    const kvcheck::posix::RamTmpdir temporary;
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
