// The mutants: the reference with one known bug planted each
// (docs/semantics.md#known-bugs), as bundled adapters carrying the
// properties each is known to break.
#pragma once

#include "kvcheck/adapter.h"

#include <vector>

namespace kvcheck::adapters {

std::vector<Adapter> mutant_adapters();
// The paged reference's mutants (paged_mutants.cpp).
std::vector<Adapter> paged_mutant_adapters();
// The concurrency mutants (lane_mutants.cpp): found with several clients
// (Adapter::lanes), not by one.
std::vector<Adapter> lane_mutant_adapters();
// The mutants only the thread level finds (kvcheck/threads.h): calls that
// overlap on threads, interleaved at the kvcheck::yield inside each bug.
std::vector<Adapter> thread_mutant_adapters();

}  // namespace kvcheck::adapters
