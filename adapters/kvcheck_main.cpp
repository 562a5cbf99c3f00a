// The kvcheck tool: the command line of harness/cli with the bundled
// adapters (the reference and the mutants) built in.
#include "bundled.h"
#include "main.h"
#include "mutants/mutants.h"

#include <cstdio>
#include <iostream>

#include <unistd.h>

// Under AddressSanitizer its leak check runs at exit.
#if defined(__SANITIZE_ADDRESS__)
#define KVCHECK_LEAK_CHECK_AT_EXIT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVCHECK_LEAK_CHECK_AT_EXIT 1
#endif
#endif

int main(int argc, char** argv) {
    // The thread mutants are the command line's (kvcheck run --threads), not
    // in bundled(): the suites that walk it search at the operation level.
    std::vector<kvcheck::Adapter> adapters = kvcheck::adapters::bundled();
    for (kvcheck::Adapter& mutant : kvcheck::adapters::thread_mutant_adapters()) adapters.push_back(std::move(mutant));
    const int status = kvcheck::cli::main(argc, argv, adapters);
#ifdef KVCHECK_LEAK_CHECK_AT_EXIT
    return status;
#else
    // Everything kvcheck wrote is closed (its files) or flushed (its
    // standard streams, checked by cli::main) by now. What exit would add
    // is the teardown of the loaded libraries, libtorch's operator registry
    // first: about 0.1 s of CPU per kvcheck process (BENCHMARKS.md, "The
    // cost of a run").
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    ::_exit(status);
#endif
}
