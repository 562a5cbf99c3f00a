// The name of a signal in kvcheck's messages: "SIGSEGV", or "signal 70"
// for a number that names none. One spelling for every report (a crash
// fault, a killed adapter or dump child, an interrupted run).
#pragma once

#include <cstring>
#include <string>

#include <sys/wait.h>

namespace kvcheck::posix {

inline std::string signal_name(int signal) {
    const char* abbreviation = ::sigabbrev_np(signal);  // glibc: "SEGV", or null
    return abbreviation != nullptr ? std::string("SIG") + abbreviation : "signal " + std::to_string(signal);
}

// A wait status in words: "exit status 3", "killed by SIGSEGV", "stopped by
// SIGSTOP", or the number for one that is none of these (an adapter's
// reply may carry any number; WEXITSTATUS of a stopped status is its
// signal, which read as an exit status misleads).
inline std::string wait_status_text(int status) {
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return "killed by " + signal_name(WTERMSIG(status));
    if (WIFSTOPPED(status)) return "stopped by " + signal_name(WSTOPSIG(status));
    return "wait status " + std::to_string(status) + ", neither an exit nor a signal";
}

}  // namespace kvcheck::posix
