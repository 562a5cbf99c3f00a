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

std::string render_report(const std::vector<AdapterResult>& results, ReportFormat format, std::uint64_t seed);

}  // namespace kvcheck::cli
