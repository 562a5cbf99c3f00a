// The kvcheck command line, as a function: the binary that calls it decides
// which adapters are built in (adapters/kvcheck_main.cpp passes the
// reference and the mutants), so the CLI depends on no adapter.
//
//   int main(int argc, char** argv) { return kvcheck::cli::main(argc, argv, my_adapters()); }
#pragma once

#include "adapters.h"

#include <vector>

namespace kvcheck::cli {

int main(int argc, char** argv, std::vector<Adapter> bundled);

}  // namespace kvcheck::cli
