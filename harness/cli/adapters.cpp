#include "adapters.h"

#include "bundled.h"
#include "plugin_probe.h"

namespace kvcheck::cli {
namespace {

Adapter from_bundled(const adapters::BundledAdapter& bundled) {
    auto make = bundled.make;
    return {bundled.name, bundled.description, "bundled", bundled.breaks,
            [make] { return std::shared_ptr<Engine>(make()); }};
}

bool looks_like_path(const std::string& text) {
    return text.find('/') != std::string::npos || (text.size() > 3 && text.compare(text.size() - 3, 3, ".so") == 0);
}

}  // namespace

std::vector<Adapter> bundled_adapters() {
    std::vector<Adapter> all;
    for (const auto& bundled : adapters::bundled()) all.push_back(from_bundled(bundled));
    return all;
}

Adapter load_adapter(const std::string& name_or_path) {
    if (const adapters::BundledAdapter* bundled = adapters::find_bundled(name_or_path)) return from_bundled(*bundled);
    if (looks_like_path(name_or_path)) return load_plugin(name_or_path);
    std::string names;
    for (const auto& bundled : adapters::bundled()) names += " " + bundled.name;
    throw UsageError("unknown adapter '" + name_or_path + "': give a bundled name (" + names.substr(1) +
                     ") or the path of a plugin (.so)");
}

}  // namespace kvcheck::cli
