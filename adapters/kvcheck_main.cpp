// The kvcheck tool: the command line of harness/cli with the bundled
// adapters (the reference and the mutants) built in.
#include "bundled.h"
#include "main.h"

int main(int argc, char** argv) { return kvcheck::cli::main(argc, argv, kvcheck::adapters::bundled()); }
