// Reports of a conformance run: a human table (property x adapter), JSON,
// JUnit XML (so CI systems show it natively) and Markdown.
#pragma once

#include "conformance.h"

#include <string>
#include <vector>

namespace kvcheck::cli {

enum class ReportFormat { table, json, junit, markdown };

// Throws UsageError for an unknown name.
ReportFormat parse_report_format(const std::string& name);

// How often each shape of interest occurred in the traces run, per adapter
// and in all (kvcheck run --stats).
std::string render_stats(const std::vector<AdapterResult>& results);

std::string render_report(const std::vector<AdapterResult>& results, ReportFormat format, std::uint64_t seed);

}  // namespace kvcheck::cli
