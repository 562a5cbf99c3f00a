// Reports of a conformance run: a human table (property x adapter), JSON,
// JUnit XML (so CI systems show it natively), Markdown and HTML (report_html.h). Each is valid
// whatever the engines said or printed (text.h escapes it for the format),
// and says when the run was interrupted before it finished.
//
// The JSON report is one object of one shape for any number of adapters:
//   {"format": "kvcheck-report", "format_version": 2, "kvcheck_version": "0.1.0",
//    "seed": 20261202, "complete": true, "interrupted_by": null,
//    "summary": {"adapters": 1, "properties": 9, "pass": 8, "fail": 1, "fault": 0,
//                "skipped": 0, "not_run": 0, "blocked": 0, "all_pass": false},
//    "adapters": [{"adapter": "M3", "source": "bundled", "seed": 20261202,
//                  "summary": {...}, "properties": [{"id": "single-copy", "verdict": "fail", ...}]}]}
// A property's verdict is "pass", "fail" (a violation, or a fault: then
// "fault" says which), "skipped", "blocked" or "not-run"; summary "fail"
// counts the violations and "fault" the faults. "all_pass" is true only
// when every property finished and none failed: none not run (an
// interrupted run) nor blocked; a skipped property does not count against
// it. A property's "not_applied" is null, or says which of its checks
// could not be applied to the engine and why ("kill/power-cut: not
// applied, because ..." on dump-safe for an adapter process): a pass
// then holds without them (the table shows "pass*").
#pragma once

#include "conformance.h"

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace kvcheck::cli {

enum class ReportFormat { table, json, junit, markdown, html };  // html: report_html.h

// The version of the JSON report's shape: 1 was an object for one adapter
// and an array for several, with no summary.
inline constexpr int report_format_version = 2;

// Throws UsageError for an unknown name.
ReportFormat parse_report_format(const std::string& name);

// How often each shape of interest occurred in the traces run, per adapter
// and in all (kvcheck run --stats).
std::string render_stats(const std::vector<AdapterResult>& results);

// "N properties left out, n/a WHOM: how many of the other cache family,
// how many judging a capacity none declares", of `rows` (each n/a: its
// message says why); "" for none. The text and markdown tables and
// `kvcheck list --adapter` say it.
std::string not_applicable_note(const std::vector<PropertyResult>& rows, const std::string& whom);

// What an engine printed, fit for a terminal: the last `lines_max` lines of
// its stderr (`captured`, what the sandbox kept of it) and of an
// out-of-process engine's own last output (Adapter::take_output), escaped
// by last_lines (text.h: no raw NUL, ESC or OSC sequence reaches the
// terminal), each under a heading; "" when it printed nothing. The one way
// engine text reaches kvcheck's own output: the table's details, replay and
// shrink.
std::string engine_output_text(const std::array<CapturedOutput, 2>& captured, const std::string& output,
                               std::size_t lines_max);

// `interrupted_by`: the signal that stopped the run early, 0 when it ran to
// its end.
std::string render_report(const std::vector<AdapterResult>& results, ReportFormat format, std::uint64_t seed,
                          int interrupted_by = 0);

}  // namespace kvcheck::cli
