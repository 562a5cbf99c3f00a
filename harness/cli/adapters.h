// The adapters the CLI can check: the bundled ones by name, plugins by path
// (a shared library exporting the versioned entry point of
// kvcheck/plugin.h), and engines in another process that speak the adapter
// protocol (docs/protocol.md): `exec:COMMAND`, or a Python script `x.py
// [args]` run by the chosen interpreter.
#pragma once

#include "kvcheck/engine.h"

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

struct Adapter {
    std::string name;
    std::string description;
    std::string source;               // "bundled", the plugin's path, or "exec:COMMAND"
    std::vector<std::string> breaks;  // bundled mutants: the properties they are known to break
    std::function<std::shared_ptr<Engine>()> make;
    // An engine in another process: what it printed in the child process
    // `pid` (0: this process), its last lines, and the file holding it
    // removed. Empty for engines loaded in process.
    std::function<std::string(int pid)> take_output;
};

struct AdapterOptions {
    // The interpreter of a Python script adapter; empty: $KVCHECK_PYTHON,
    // else /usr/bin/python3 (Debian's, which has torch).
    std::string python;
};

// "reference", "M3", ..., a path to a plugin, "exec:COMMAND" or a Python
// script ("engine.py --flag"). Throws UsageError naming what is wrong
// (unknown name, missing file, dlopen error, missing entry point, ABI or
// protocol version mismatch, a process that fails its handshake).
Adapter load_adapter(const std::string& name_or_path, const AdapterOptions& options = {});

// `text` as one word of a POSIX shell command line (quoted when it must be).
std::string shell_quoted(const std::string& text);
std::vector<Adapter> bundled_adapters();

}  // namespace kvcheck::cli
