// An adapter: an engine kvcheck can check, under a name, and the one way to
// make its engines. The bundled adapters (the reference and the mutants),
// plugins (kvcheck/plugin.h) and process adapters all come as one.
//
//   const kvcheck::Adapter& adapter = ...;
//   std::shared_ptr<kvcheck::Engine> engine = adapter.make();   // a fresh engine per trace run
#pragma once

#include "kvcheck/engine.h"
#include "kvcheck/properties.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck {

// Makes a fresh engine; kvcheck calls it once per trace run.
using EngineFactory = std::function<std::shared_ptr<Engine>()>;

struct Adapter {
    std::string name;         // in reports: "reference", "M3", a plugin's own name
    std::string description;  // one line
    std::string source;       // "bundled", a plugin's path, or the command of a process adapter
    // The properties a planted bug (a bundled mutant) is known to break;
    // empty for an engine meant to pass.
    std::vector<Property> breaks;
    EngineFactory make;
    // An engine in another process: what it printed in the child process
    // `pid` (0: this process), its last lines, and the file holding it
    // removed. Unset for engines loaded in process.
    std::function<std::string(int pid)> take_output = nullptr;
    // The model its engines declare (Capabilities::model), when known
    // before any job: a process adapter's handshake, or one engine of a
    // bundled adapter made in kvcheck's process; unset: not known (a
    // plugin, whose engines are made in its jobs only).
    std::optional<ModelDomain> model = std::nullopt;
    // With `model` known: the handshake's Capabilities::paged and ::store,
    // the cache families its engines can be checked on.
    bool paged = false;
    bool store = true;
    // With `model` known: the handshake's Capabilities::policy (whether
    // eviction-as-declared applies).
    StorePolicy policy = {};
    // A process adapter whose dumps kvcheck cannot kill (its handshake:
    // no dump_fork): why, for the dump-safe row's note. Empty otherwise.
    std::string dump_kill_absent = {};
    // The clients a search needs to find what `breaks` lists (kvcheck run
    // --lanes): 1 for the mutants one client finds; more for a concurrency
    // mutant, whose bug lies between two calls of one client's request.
    std::int64_t lanes = 1;
    // A thread mutant: what `breaks` lists is found at the thread level only
    // (kvcheck run --threads, kvcheck/threads.h), whose self-check it joins.
    bool threads = false;

    // How a command line names the adapter: its name when bundled, else its source.
    std::string reference() const { return source == "bundled" ? name : source; }
};

}  // namespace kvcheck
