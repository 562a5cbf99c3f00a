// The kvcheck tool: the command line of harness/cli with the bundled
// adapters (the reference and the mutants) built in.
#include "bundled.h"
#include "main.h"

int main(int argc, char** argv) {
    std::vector<kvcheck::cli::Adapter> bundled;
    for (const kvcheck::adapters::BundledAdapter& adapter : kvcheck::adapters::bundled()) {
        auto make = adapter.make;
        bundled.push_back({adapter.name, adapter.description, "bundled", adapter.breaks,
                           [make] { return std::shared_ptr<kvcheck::Engine>(make()); }});
    }
    return kvcheck::cli::main(argc, argv, std::move(bundled));
}
