// A conformance job's own work, in its child process, and what it tells
// the parent: the search of one (adapter, property) pair for a violation
// (search_property), and the messages that carry what it found across the
// channel ("fail", "other", "blocked", "skipped", "pass", "stats": see
// search_property) with their encoding.
#pragma once

#include "adapters.h"
#include "conformance.h"
#include "kvcheck/search.h"
#include "sandbox.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvcheck::cli {

// A message's text on one line: line breaks become spaces.
std::string one_line(std::string text);

// A failure found by a search, as a "fail" or "other" message carries it.
struct FoundFailure {
    std::size_t cases = 0;         // traces run before it was found
    std::size_t found_length = 0;  // operations of the trace as found, before the shrink
    Failure failure;
    std::string trace;  // the shrunk trace, in the text format
};

std::string encode(const FoundFailure& found);
FoundFailure decode(const std::string& payload);

// A "stats" message: traces run, the workload shapes they held and the
// operations they ran, by kind; decoding adds them to what is already
// counted.
std::string encode_stats(std::size_t cases, const Coverage& coverage);
void decode_stats(const std::string& payload, std::size_t* cases, Coverage* coverage);

// A runner for traces of `adapter` in a job: each trace announced on the
// channel before it runs ("begin"), each operation marked on it, dumps
// under the job's own directory.
Runner runner_for(const Adapter& adapter, PropertySet properties, Channel& out);

// Sends a shrunk finding as a "fail" message.
void send_finding(const Finding& finding, std::size_t cases, Channel& out);

// The search of `property` (index `index` of the run's list) on `adapter`,
// reported on `out`: see the definition for how traces are blamed.
void search_property(const Adapter& adapter, Property property, std::size_t index, const ConformanceOptions& options,
                     Channel& out);

}  // namespace kvcheck::cli
