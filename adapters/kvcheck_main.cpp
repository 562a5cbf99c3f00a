// The kvcheck tool: the command line of harness/cli with the bundled
// adapters (the reference and the mutants) built in.
#include "bundled.h"
#include "main.h"

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
    const int status = kvcheck::cli::main(argc, argv, kvcheck::adapters::bundled());
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
