// Small helpers shared by the benchmarks: a monotonic clock and medians.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include <sys/resource.h>
#include <time.h>

namespace kvbench {

inline double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of this process (all threads, user and system): unlike the wall
// clock, not inflated when other processes load a shared machine.
inline double cpu_seconds() {
    timespec now{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// Minor page faults of this process so far: each is a fresh page the
// kernel had to map (and zero) on first touch.
inline long minor_faults() {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    return usage.ru_minflt;
}

// Samples of one quantity; the median is robust to the odd iteration the
// other processes on a shared machine slow down.
class Samples {
  public:
    void add(double value) { values_.push_back(value); }
    std::size_t size() const { return values_.size(); }
    double median() const {
        if (values_.empty()) return 0;
        std::vector<double> sorted = values_;
        std::sort(sorted.begin(), sorted.end());
        const std::size_t n = sorted.size();
        return n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    }
    double max() const { return values_.empty() ? 0 : *std::max_element(values_.begin(), values_.end()); }
    double min() const { return values_.empty() ? 0 : *std::min_element(values_.begin(), values_.end()); }

  private:
    std::vector<double> values_;
};

}  // namespace kvbench
