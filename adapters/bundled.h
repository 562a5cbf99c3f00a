// The adapters that ship with kvcheck: the reference and the mutants, each
// mutant a known bug (SPEC section 5) planted in the reference, with the
// properties it is known to break.
//
//   for (const auto& adapter : kvcheck::adapters::bundled()) {
//       auto engine = adapter.make();   // a fresh engine per trace run
//   }
#pragma once

#include "kvcheck/engine.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvcheck::adapters {

struct BundledAdapter {
    std::string name;         // "reference", "M1", ...
    std::string description;  // the bug, in one line
    std::vector<std::string> breaks;  // property ids it breaks (empty for the reference)
    std::function<std::unique_ptr<Engine>()> make;
};

const std::vector<BundledAdapter>& bundled();
const BundledAdapter* find_bundled(const std::string& name);  // null when unknown

}  // namespace kvcheck::adapters
