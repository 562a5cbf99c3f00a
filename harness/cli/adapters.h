// The adapters the CLI can check: the bundled ones by name, and plugins by
// path (a shared library exporting the versioned entry point of
// kvcheck/plugin.h).
#pragma once

#include "kvcheck/adapter.h"

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvcheck::cli {

// A usage or load error: the CLI exits 2 with its message.
class UsageError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

using kvcheck::Adapter;

// "reference", "M3", ... or a path to a plugin. Throws UsageError naming
// what is wrong (unknown name, missing file, dlopen error, missing entry
// point, ABI version mismatch).
Adapter load_adapter(const std::string& name_or_path);
// The adapters built into the binary (the kvcheck tool registers the
// reference and the mutants at start-up, through cli::main).
void set_bundled_adapters(std::vector<Adapter> adapters);
std::vector<Adapter> bundled_adapters();

}  // namespace kvcheck::cli
