// Loading an adapter plugin (a shared library exporting the versioned entry
// point of kvcheck/plugin.h) without trusting it. A plugin's code runs as
// soon as it is loaded (static constructors) and when its entry point is
// called; either may crash, hang or exit. So kvcheck first loads it and
// calls its entry point in a child process (sandbox.h): a plugin that
// crashes, exits or hangs there is a clear error (UsageError, exit 2),
// never a pass and never the end of kvcheck. The parent never loads it:
// each engine process loads it for itself when it makes its first engine
// (unless --no-isolate runs engines in kvcheck's own process).
//
//   Adapter adapter = load_plugin("build/libmyengine.so");  // probed in a child
//   auto engine = adapter.make();                            // loads it here, on first use
#pragma once

#include "adapters.h"

#include <string>

namespace kvcheck::cli {

// Throws UsageError naming what is wrong: a missing file, a dlopen error, a
// missing entry point, an ABI version mismatch, an incomplete description,
// or a crash, exit or hang while loading.
Adapter load_plugin(const std::string& path);

}  // namespace kvcheck::cli
