// Shrinking a trace of several clients (kvcheck/lanes.h): fewer lanes and
// fewer context switches, and never a candidate that moves a call to
// another lane (a switch line dropped or changed relabels the calls after
// it). A trace without switches has one lane: none of this applies.
#pragma once

#include "kvcheck/trace.h"

#include <cstddef>
#include <vector>

namespace kvcheck::shrink_lanes {

// Would erasing steps [start, end) of `trace` move a call left after them
// to another lane?
bool relabels(const Trace& trace, std::size_t start, std::size_t end);

// `trace` without each of its lanes in turn (its calls and switches), the
// highest lane first.
std::vector<Trace> fewer_lanes(const Trace& trace);

// `trace` with two neighbouring runs of different lanes swapped where that
// joins runs of one lane: the same calls per lane, fewer context switches.
std::vector<Trace> fewer_switches(const Trace& trace);

}  // namespace kvcheck::shrink_lanes
