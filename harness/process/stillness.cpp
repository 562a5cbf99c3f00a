#include "stillness.h"

#include "proc_file.h"

#include <algorithm>
#include <cstdio>
#include <dirent.h>
#include <sstream>
#include <string>
#include <unistd.h>

namespace kvcheck::process {

void Stillness::restart(const ActivitySample& sample) {
    last_ = sample;
    since_ = sample.wall_seconds;
    still_ = 0;
}

void Stillness::observe(const ActivitySample& sample) {
    const double wall = std::max(0.0, sample.wall_seconds - last_.wall_seconds);
    // A process that ended since takes its CPU time with it: none counted.
    const double cpu = std::max(0.0, sample.cpu_seconds - last_.cpu_seconds);
    still_ += sample.waiting ? std::min(cpu, wall) : wall;
    last_ = sample;
}

bool Stillness::hung(double limit_seconds) const {
    return still_ >= limit_seconds || silent_seconds() >= hang_wall_factor * limit_seconds;
}

namespace {

// The text after the ")" that ends the command name of a /proc stat file
// (a name may hold spaces and parentheses); "" when it cannot be read.
std::string stat_fields(const std::string& path) {
    const std::string text = posix::read_proc_file(path);
    const std::size_t close = text.rfind(')');
    return close == std::string::npos ? "" : text.substr(close + 1);
}

// Whether any thread of process `pid` waits on the machine (R or D).
bool any_thread_waiting(const std::string& pid) {
    const std::string tasks = "/proc/" + pid + "/task";
    DIR* dir = ::opendir(tasks.c_str());
    if (dir == nullptr) return false;
    bool waiting = false;
    while (const dirent* entry = ::readdir(dir)) {
        if (entry->d_name[0] == '.') continue;
        const std::string fields = stat_fields(tasks + "/" + entry->d_name + "/stat");
        char state = 0;
        if (std::sscanf(fields.c_str(), " %c", &state) == 1 && (state == 'R' || state == 'D')) {
            waiting = true;
            break;
        }
    }
    ::closedir(dir);
    return waiting;
}

}  // namespace

ActivitySample sample_processes(const std::vector<int>& pids, double now_seconds) {
    static const double ticks_per_second = static_cast<double>(::sysconf(_SC_CLK_TCK));
    ActivitySample sample;
    sample.wall_seconds = now_seconds;
    for (const int pid : pids) {
        const std::string id = std::to_string(pid);
        const std::string fields = stat_fields("/proc/" + id + "/stat");
        // state, then 10 fields, then utime and stime (proc(5): fields 3, 14 and 15).
        char state = 0;
        unsigned long long user = 0;
        unsigned long long system = 0;
        if (std::sscanf(fields.c_str(), " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &state, &user, &system) != 3) {
            continue;  // gone
        }
        if (state == 'Z' || state == 'X') continue;
        sample.cpu_seconds += static_cast<double>(user + system) / ticks_per_second;
        sample.waiting = sample.waiting || any_thread_waiting(id);
    }
    return sample;
}

namespace {

void add_below(int pid, std::vector<int>& found, int depth) {
    if (depth >= 64) return;
    const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
    DIR* dir = ::opendir(tasks.c_str());
    if (dir == nullptr) return;
    while (const dirent* entry = ::readdir(dir)) {
        if (entry->d_name[0] == '.') continue;
        std::istringstream children(posix::read_proc_file(tasks + "/" + entry->d_name + "/children"));
        int child = 0;
        while (children >> child) {
            found.push_back(child);
            add_below(child, found, depth + 1);
        }
    }
    ::closedir(dir);
}

}  // namespace

std::vector<int> process_tree(int pid) {
    std::vector<int> found{pid};
    add_below(pid, found, 0);
    return found;
}

}  // namespace kvcheck::process
