// The hang rule (stillness.h) on fake clocks: what a deadlock, a busy loop,
// a multi-threaded engine, a starved engine and a thread stuck in the
// kernel count; what is read of real processes from /proc; and the dump
// children's limit (durability/child.h) following the same rule.
#include "stillness.h"

#include "durability/child.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <iterator>
#include <sched.h>
#include <sys/resource.h>
#include <ctime>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace kvcheck::process {
namespace {

constexpr double limit = 30;
constexpr double poll_seconds = 0.2;

// Samples every poll_seconds from 0 to `wall_seconds`: the CPU used at
// `cpu_per_second` of wall time, the tree `waiting` or not.
Stillness run_for(double wall_seconds, double cpu_per_second, bool waiting) {
    Stillness still;
    still.restart({0, 0, waiting});
    const int polls = static_cast<int>(wall_seconds / poll_seconds + 0.5);
    for (int i = 1; i <= polls; ++i) {
        const double wall = i * poll_seconds;
        still.observe({wall, wall * cpu_per_second, waiting});
    }
    return still;
}

TEST(Stillness, ADeadlockedEngineIsHungAfterTheLimit) {
    // Every thread blocked on a lock: no CPU, never waiting on the machine.
    EXPECT_FALSE(run_for(limit - 1, 0, false).hung(limit));
    EXPECT_TRUE(run_for(limit, 0, false).hung(limit));
}

TEST(Stillness, ABusyLoopIsHungAfterTheLimitOfCpu) {
    EXPECT_FALSE(run_for(limit - 1, 1, true).hung(limit));
    EXPECT_TRUE(run_for(limit, 1, true).hung(limit));
}

TEST(Stillness, ThreadsCountNoFasterThanTheClock) {
    // Four threads busy: 4 s of CPU a second, counted as one.
    const Stillness four = run_for(limit - 1, 4, true);
    EXPECT_NEAR(four.still_seconds(), limit - 1, 1e-9);
    EXPECT_FALSE(four.hung(limit));
    EXPECT_TRUE(run_for(limit, 4, true).hung(limit));
}

TEST(Stillness, AnEngineStarvedByLoadCountsOnlyTheCpuItGot) {
    // The machine loaded to 10 times its cores: a correct engine gets a
    // tenth of a CPU, and an operation of 25 s of CPU takes 250 s.
    const Stillness loaded = run_for(250, 0.1, true);
    EXPECT_NEAR(loaded.still_seconds(), 25, 1e-6);
    EXPECT_NEAR(loaded.silent_seconds(), 250, 1e-6);
    EXPECT_FALSE(loaded.hung(limit));
    // A busy loop starved as much is still caught, by its CPU.
    EXPECT_TRUE(run_for(300, 0.1, true).hung(limit));
}

TEST(Stillness, TimeWaitingOnTheMachineEndsAtTheWallCap) {
    // A thread stuck in the kernel (state D) forever: no CPU, waiting.
    const double cap = hang_wall_factor * limit;
    EXPECT_FALSE(run_for(cap - 1, 0, true).hung(limit));
    EXPECT_TRUE(run_for(cap, 0, true).hung(limit));
}

TEST(Stillness, BlockedAndStarvedTimesAdd) {
    Stillness still;
    still.restart({100, 5, false});
    still.observe({110, 5, false});  // 10 s blocked
    still.observe({210, 6, true});   // 100 s starved, 1 s of CPU
    EXPECT_NEAR(still.still_seconds(), 11, 1e-9);
    EXPECT_NEAR(still.silent_seconds(), 110, 1e-9);
    still.observe({229, 6, false});  // 19 s blocked: 30 in all
    EXPECT_TRUE(still.hung(limit));
}

TEST(Stillness, ProgressStartsTheCountAgain) {
    Stillness still;
    still.restart({0, 0, false});
    still.observe({29, 0, false});
    still.restart({29, 0, false});
    still.observe({58, 0, false});
    EXPECT_FALSE(still.hung(limit));
    EXPECT_NEAR(still.still_seconds(), 29, 1e-9);
}

TEST(Stillness, AProcessThatEndedTakesItsCpuTimeWithIt) {
    // A child that used 50 s of CPU ended: the tree's total drops, and no
    // negative time is counted.
    Stillness still;
    still.restart({0, 60, true});
    still.observe({1, 10, true});
    EXPECT_EQ(still.still_seconds(), 0);
    still.observe({2, 10.5, true});
    EXPECT_NEAR(still.still_seconds(), 0.5, 1e-9);
}

// ---- /proc --------------------------------------------------------------

// The state letter of process `pid` (proc(5)); 0 when it is gone.
char state_of(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t close = text.rfind(')');
    return close == std::string::npos || close + 2 >= text.size() ? 0 : text[close + 2];
}

struct Child {
    pid_t pid = -1;
    ~Child() {
        if (pid <= 0) return;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
};

TEST(ProcessSample, ABlockedProcessIsNotWaitingAndABusyOneIs) {
    Child sleeping;
    sleeping.pid = ::fork();
    if (sleeping.pid == 0) {
        for (;;) ::pause();
    }
    // Until it sleeps: a bound on polls, not on time.
    for (int i = 0; i < 100000 && state_of(sleeping.pid) != 'S'; ++i) ::usleep(100);
    ASSERT_EQ(state_of(sleeping.pid), 'S');
    const ActivitySample blocked = sample_processes({sleeping.pid}, 7);
    EXPECT_EQ(blocked.wall_seconds, 7);
    EXPECT_FALSE(blocked.waiting);
    EXPECT_LT(blocked.cpu_seconds, 1.0);

    Child busy;
    busy.pid = ::fork();
    if (busy.pid == 0) {
        for (volatile unsigned long n = 0;; n = n + 1) {
        }
    }
    ActivitySample spinning;
    for (int i = 0; i < 1000000 && spinning.cpu_seconds < 0.05; ++i) spinning = sample_processes({busy.pid}, 0);
    EXPECT_TRUE(spinning.waiting);  // running or runnable: a busy loop never blocks
    EXPECT_GE(spinning.cpu_seconds, 0.05);
    // Together: the CPU adds up, and one waiting thread makes the tree wait.
    const ActivitySample both = sample_processes({sleeping.pid, busy.pid}, 0);
    EXPECT_TRUE(both.waiting);
    EXPECT_GE(both.cpu_seconds, spinning.cpu_seconds);
}

TEST(ProcessSample, AProcessGoneIsLeftOut) {
    pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    ::waitpid(pid, nullptr, 0);
    const ActivitySample sample = sample_processes({pid}, 0);
    EXPECT_FALSE(sample.waiting);
    EXPECT_EQ(sample.cpu_seconds, 0);
}

TEST(ProcessTree, HoldsTheProcessAndEveryOneBelowIt) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    Child parent;
    parent.pid = ::fork();
    if (parent.pid == 0) {
        ::setpgid(0, 0);
        if (::fork() == 0) {
            for (;;) ::pause();
        }
        const char byte = 1;
        (void)!::write(ready[1], &byte, 1);
        for (;;) ::pause();
    }
    ::setpgid(parent.pid, parent.pid);
    ::close(ready[1]);
    char byte = 0;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);
    const std::vector<int> tree = process_tree(parent.pid);
    ::kill(-parent.pid, SIGKILL);  // the grandchild too, when the test is done
    ASSERT_EQ(tree.size(), 2U);
    EXPECT_EQ(tree[0], parent.pid);
    EXPECT_NE(tree[1], parent.pid);
}

double cpu_seconds() {
    timespec now{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) / 1e9;
}

void on_first_cpu() {
    cpu_set_t first;
    CPU_ZERO(&first);
    CPU_SET(0, &first);
    ::sched_setaffinity(0, sizeof first, &first);
}

TEST(ChildLimit, ABlockedChildIsHungAfterItsLimit) {
    const durability::ChildEnd end = durability::run_child([](int) { ::sleep(60); }, 0.5);
    EXPECT_TRUE(end.hung);
    ASSERT_TRUE(WIFSIGNALED(end.status));
    EXPECT_EQ(WTERMSIG(end.status), SIGKILL);
}

TEST(ChildLimit, AChildStarvedOfTheCpuIsNotHung) {
    // A busy loop and the child (niced) share one CPU: the child's 0.15 s of
    // CPU take over a second of wall time, silent; a limit of 1 s of
    // wall time called it hung (the rule before), its CPU is far under it.
    Child hog;
    hog.pid = ::fork();
    if (hog.pid == 0) {
        on_first_cpu();
        for (;;) {
        }
    }
    const durability::ChildEnd end = durability::run_child(
        [](int) {
            on_first_cpu();
            (void)!::nice(10);
            const double start = cpu_seconds();
            volatile unsigned spin = 0;
            while (cpu_seconds() - start < 0.15) spin = spin + 1;
        },
        1.0);
    EXPECT_FALSE(end.hung);
    ASSERT_TRUE(WIFEXITED(end.status));
    EXPECT_EQ(WEXITSTATUS(end.status), 0);
}

}  // namespace
}  // namespace kvcheck::process
