// The adapters that ship with kvcheck: the reference and the mutants (each
// a known bug planted in the reference, docs/semantics.md#known-bugs, with
// the properties it is known to break).
//
//   for (const kvcheck::Adapter& adapter : kvcheck::adapters::bundled()) {
//       auto engine = adapter.make();   // a fresh engine per trace run
//   }
#pragma once

#include "kvcheck/adapter.h"

#include <string>
#include <vector>

namespace kvcheck::adapters {

const std::vector<Adapter>& bundled();
const Adapter* find_bundled(const std::string& name);  // null when unknown

}  // namespace kvcheck::adapters
