// kvcheck::Engine over the adapter protocol: an engine in another process,
// in any language (docs/protocol.md), checked exactly as an in-process one.
//
// ProcessLauncher is what the command line keeps per adapter: the command,
// a directory for the processes' output, the process the current process
// started, and the fork server its warm starts copy (when the adapter
// offers one: Python pays about a second to import torch per start). make() hands out a ProcessEngine per trace; the process
// is reused across traces (a reset gives it a fresh engine: starting Python
// with torch costs about a second; the reset goes with the new engine's
// first request). A forked sandbox child starts a process of its own on its
// first make(): the parent's pipes are never shared.
//
// ProcessEngine keeps what the adapter reported of handles and entries
// between two operations: observations are read-only (engine.h), so a fact
// stays true until the next request that can change anything, and every
// such request (each store, generation and cache-level operation) forgets
// them all. An adapter may report the facts of what an operation touched
// in that operation's reply ("observed"), and those of the entries the
// harness said it reads after the step (Engine::expect_reads, told to the
// adapter in the operation's request); kvcheck then asks nothing more
// about them, and asks for whatever a reply did not carry. Only one engine
// of a launcher is usable at a time: the one made last (an older one
// throws on use).
//
//   ProcessLauncher launcher({{"/usr/bin/python3", "my_adapter.py"}, "my_adapter.py"}, {});
//   Hello hello = launcher.probe();              // handshake; exit 2 on a mismatch
//   std::shared_ptr<Engine> engine = launcher.make();
//   kvcheck::execute(trace, *engine);
#pragma once

#include "adapter_process.h"
#include "kvcheck/engine.h"

#include <memory>
#include <string>

namespace kvcheck::process {

struct LaunchOptions {
    // How long a process may take to answer the handshake (Python importing
    // torch on a loaded machine takes several seconds).
    double handshake_seconds = 120;
    // Runs before a process fault is thrown (kvcheck run: the sandbox child
    // ends itself, and the fault is reported as a FAULT verdict).
    FaultHandler on_fault;
    // Warm starts: the probe's process is kept as a fork server when it
    // offers to be one (docs/protocol.md section 10), and make() in any
    // process (the sandbox's children too) starts a copy of it instead of
    // the command: no second interpreter start. Off: every start runs the
    // command (so does an adapter that does not offer it).
    bool warm_starts = true;
    // Runs with the pid of each engine process not below this one: a warm
    // copy, before its handshake, and a zygote's copy that the handshake
    // named (Hello::pid), after it (kvcheck run: the sandbox counts its
    // memory and its time with the child's, as it counts a descendant's).
    std::function<void(int)> on_warm_start;
};

// The engine session a ProcessEngine belongs to (process_engine.cpp).
struct Connection;

class ProcessLauncher {
  public:
    // Makes the output directory (under $TMPDIR). Throws ProcessError.
    ProcessLauncher(ProcessCommand command, LaunchOptions options);
    // In the process that made it: stops its adapter process and removes
    // the output directory.
    ~ProcessLauncher();
    ProcessLauncher(const ProcessLauncher&) = delete;
    ProcessLauncher& operator=(const ProcessLauncher&) = delete;

    // Starts the command and shakes hands: what the adapter says it is.
    // The process is kept as the fork server of warm starts when it offers
    // to be one (and warm_starts is on), else stopped again. Throws
    // ProcessError ("start", "version").
    Hello probe();
    // A fresh engine: the first starts this process's adapter process (a
    // warm copy of the fork server when there is one, else the command),
    // the next ones reset it (with their first request: a reset that fails
    // is a "start" ProcessError of that request).
    std::shared_ptr<Engine> make();
    // A fresh engine in a fresh adapter process: the current one is
    // stopped first, so that nothing an earlier engine left in the process
    // (module state, a cache of objects by address) can reach it. What
    // replays a finding to verify it (docs/semantics.md#reproduction).
    std::shared_ptr<Engine> make_isolated();
    // Whether the adapter processes of make() are warm copies.
    bool warm() const;
    // What the adapter process started by process `pid` printed (its last
    // `bytes_max` bytes); its output file is removed. Empty when none.
    std::string take_output(int pid, std::size_t bytes_max = 4096);
    const ProcessCommand& command() const { return command_; }
    // The adapter process this process started (-1: none running).
    int process_id() const;

  private:
    std::string output_path(const std::string& name) const;

    ProcessCommand command_;
    LaunchOptions options_;
    std::string directory_;
    int owner_ = -1;
    std::shared_ptr<Connection> connection_;
    std::unique_ptr<AdapterProcess> fork_server_;  // started by the owner; inherited by forked children
};

}  // namespace kvcheck::process
