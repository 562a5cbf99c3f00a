// The name of a signal in kvcheck's messages: "SIGSEGV", or "signal 70"
// for a number that names none. One spelling for every report (a crash
// fault, a killed adapter or dump child, an interrupted run).
#pragma once

#include <cstring>
#include <string>

namespace kvcheck::posix {

inline std::string signal_name(int signal) {
    const char* abbreviation = ::sigabbrev_np(signal);  // glibc: "SEGV", or null
    return abbreviation != nullptr ? std::string("SIG") + abbreviation : "signal " + std::to_string(signal);
}

}  // namespace kvcheck::posix
