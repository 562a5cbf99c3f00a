#include "adapters.h"

#include "kvcheck/plugin.h"

#include <dlfcn.h>
#include <filesystem>

namespace kvcheck::cli {
namespace {

std::vector<Adapter>& bundled_list() {
    static std::vector<Adapter> list;
    return list;
}

const Adapter* find_bundled(const std::string& name) {
    for (const Adapter& adapter : bundled_list()) {
        if (adapter.name == name) return &adapter;
    }
    return nullptr;
}

bool looks_like_path(const std::string& text) {
    return text.find('/') != std::string::npos || (text.size() > 3 && text.compare(text.size() - 3, 3, ".so") == 0);
}

Adapter load_plugin(const std::string& path) {
    if (!std::filesystem::exists(path)) throw UsageError("adapter plugin not found: " + path);
    // The library stays loaded until exit: engines and their vtables live in it.
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
    return {plugin->name, plugin->description ? plugin->description : "", path, {},
            [plugin] { return std::shared_ptr<Engine>(plugin->create(), plugin->destroy); }};
}

}  // namespace

void set_bundled_adapters(std::vector<Adapter> adapters) { bundled_list() = std::move(adapters); }

std::vector<Adapter> bundled_adapters() { return bundled_list(); }

Adapter load_adapter(const std::string& name_or_path) {
    if (const Adapter* bundled = find_bundled(name_or_path)) return *bundled;
    if (looks_like_path(name_or_path)) return load_plugin(name_or_path);
    std::string names;
    for (const Adapter& bundled : bundled_list()) names += " " + bundled.name;
    throw UsageError("unknown adapter '" + name_or_path + "': give a bundled name (" + names.substr(1) +
                     ") or the path of a plugin (.so)");
}

}  // namespace kvcheck::cli
