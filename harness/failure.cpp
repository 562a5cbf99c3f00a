// A failure in the one format used everywhere (kvcheck/executor.h).
#include "kvcheck/executor.h"

#include <sstream>

namespace kvcheck {

std::string format_failure(const Failure& failure, const Trace& trace, const std::string& reproduce) {
    std::ostringstream out;
    const std::string op = failure.step < trace.size() ? op_name(trace[failure.step]) : "?";
    out << "ERROR: " << failure.property << ": " << failure.message << " at step " << failure.step + 1 << " (" << op << ")\n";
    for (const std::string& other : failure.also) out << "also: " << other << "\n";
    for (std::size_t i = 0; i < trace.size(); ++i) {
        out << format_op(trace[i]) << (i == failure.step ? "  # <- " + failure.property : std::string()) << "\n";
    }
    out << "SUMMARY: kvcheck: " << failure.property << " violated after " << failure.step + 1 << " operation"
        << (failure.step == 0 ? "" : "s") << "\n";
    out << "reproduce: " << reproduce << "\n";
    return out.str();
}

}  // namespace kvcheck
