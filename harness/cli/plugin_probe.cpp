#include "plugin_probe.h"

#include "interrupt.h"
#include "kvcheck/plugin.h"
#include "kvcheck/threads.h"
#include "sandbox.h"
#include "text.h"

#include <dlfcn.h>
#include <filesystem>
#include <map>
#include <mutex>

namespace kvcheck::cli {
namespace {

// Loading and the entry point get this long before the plugin counts as
// hung: loading libraries of a large engine can take seconds.
constexpr double load_seconds_max = 60;

// The plugin's description, in the process that calls it (dlopen keeps
// one copy of a library per process; the library stays loaded until exit:
// engines and their vtables live in it). Throws UsageError.
const kvcheck_plugin* open_plugin(const std::string& path) {
    static std::mutex mutex;
    static std::map<std::string, const kvcheck_plugin*> opened;
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto found = opened.find(path); found != opened.end()) return found->second;
    void* library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) throw UsageError(std::string("cannot load adapter plugin: ") + ::dlerror());
    using Entry = const kvcheck_plugin* (*)();
    auto entry = reinterpret_cast<Entry>(::dlsym(library, KVCHECK_PLUGIN_SYMBOL));
    if (entry == nullptr) {
        for (int version = 0; version < 10; ++version) {
            const std::string other = "kvcheck_plugin_v" + std::to_string(version);
            if (version != KVCHECK_PLUGIN_ABI_VERSION && ::dlsym(library, other.c_str()) != nullptr) {
                throw UsageError(path + " is a kvcheck plugin for ABI version " + std::to_string(version) +
                                 "; this kvcheck loads version " + std::to_string(KVCHECK_PLUGIN_ABI_VERSION) +
                                 ": rebuild the plugin against this kvcheck");
            }
        }
        throw UsageError(path + " is not a kvcheck plugin: it exports no " KVCHECK_PLUGIN_SYMBOL
                                "() (define one with KVCHECK_PLUGIN from kvcheck/plugin.h)");
    }
    const kvcheck_plugin* plugin = entry();
    if (plugin == nullptr || plugin->abi_version != KVCHECK_PLUGIN_ABI_VERSION) {
        throw UsageError(path + " declares ABI version " + std::to_string(plugin ? plugin->abi_version : -1) +
                         "; this kvcheck loads version " + std::to_string(KVCHECK_PLUGIN_ABI_VERSION));
    }
    if (plugin->create == nullptr || plugin->destroy == nullptr || plugin->name == nullptr) {
        throw UsageError(path + ": the plugin description lacks a name, create or destroy");
    }
    // Its kvcheck::yield reaches the thread level's scheduler (kvcheck/threads.h).
    add_yield_slot(plugin->yield_hook);
    opened[path] = plugin;
    return plugin;
}

// Loads the plugin in a child and returns its name and description.
std::pair<std::string, std::string> probe(const std::string& path) {
    Limits limits;
    limits.silence_seconds = load_seconds_max;
    limits.total_seconds = load_seconds_max;
    Sandbox sandbox(limits);
    const auto job = sandbox.run([&path](Channel& out) {
        try {
            const kvcheck_plugin* plugin = open_plugin(path);
            out.send("name", plugin->name);
            out.send("description", plugin->description != nullptr ? plugin->description : "");
        } catch (const UsageError& error) {
            out.send("refused", error.what());
        }
    });
    std::string name;
    std::string description;
    bool named = false;
    for (const Message& message : job->messages) {
        if (message.kind == "refused") throw UsageError(message.payload);
        if (message.kind == "name") {
            name = message.payload;
            named = true;
        }
        if (message.kind == "description") description = message.payload;
    }
    const std::string stderr_tail = printable(job->output[1].tail, 600, true);
    const std::string said = stderr_tail.empty() ? "" : "; it wrote to stderr:\n" + stderr_tail;
    if (job->fault && job->fault->kind == "stopped") {
        throw UsageError("loading adapter plugin " + path + " was " + job->fault->detail);
    }
    if (job->fault) {
        const Fault& fault = *job->fault;
        const std::string what = fault.kind == "crash"  ? "crashed (" + fault.detail + ")"
                                 : fault.kind == "hang" ? "did not finish in " + std::to_string(static_cast<int>(load_seconds_max)) + " s"
                                 : fault.kind == "time" ? "did not finish in " + std::to_string(static_cast<int>(load_seconds_max)) + " s"
                                 : fault.kind == "memory" ? "exceeded the memory limit (" + fault.detail + ")"
                                                          : "exited (" + fault.detail + ")";
        throw UsageError("adapter plugin " + path + " " + what +
                         " while being loaded and asked for its description (its static constructors or its " +
                         KVCHECK_PLUGIN_SYMBOL "() entry point); kvcheck checked it in a separate process and ran nothing" +
                         said);
    }
    if (!named) throw UsageError("adapter plugin " + path + " gave no description while being loaded" + said);
    return {name, description};
}

}  // namespace

Adapter load_plugin(const std::string& path) {
    if (!std::filesystem::exists(path)) throw UsageError("adapter plugin not found: " + path);
    auto [name, description] = probe(path);
    return {name, description, path, {}, [path] {
                const kvcheck_plugin* plugin = open_plugin(path);
                return std::shared_ptr<Engine>(plugin->create(), plugin->destroy);
            }};
}

}  // namespace kvcheck::cli
