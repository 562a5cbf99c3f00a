// The plugin entry point: how an engine built outside kvcheck's tree is
// loaded by `kvcheck run --adapter path/to/libmyengine.so`.
//
// A plugin is a shared library exporting one C function, named after the
// ABI version it was built for, that describes the adapter and makes
// engines. kvcheck refuses a plugin whose version differs from its own with
// an error that names both versions. Bump the version whenever engine.h or
// content.h change in a way that breaks compiled plugins.
//
//   #include <kvcheck/plugin.h>
//   class MyEngine : public kvcheck::Engine { ... };
//   KVCHECK_PLUGIN(MyEngine, "my-engine", "what it is, in one line")
#pragma once

#include "kvcheck/engine.h"
#include "kvcheck/yield.h"

#define KVCHECK_PLUGIN_ABI_VERSION 16
#define KVCHECK_PLUGIN_SYMBOL "kvcheck_plugin_v10"
// The entry point's name, KVCHECK_PLUGIN_SYMBOL as an identifier: one
// place to bump with the version.
#define KVCHECK_PLUGIN_ENTRY kvcheck_plugin_v10

extern "C" {

struct kvcheck_plugin {
    int abi_version;          // KVCHECK_PLUGIN_ABI_VERSION when the plugin was built
    const char* name;         // the adapter's name in reports
    const char* description;  // one line
    kvcheck::Engine* (*create)();           // a fresh engine; kvcheck calls it once per trace
    void (*destroy)(kvcheck::Engine* engine);  // frees what create made
    // The plugin's own kvcheck::yield_hook (kvcheck/yield.h), which kvcheck
    // sets for the length of a thread-level run: kvcheck::yield inside the
    // plugin reaches kvcheck's scheduler.
    kvcheck_yield_fn* yield_hook;
};

}  // extern "C"

// Defines the entry point for an engine type with a default constructor.
#define KVCHECK_PLUGIN(EngineType, Name, Description)                                     \
    extern "C" __attribute__((visibility("default"))) const kvcheck_plugin* KVCHECK_PLUGIN_ENTRY() { \
        static const kvcheck_plugin plugin = {                                           \
            KVCHECK_PLUGIN_ABI_VERSION, Name, Description,                              \
            []() -> kvcheck::Engine* { return new EngineType(); },                      \
            [](kvcheck::Engine* engine) { delete engine; }, &kvcheck::yield_hook};      \
        return &plugin;                                                                  \
    }
