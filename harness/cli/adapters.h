// The adapters the CLI can check: the bundled ones by name, plugins by path
// (a shared library exporting the versioned entry point of
// kvcheck/plugin.h), and engines in another process that speak the adapter
// protocol (docs/protocol.md): `exec:COMMAND`, or a Python script `x.py
// [args]` run by the chosen interpreter.
#pragma once

#include "kvcheck/adapter.h"
#include "kvcheck/search.h"

#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
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

struct AdapterOptions {
    // The interpreter of a Python script adapter; empty: $KVCHECK_PYTHON,
    // else the script's `#!` interpreter, else an active virtual
    // environment's ($VIRTUAL_ENV/bin/python), else the python beside this
    // kvcheck (where its installed SDK lives), else /usr/bin/python3.
    std::string python;
    // The run's seed, given to a process adapter as $KVCHECK_THREAD_SEED
    // (its SDK's thread schedule: docs/protocol.md section 11a), unless
    // that is set already. Empty: not given.
    std::optional<std::uint64_t> thread_seed;
};

// "reference", "M3", ..., a path to a plugin, "exec:COMMAND" or a Python
// script ("engine.py --flag"). Throws UsageError naming what is wrong
// (unknown name, missing file, dlopen error, missing entry point, ABI or
// protocol version mismatch, a process that fails its handshake).
Adapter load_adapter(const std::string& name_or_path, const AdapterOptions& options = {});
// The adapters built into the binary (the kvcheck tool registers the
// reference and the mutants at start-up, through cli::main).
void set_bundled_adapters(std::vector<Adapter> adapters);

// How to make an engine of `adapter` that nothing earlier reached: for a
// process adapter, an engine in a fresh adapter process (the current one
// stopped); for an engine loaded in kvcheck's process (bundled, plugin), a
// fresh instance (adapter.make). What a finding's replays run on
// (PropertySearch, docs/semantics.md#reproduction).
EngineFactory isolated_factory(const Adapter& adapter);
// Whether a finding of `adapter` is replayed by a kvcheck process of its own
// instead (`kvcheck replay`, exec'd from this binary): a plugin's, whose
// statics a fresh instance in this process would share.
bool replays_in_child(const Adapter& adapter);

using kvcheck::shell_quoted;
std::vector<Adapter> bundled_adapters();

// The bundled Python example store (python/examples/activation_memory_adapter.py
// of the source tree kvcheck was built from), run through the adapter
// protocol as any Python engine is. Throws UsageError when it cannot be
// checked here (the file is gone, the interpreter has no torch).
std::string python_example_path();
Adapter python_example(const AdapterOptions& options = {});

}  // namespace kvcheck::cli
