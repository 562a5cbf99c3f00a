// The kvcheck command line on hostile input (issue 17): plugins that crash,
// exit or print while loading or running; engine text that no report format
// can carry raw; traces that are long, empty, not files or garbage; limits
// that make no sense; output paths that cannot be written; a Ctrl-C in the
// middle of a run; and dumps to check. Issue 28 added FIFOs given as
// files, standard output on a full device, engine text in replay and
// shrink, timeouts too short to mean anything and the summary of an
// interrupted run. Each test but one fails (or hangs) on the kvcheck
// before the fix it covers (the probes of the issues);
// AFailureInALongTraceIsPinnedToItsStep guards the bisection that replaced
// the quadratic replay.
#include "cli_util.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace kvtest::cli;
namespace fs = std::filesystem;

// Is `text` valid by `checker` (a command reading the file named last)?
// Skipped (true) when the checker is not installed.
bool valid_by(const std::string& checker, const std::string& text, std::string* why) {
    const std::string file = scratch("to-validate");
    write_file(file, text);
    const std::string errors = scratch("validator-errors");
    const int status = std::system((checker + " " + file + " > /dev/null 2> " + errors).c_str());
    *why = read_file(errors);
    fs::remove(file);
    fs::remove(errors);
    return status == 0;
}

// ---- plugins that misbehave -------------------------------------------------------

// A plugin's static constructor or entry point runs in a child first: a
// crash or an exit there is exit 2 and a message, never kvcheck's death by
// SIGSEGV (139) nor a silent exit 0 (a false pass in CI).
TEST_F(Cli, APluginThatCrashesOrExitsWhileLoadingIsAnError) {
    const Outcome segv = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_LOAD_SEGV + " --cases 5");
    EXPECT_EQ(segv.status, 2) << segv.out;
    EXPECT_TRUE(contains(segv.stderr_text, "crashed (SIGSEGV) while being loaded")) << segv.out;
    const Outcome exits = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_LOAD_EXIT + " --cases 5");
    EXPECT_EQ(exits.status, 2) << exits.out;
    EXPECT_TRUE(contains(exits.stderr_text, "exited (exit status 0 before its work was done) while being loaded")) << exits.out;
    const std::string trace = scratch("three-adds.trace");
    write_file(trace, adds(3));
    const Outcome replay = kvcheck("replay " + trace + " --adapter " + KVCHECK_FAULT_LOAD_EXIT);
    EXPECT_EQ(replay.status, 2) << replay.out;
    EXPECT_TRUE(contains(replay.stderr_text, "while being loaded")) << replay.out;
}

// An engine that calls exit(0) in mid-run is a fault, not a pass.
TEST_F(Cli, AnEngineThatExitsIsAFaultAtItsStep) {
    const Outcome run = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_EXIT +
                                " --property store-contract --cases 10 --quiet --trace-dir " + scratch("exit-traces"));
    EXPECT_EQ(run.status, 1) << run.out;
    EXPECT_TRUE(contains(run.stdout_text, "store-contract  FAULT")) << run.out;
    EXPECT_TRUE(contains(run.stdout_text, "the engine exited (exit status 0 before its work was done) at step 3 (add)"))
        << run.out;
    // The traces of a job that died count (it never sent its count).
    EXPECT_GE(number_before(run.stderr_text, " distinct traces run "), 1u) << run.stderr_text;
}

// The memory limit is also a hard address-space limit: what the polls of
// resident memory cannot see (an allocation never touched; a leak faster
// than a poll) still stops at it, as a memory fault.
TEST_F(Cli, TheAddressSpaceLimitBacksTheMemoryLimit) {
#if defined(__SANITIZE_ADDRESS__)  // g++
    GTEST_SKIP() << "ASan reserves terabytes of address space: kvcheck sets no address-space limit under it";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang
    GTEST_SKIP() << "ASan reserves terabytes of address space: kvcheck sets no address-space limit under it";
#endif
#endif
    const Outcome run = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_RESERVE +
                                " --property store-contract --cases 10 --memory-mb 1536 --quiet --trace-dir " + scratch("reserve-traces"));
    EXPECT_EQ(run.status, 1) << run.out;
    EXPECT_TRUE(contains(run.stdout_text, "memory limit (an allocation failed at the address-space limit that backs the memory "
                                          "limit of 1536 MiB) at step 3 (add)"))
        << run.out;
}

// While one fault is shrunk (its candidates run one by one), the other
// children are still polled: a leaking one is stopped at the limit, not
// left to grow (10 GiB under a 4 GiB limit, an OOM kill on a small CI
// runner). Here the leak of one property is shrunk (each candidate fills
// the limit in a process of its own) while the next property's child leaks.
// The peak resident size of the whole process tree stays within the
// address-space bound of the limit (sandbox.cpp: twice the limit and a GiB
// beyond the start); under ASan, with no address-space limit, the polls
// alone keep it far lower.
TEST_F(Cli, MemoryStaysBoundedWhileAFaultIsShrunk) {
    const std::string peak_file = scratch("peak");
    const pid_t child = ::fork();
    if (child == 0) {
        // A process of its own, so that RUSAGE_CHILDREN covers this run
        // only: kvcheck, its children and their shrink candidates.
        const Outcome run = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_LEAK +
                                    " --property stored-immutable --property store-contract --property owned-marker --jobs 2 "
                                    "--cases 200 --memory-mb 512 --quiet --report json --trace-dir " + scratch("peak-traces"));
        struct rusage usage {};
        ::getrusage(RUSAGE_CHILDREN, &usage);
        write_file(peak_file, std::to_string(usage.ru_maxrss / 1024) + " " + std::to_string(run.status) + "\n" + run.out);
        ::_exit(0);
    }
    ::waitpid(child, nullptr, 0);
    const std::string result = read_file(peak_file);
    long long peak_mib = 0;
    int status = -1;
    std::sscanf(result.c_str(), "%lld %d", &peak_mib, &status);
    EXPECT_EQ(status, 1) << result;
    EXPECT_TRUE(contains(result, "\"summary\": {\"adapters\": 1, \"properties\": 5, \"pass\": 2, \"fail\": 0, \"fault\": 3"))
        << "every property: a memory fault (engine-error and shared-state, the last rows, pass)\n" << result;
    EXPECT_LE(peak_mib, 2 * 512 + 1024 + 512) << "MiB at the peak\n" << result;
}

// ---- reports --------------------------------------------------------------------

// An engine that prints to both streams and throws text with control bytes,
// an ANSI escape and invalid UTF-8: the JSON on standard output parses, the
// JUnit file is well-formed XML, the table holds no raw control byte, and
// the engine's output is in the report, apart from kvcheck's.
TEST_F(Cli, ReportsStayValidWhateverTheEnginePrintsOrSays) {
    // One search, its report in four formats (--also-report).
    const std::string junit_file = scratch("noisy.xml"), table_file = scratch("noisy.txt"), markdown_file = scratch("noisy.md");
    const Outcome json = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_NOISY + " --property store-contract --cases 5 " +
                                 "--quiet --trace-dir " + scratch("noisy-traces") + " --report json --also-report junit=" + junit_file +
                                 " --also-report table=" + table_file + " --also-report markdown=" + markdown_file);
    EXPECT_EQ(json.status, 1) << json.out;
    EXPECT_EQ(json.stdout_text.rfind("{\"format\": \"kvcheck-report\", \"format_version\": 2", 0), 0u) << json.stdout_text;
    EXPECT_FALSE(contains(json.stdout_text, "{\"noise\"")) << "the engine's stdout went into the report";
    EXPECT_TRUE(contains(json.stdout_text, "\"engine_output\": {\"stdout\": \"")) << json.stdout_text;
    EXPECT_TRUE(contains(json.stdout_text, "{\\\"noise\\\": \\\"stdout\\\"} ]}")) << json.stdout_text;
    EXPECT_TRUE(contains(json.stdout_text, "\\u0001\\u0002\\u0007\\u0008\\u000b\\u000c\\u001b[31mred")) << json.stdout_text;
    EXPECT_TRUE(contains(json.stdout_text, "\\\\xff\\\\xfe \\\\x80 \\\\xed\\\\xa0\\\\x80 end")) << json.stdout_text;
    std::string why;
    if (have("/usr/bin/python3")) {
        EXPECT_TRUE(valid_by("/usr/bin/python3 -m json.tool", json.stdout_text, &why)) << why;
    }
    const std::string junit = read_file(junit_file);
    EXPECT_TRUE(contains(junit, "<system-err>")) << junit;
    EXPECT_TRUE(contains(junit, "noise on stderr: &quot;quoted&quot; &lt;tag")) << junit;
    if (have("xmllint")) {
        EXPECT_TRUE(valid_by("xmllint --noout", junit, &why)) << why << junit;
    }
    EXPECT_EQ(json.stderr_text.find('\x1b'), std::string::npos) << "a raw escape reached the terminal";
    EXPECT_EQ(json.stderr_text.find('\x01'), std::string::npos);
    for (const auto& [format, file] : {std::pair{"table", table_file}, std::pair{"markdown", markdown_file}}) {
        const std::string text = read_file(file);
        EXPECT_EQ(text.find('\x1b'), std::string::npos) << format << ": a raw escape reached the terminal";
        EXPECT_EQ(text.find('\x01'), std::string::npos) << format;
        EXPECT_TRUE(contains(text, "x1b")) << format << ": the escape is shown as text\n" << text;
    }
}

// One JSON shape for one adapter or several, with a version and a summary.
TEST_F(Cli, TheJsonReportHasOneShapeWithAVersionAndASummary) {
    const std::string traces = " --quiet --report json --trace-dir " + scratch("shape-traces");
    const Outcome one = kvcheck("run --adapter reference --property store-contract --cases 3" + traces);
    const Outcome two = kvcheck("run --adapter reference --adapter M3 --property single-copy --cases 30" + traces);
    for (const Outcome* run : {&one, &two}) {
        EXPECT_EQ(run->stdout_text.rfind("{\"format\": \"kvcheck-report\", \"format_version\": 2, \"kvcheck_version\": ", 0), 0u)
            << run->stdout_text;
        EXPECT_TRUE(contains(run->stdout_text, "\"complete\": true, \"interrupted_by\": null")) << run->stdout_text;
        EXPECT_TRUE(contains(run->stdout_text, "\"adapters\": [\n")) << run->stdout_text;
    }
    EXPECT_TRUE(contains(one.stdout_text, "\"summary\": {\"adapters\": 1, \"properties\": 3, \"pass\": 3, \"fail\": 0")) << one.stdout_text;
    EXPECT_TRUE(contains(two.stdout_text, "\"summary\": {\"adapters\": 2, \"properties\": 6, \"pass\": 5, \"fail\": 1")) << two.stdout_text;
}

// Columns as wide as the adapters' names; seconds printed plainly; Markdown
// details as list items, not one run-on paragraph.
TEST_F(Cli, TablesAlignAndMarkdownKeepsItsLines) {
    const Outcome run = kvcheck(std::string("run --adapter reference --adapter ") + KVCHECK_FAULT_THROW +
                                " --property store-contract --seconds 1 --trace-dir " + scratch("align-traces"));
    const std::string& table = run.stdout_text;
    const std::size_t header = table.find("property ");
    ASSERT_NE(header, std::string::npos) << table;
    const std::string header_line = table.substr(header, table.find('\n', header) - header);
    // The throwing engine's failure counts under engine-error.
    const std::size_t row = table.find("engine-error ");
    const std::string row_line = table.substr(row, table.find('\n', row) - row);
    EXPECT_EQ(header_line.find("kvcheck-fault-throw"), row_line.find("FAIL")) << header_line << "\n" << row_line;
    EXPECT_EQ(header_line.find("reference"), row_line.find("pass")) << header_line << "\n" << row_line;
    EXPECT_TRUE(contains(run.stderr_text, "seed 20261202, 1 s per property")) << run.stderr_text;
    const Outcome markdown = kvcheck("run --adapter M3 --property single-copy --cases 30 --quiet --report markdown --trace-dir " +
                                     scratch("md-traces"));
    EXPECT_TRUE(contains(markdown.stdout_text, "\n\n- **ERROR**: single-copy: ")) << markdown.stdout_text;
    EXPECT_TRUE(contains(markdown.stdout_text, "\n- reproduce: `kvcheck replay ")) << markdown.stdout_text;
}

// ---- traces ---------------------------------------------------------------------

// `shrink T --adapter A > short.trace`: the trace alone on stdout (it
// replays), the report on stderr.
TEST_F(Cli, AShrunkTraceOnStandardOutputReplays) {
    const std::string path = scratch("m3-long.trace");
    write_file(path, "add a modern/f32/1:[kv3 kv2]\nadd b legacy/f32/2:[kv1]\nget_all\nh1 = get a\n"
                     "h2 = get_cache a\ndelete c\nh3 = make modern/f32/3:[kv2]\ngenerate h2 prompt=4,5 max=3\n");
    const Outcome shrink = kvcheck("shrink " + path + " --adapter M3");
    EXPECT_EQ(shrink.status, 1) << shrink.out;
    EXPECT_TRUE(contains(shrink.stderr_text, "ERROR: single-copy:")) << shrink.stderr_text;
    EXPECT_FALSE(contains(shrink.stdout_text, "ERROR")) << shrink.stdout_text;
    const std::string short_trace = scratch("m3-short.trace");
    write_file(short_trace, shrink.stdout_text);
    const Outcome replay = kvcheck("replay " + short_trace + " --adapter M3");
    EXPECT_EQ(replay.status, 1) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, "ERROR: single-copy:")) << replay.out;
}

// The silence limit is per operation, and a replay reads everything only to
// pin a failure: 10,000 valid adds are no hang (they were "hung at step
// 10000" with the whole replay under one 30 s limit, reading every entry
// after every step).
TEST_F(Cli, ALongValidReplayIsNoHang) {
    const std::string path = scratch("adds.trace");
    write_file(path, adds(10000));
    const Outcome replay = kvcheck("replay " + path + " --adapter reference --timeout 20");
    EXPECT_EQ(replay.status, 0) << replay.out.substr(0, 2000);
    EXPECT_TRUE(contains(replay.stdout_text, "10000 operations, every property holds on reference")) << replay.out.substr(0, 2000);
}

// A failure deep in a long trace is pinned to its step (by bisection: the
// trace is too long to read everything after every step).
TEST_F(Cli, AFailureInALongTraceIsPinnedToItsStep) {
    const std::string path = scratch("deep.trace");
    write_file(path, adds(1000) + "h1 = get_cache a7\ngenerate h1 prompt=1 max=1\n" + adds(500, 1000));
    const Outcome replay = kvcheck("replay " + path + " --adapter M3");
    EXPECT_EQ(replay.status, 1) << replay.out.substr(0, 2000);
    EXPECT_TRUE(contains(replay.stdout_text, "ERROR: single-copy: generate from h1 made 1 copies of the K/V, expected 0 at step 1002 (generate)"))
        << replay.stdout_text.substr(0, 2000);
}

// A crash is pinned on the operation that crashed (the third add), in a
// replay and in the shrunk trace, not on the trace's last operation.
TEST_F(Cli, ACrashIsPinnedToTheOperationThatCrashed) {
    const std::string path = scratch("five-adds.trace");
    write_file(path, adds(5));
    const Outcome replay = kvcheck(std::string("replay ") + path + " --adapter " + KVCHECK_FAULT_SEGV);
    EXPECT_EQ(replay.status, 1) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, " at step 3 (add)\n")) << replay.out;
    const Outcome shrink = kvcheck(std::string("shrink ") + path + " --adapter " + KVCHECK_FAULT_SEGV + " --out " +
                                   scratch("s.trace") + " --progress-seconds 0");
    EXPECT_EQ(shrink.status, 1) << shrink.out;
    EXPECT_TRUE(contains(shrink.stdout_text, " at step 3 (add)\n")) << shrink.out;
    EXPECT_FALSE(contains(shrink.stdout_text, "(?)")) << shrink.out;
    EXPECT_TRUE(contains(shrink.stderr_text, "kvcheck: shrinking the fault (crash) of kvcheck-fault-segv: 2 candidate traces run, "
                                             "the shortest failing one "))
        << shrink.stderr_text;
}

// A hang during a replay: progress lines while it lasts, the step it hung at.
TEST_F(Cli, ALongReplayShowsProgressAndAHangItsStep) {
    const std::string path = scratch("hang.trace");
    write_file(path, adds(5));
    const Outcome replay = kvcheck(std::string("replay ") + path + " --adapter " + KVCHECK_FAULT_HANG + " --timeout 12");
    EXPECT_EQ(replay.status, 1) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, "ERROR: fault:hang: no progress for 12 s at step 3 (add)")) << replay.out;
    EXPECT_TRUE(contains(replay.stderr_text, "kvcheck replay: ")) << replay.stderr_text;
    EXPECT_TRUE(contains(replay.stderr_text, " s: step 3 of 5\n")) << replay.stderr_text;
}

TEST_F(Cli, AnEmptyOrAllSkippedTraceWarnsThatNothingWasChecked) {
    const std::string empty = scratch("empty.trace");
    write_file(empty, "# nothing but a comment\n");
    const Outcome none = kvcheck("replay " + empty + " --adapter reference");
    EXPECT_EQ(none.status, 0) << none.out;
    EXPECT_TRUE(contains(none.stderr_text, "warning: " + empty + " holds no operations: nothing was checked")) << none.out;
    const std::string dangling = scratch("dangling.trace");
    write_file(dangling, "generate h7 prompt=1 max=1\nh2 = clone h9\n");
    const Outcome skipped = kvcheck("replay " + dangling + " --adapter reference");
    EXPECT_EQ(skipped.status, 0) << skipped.out;
    EXPECT_TRUE(contains(skipped.stderr_text, "warning: every one of the 2 operations was skipped")) << skipped.out;
    const std::string real = scratch("real.trace");
    write_file(real, adds(2));
    const Outcome checked = kvcheck("replay " + real + " --adapter reference");
    EXPECT_FALSE(contains(checked.stderr_text, "warning")) << checked.out;
    // A file of 0 bytes (what a write cut short by a full disk left; issue
    // 43, D17) is refused, not replayed as "every property holds", exit 0.
    const std::string zero = scratch("zero-bytes.trace");
    write_file(zero, "");
    const Outcome refused = kvcheck("replay " + zero + " --adapter reference");
    EXPECT_EQ(refused.status, 2) << refused.out;
    EXPECT_TRUE(contains(refused.stderr_text, "trace file " + zero + " is empty (0 bytes)")) << refused.out;
}

TEST_F(Cli, TraceFilesThatAreNoTracesAreErrors) {
    const Outcome directory = kvcheck("replay " + kvcheck_tmp() + " --adapter reference");
    EXPECT_EQ(directory.status, 2) << directory.out;
    EXPECT_TRUE(contains(directory.stderr_text, "trace file " + kvcheck_tmp() + " is a directory, not a regular file"))
        << directory.out;
    const Outcome zeros = kvcheck("shrink /dev/zero --adapter reference");
    EXPECT_EQ(zeros.status, 2) << zeros.out;
    EXPECT_TRUE(contains(zeros.stderr_text, "trace file /dev/zero is a character device, not a regular file")) << zeros.out;
    // A file over the bound (sparse: no 64 MiB written) is refused unread.
    const std::string huge = scratch("huge.trace");
    write_file(huge, "");
    fs::resize_file(huge, (std::uintmax_t{64} << 20) + 1);
    const Outcome big = kvcheck("replay " + huge + " --adapter reference");
    EXPECT_EQ(big.status, 2) << big.out;
    EXPECT_TRUE(contains(big.stderr_text, "holds more than the 64 MiB a trace file may hold")) << big.out;
    fs::remove(huge);
    // Garbage, on a line of 3 MB: named, escaped and cut short.
    const std::string garbage = scratch("garbage.trace");
    write_file(garbage, "add a modern/f32/1:[kv1]\n\x1b[2J\x1b[31mgarbage\x07\xff\xfe" + std::string(3000000, 'x') + "\n");
    const Outcome bad = kvcheck("replay " + garbage + " --adapter reference");
    EXPECT_EQ(bad.status, 2) << bad.out.substr(0, 500);
    EXPECT_LT(bad.out.size(), 1000u) << "the whole line was echoed";
    EXPECT_EQ(bad.out.find('\x1b'), std::string::npos) << bad.out.substr(0, 500);
    EXPECT_TRUE(contains(bad.stderr_text, "line 2: unknown operation '\\x1b[2J\\x1b[31mgarbage\\x07\\xff\\xfexxx")) << bad.out.substr(0, 500);
}

// A FIFO is no trace file nor dump (issue 28, item 9): refused at once, exit
// 2, where open() for reading blocked forever waiting for a writer.
TEST_F(Cli, AFifoIsRefusedNotWaitedOn) {
    const std::string fifo = scratch("a-fifo");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
    for (const char* command : {"replay", "shrink"}) {
        const Outcome refused = kvcheck(std::string(command) + " " + fifo + " --adapter reference");
        EXPECT_EQ(refused.status, 2) << command << ": " << refused.out;
        EXPECT_TRUE(contains(refused.stderr_text, "trace file " + fifo + " is a FIFO, not a regular file")) << refused.out;
    }
    const Outcome dump = kvcheck("check-dump " + fifo);
    EXPECT_EQ(dump.status, 2) << dump.out;
    EXPECT_TRUE(contains(dump.stdout_text, "UNREADABLE: the file is a FIFO, not a regular file")) << dump.out;
    // The dump of a directory, a FIFO in its place.
    const std::string dir = scratch("fifo-dump-dir");
    fs::create_directories(dir);
    ASSERT_EQ(::mkfifo((dir + "/kvcheck-store.pt").c_str(), 0600), 0) << std::strerror(errno);
    const Outcome in_dir = kvcheck("check-dump --json " + dir);
    EXPECT_EQ(in_dir.status, 2) << in_dir.out;
    EXPECT_TRUE(contains(in_dir.stdout_text, "\"valid\": null, \"error\": \"the file is a FIFO, not a regular file\""))
        << in_dir.out;
    fs::remove(fifo);
    fs::remove_all(dir);
}

// What an engine prints reaches the terminal escaped by replay and shrink
// as by run (issue 28, item 4): no raw NUL, escape sequence or window
// title. An exec: adapter (stdlib Python, no torch) prints such lines on
// both streams, then exits at the first operation.
TEST_F(Cli, ReplayAndShrinkEscapeWhatTheEnginePrints) {
    if (!have("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const std::string adapter = "--adapter exec:'/usr/bin/python3 " KVCHECK_SOURCE_DIR
                                "/python/adapter_tests/fault_adapter.py --fault exit --noise 2 --escapes'";
    const std::string trace = scratch("noisy.trace");
    write_file(trace, adds(3));
    const std::string shrunk = scratch("noisy-short.trace");
    for (const std::string& command : {"replay " + trace, "shrink " + trace + " --out " + shrunk}) {
        const Outcome noisy = kvcheck(command + " " + adapter);
        EXPECT_EQ(noisy.status, 1) << command << ": " << noisy.out;
        EXPECT_TRUE(contains(noisy.stderr_text, "noise line 1 on stderr\\x00\\x1b[2J\\x1b]0;pwned\\x07")) << noisy.out;
        for (const char raw : {'\0', '\x1b', '\x07'}) {
            EXPECT_EQ(noisy.out.find(raw), std::string::npos) << command << ": byte " << int(raw) << " raw in\n" << noisy.out;
        }
    }
    fs::remove(trace);
    fs::remove(shrunk);
}

// ---- fault diagnostics (issue 28, item 11) ------------------------------------------

// An adapter that closes its reply pipe and goes on running is killed by
// kvcheck, and that SIGKILL is kvcheck's own: the fault says what the
// adapter did (a protocol fault), not "killed by SIGKILL".
TEST_F(Cli, AnAdapterThatClosesItsReplyPipeIsNotReportedAsKilled) {
    if (!have("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const std::string trace = scratch("one-add.trace");
    write_file(trace, adds(1));
    const Outcome replay = kvcheck("replay " + trace + " " + fault_adapter("close-reply"));
    EXPECT_EQ(replay.status, 1) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, "fault:protocol: the adapter process ")) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, "closed its reply pipe before answering a request but went on running "
                                             "(kvcheck killed it 2 s later) at step 1 (add)"))
        << replay.out;
    EXPECT_FALSE(contains(replay.out, "SIGKILL")) << replay.out;
    fs::remove(trace);
}

// An allocation the address-space limit refused (Python's MemoryError) is
// the memory fault docs/protocol.md promises, not the step's engine error.
TEST_F(Cli, AnAllocationRefusedAtTheLimitIsAMemoryFault) {
    if (!have("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const std::string trace = scratch("one-add.trace");
    write_file(trace, adds(1));
    const Outcome replay = kvcheck("replay " + trace + " " + fault_adapter("memory-error"));
    EXPECT_EQ(replay.status, 1) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, "fault:memory: an allocation failed in the adapter process, ")) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, "the adapter raised MemoryError")) << replay.out;
    EXPECT_FALSE(contains(replay.stdout_text, "engine-error")) << replay.out;
    fs::remove(trace);
}

// A plugin that exits while its third engine is made (the search's probe
// and one trace ran in that process), or in the destructor of an engine
// after its trace's last step: the fault says so, and is not pinned on the
// trace's first step (run names no step; replay names the last).
TEST_F(Cli, AnExitWhileAnEngineIsMadeOrDestroyedIsPinnedOnNoStep) {
    const Outcome create = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_EXIT_CREATE +
                                   " --property store-contract --cases 3 --quiet --trace-dir " + scratch("create-traces"));
    EXPECT_EQ(create.status, 1) << create.out;
    EXPECT_TRUE(contains(create.stdout_text, "store-contract  FAULT")) << create.out;
    EXPECT_TRUE(contains(create.stdout_text, "exit status 0 before its work was done, while the engine for the trace below "
                                             "was being made (before its first step))"))
        << create.out;
    EXPECT_FALSE(contains(create.stdout_text, " at step ")) << create.out;
    const std::string trace = scratch("two-adds.trace");
    write_file(trace, adds(2));
    const Outcome destroy = kvcheck("replay " + trace + " --adapter " + KVCHECK_FAULT_EXIT_DESTROY);
    EXPECT_EQ(destroy.status, 1) << destroy.out;
    // A replay's report names a step all the same: the last, after which
    // the destructor ran, not the first.
    EXPECT_TRUE(contains(destroy.stdout_text, "ERROR: fault:exit: exit status 0 before its work was done, while the engine of "
                                              "the trace below was being destroyed (after its last step) at step 2 (add)"))
        << destroy.out;
    fs::remove(trace);
}

// A process an adapter starts that leaves it (a double fork and setsid:
// its parent exits, it is in no process group of kvcheck's) is still
// kvcheck's: its memory counts against the limit (1280 MiB held under a
// limit of 1024: a memory fault) and it does not outlive the job.
TEST_F(Cli, AProcessThatEscapesItsAdapterIsCountedAndKilled) {
    if (!have("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const std::string trace = scratch("one-add.trace");
    write_file(trace, adds(1));
    const std::string pid_file = scratch("escaped.pid");
    const Outcome replay = kvcheck("replay " + trace + " --memory-mb 1024 " +
                                   fault_adapter("escape --escape-mb 1280 --pid-file " + pid_file));
    const pid_t escaped = static_cast<pid_t>(std::atol(read_file(pid_file).c_str()));
    ASSERT_GT(escaped, 0) << replay.out;
    const std::string state_file = "/proc/" + std::to_string(escaped) + "/stat";
    const std::string stat = read_file(state_file);
    const bool alive = !stat.empty() && stat.find(") Z") == std::string::npos;
    EXPECT_FALSE(alive) << "the escaped process " << escaped << " outlived kvcheck: " << stat;
    if (alive) ::kill(escaped, SIGKILL);
    EXPECT_EQ(replay.status, 1) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, "fault:memory: ")) << replay.out;
    EXPECT_TRUE(contains(replay.stdout_text, "over the limit of 1024 MiB")) << replay.out;
    fs::remove(trace);
    fs::remove(pid_file);
}

// An adapter's output file (its stdout and stderr) keeps at most 16 MiB:
// one that writes 20 MiB in one operation finds it cut (with a note of what
// was dropped) while kvcheck still waits for its reply.
TEST_F(Cli, AnAdaptersOutputFileIsCapped) {
    if (!have("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const std::string trace = scratch("one-add.trace");
    write_file(trace, adds(1));
    const Outcome replay = kvcheck("replay " + trace + " " + fault_adapter("flood"));
    EXPECT_EQ(replay.status, 1) << replay.out.substr(0, 4000);
    const std::size_t holds = replay.stdout_text.find("my output file holds ");
    ASSERT_NE(holds, std::string::npos) << replay.out.substr(0, 4000);
    EXPECT_LT(std::stoul(replay.stdout_text.substr(holds + 21)), std::size_t{16} << 20) << replay.out.substr(0, 4000);
    EXPECT_TRUE(contains(replay.out, "bytes of the adapter's output dropped so far: an output file keeps at most 16 MiB"))
        << replay.out.substr(0, 4000);
    fs::remove(trace);
}

// A right-to-left override in an adapter's name would reorder its row of
// the table on a terminal: it is shown escaped, as engine output is.
TEST_F(Cli, BidiControlsInAnAdaptersNameAreEscapedInTheTable) {
    if (!have("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const Outcome run = kvcheck("run " + fault_adapter("none --bidi-name") + " --property store-contract --cases 2 --trace-dir " +
                                scratch("bidi-traces"));
    EXPECT_EQ(run.status, 1) << run.out;
    EXPECT_TRUE(contains(run.stdout_text, "fault-\\u{202e}none")) << run.out;
    EXPECT_FALSE(contains(run.out, "\xe2\x80\xae")) << run.out;
}

// ---- options ---------------------------------------------------------------------

TEST_F(Cli, LimitsThatMakeNoSenseAreRefused) {
    const std::string run = "run --adapter reference --property store-contract --cases 3 --quiet ";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--timeout 0", "--timeout must be at least 1 and at most 604800, not 0"},
        {"--timeout 1e-9", "--timeout must be at least 1 and at most 604800, not 1e-9"},
        {"--timeout 0.5", "--timeout must be at least 1"},
        {"--timeout nan", "--timeout takes a number of seconds, not 'nan'"},
        {"--timeout inf", "--timeout takes a number of seconds, not 'inf'"},
        {"--timeout 1e9", "--timeout must be at least 1 and at most 604800"},
        {"--total-timeout -1", "--total-timeout must be at least 0"},
        {"--total-timeout 1e-9", "--total-timeout must be 0 (no limit) or at least 1, not 1e-9"},
        {"--memory-mb 0", "--memory-mb must be between 1 and 16777216, not 0"},
        {"--memory-mb 1", "--memory-mb 1 is too small: an engine process starts as a copy of kvcheck"},
        {"--memory-mb 17592186044416", "--memory-mb must be between 1 and 16777216"},
        {"--cases ' -1'", "--cases takes a whole number, not ' -1'"},
        {"--cases 0", "--cases must be between 1 and 1000000000, not 0"},
        {"--cases 99999999999999999999999", "--cases takes a whole number"},
        {"--seconds 0", "--seconds must be more than 0"},
        {"--jobs 0", "--jobs must be between 1 and 256"},
        {"--cases 5 --seconds 5", "give --cases or --seconds, not both"},
    };
    for (const auto& [option, message] : cases) {
        const Outcome refused = kvcheck(run + option);
        EXPECT_EQ(refused.status, 2) << option << ": " << refused.out;
        EXPECT_TRUE(contains(refused.stderr_text, message)) << option << ": " << refused.out;
    }
}

TEST_F(Cli, VersionSaysWhichFormatsThisKvcheckSpeaks) {
    const Outcome version = kvcheck("--version");
    EXPECT_EQ(version.status, 0);
    EXPECT_EQ(version.stdout_text.rfind("kvcheck 0.", 0), 0u) << version.out;
    EXPECT_TRUE(contains(version.stdout_text, "report format 2, plugin ABI 16, dump format 1")) << version.out;
}

// ---- output paths -------------------------------------------------------------------

// Checked before the run: an hour's results are not lost to a typo.
TEST_F(Cli, OutputPathsAreCheckedBeforeTheRun) {
    const Outcome out = kvcheck("run --adapter reference --cases 100000 --quiet --out /nonexistent/dir/report.json --trace-dir " +
                                scratch("t"));
    EXPECT_EQ(out.status, 2) << out.out;
    EXPECT_TRUE(contains(out.stderr_text, "cannot write --out /nonexistent/dir/report.json")) << out.out;
    EXPECT_FALSE(contains(out.stderr_text, "[  1/")) << "it ran first";
    const Outcome dir = kvcheck("run --adapter reference --cases 100000 --quiet --trace-dir /proc/kvcheck-traces");
    EXPECT_EQ(dir.status, 2) << dir.out;
    EXPECT_TRUE(contains(dir.stderr_text, "cannot create --trace-dir /proc/kvcheck-traces")) << dir.out;
    const std::string file = scratch("a-file");
    write_file(file, "");
    const Outcome not_dir = kvcheck("run --adapter reference --cases 3 --quiet --trace-dir " + file);
    EXPECT_EQ(not_dir.status, 2) << not_dir.out;
    const Outcome shrink_out = kvcheck("shrink " + file + " --adapter M3 --out /nonexistent/short.trace");
    EXPECT_EQ(shrink_out.status, 2) << shrink_out.out;
    // Made to be checked, and removed again when nothing failed.
    const Outcome passes = kvcheck("run --adapter reference --property store-contract --cases 2 --quiet --trace-dir " +
                                   scratch("made/for/traces"));
    EXPECT_EQ(passes.status, 0) << passes.out;
    EXPECT_FALSE(fs::exists(scratch("made"))) << "an empty trace directory was left behind";
}

// An adapter named "../../kvcheck-fault-escape" writes its trace inside the
// trace directory, under a name made safe.
TEST_F(Cli, AdapterNamesAreMadeSafeFileNames) {
    const std::string root = scratch("names");
    const std::string traces = root + "/a/b/traces";
    const Outcome run = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_NAME_ESCAPE +
                                " --property store-contract --cases 5 --quiet --trace-dir " + traces);
    EXPECT_EQ(run.status, 1) << run.out;
    std::vector<std::string> files;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
        if (entry.is_regular_file()) files.push_back(fs::relative(entry.path(), root).string());
    }
    ASSERT_EQ(files.size(), 1u) << run.out;
    // Its failure (it throws) counts under engine-error.
    EXPECT_EQ(files.front(), "a/b/traces/_._.._kvcheck-fault-escape-engine-error.trace");
    EXPECT_TRUE(contains(run.stdout_text, "reproduce: kvcheck replay " + traces + "/_._.._kvcheck-fault-escape-engine-error.trace"))
        << run.out;
}

// What kvcheck prints on standard output must get there (issue 28, item 8):
// on a full device, a message and exit 2, not a silent exit 0.
TEST_F(Cli, AFullStandardOutputIsAnError) {
    if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
    const std::vector<std::string> commands = {
        "list",
        "--version",
        "run --adapter reference --property store-contract --cases 2 --quiet --trace-dir " + scratch("full-traces"),
        "check-dump " KVCHECK_SOURCE_DIR "/corpus/dump_load/mixed-three-items.pt",
    };
    for (const std::string& command : commands) {
        const Outcome full = kvcheck(command, "/dev/full");
        EXPECT_EQ(full.status, 2) << command << ": " << full.out;
        // (The reason, "No space left on device", only when the failed write
        // is the last flush: an earlier one leaves no errno to read.)
        EXPECT_TRUE(contains(full.stderr_text, "kvcheck: cannot write to standard output")) << command << ": " << full.out;
    }
}

// ---- interruption and temporary files -----------------------------------------------

// Ctrl-C (SIGINT to the terminal's process group): the children stop, the
// report holds what finished, marked incomplete, the exit status is 130,
// and no job directory is left behind (the fixture checks the TMPDIR).
TEST_F(Cli, CtrlCWritesTheResultsSoFarMarkedIncomplete) {
    const std::string report = scratch("interrupted.json");
    const std::string err = scratch("interrupted.err");
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::setpgid(0, 0);  // a process group of its own, as a shell gives a foreground job
        // ... with SIGINT's default action, as a shell gives one too: a test
        // binary started in the background (`&`) ignores SIGINT, kvcheck
        // then keeps it ignored, and the waitpid below waited for ever.
        ::signal(SIGINT, SIG_DFL);
        ::setenv("TMPDIR", kvcheck_tmp().c_str(), 1);
        const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(fd, STDERR_FILENO);
        const std::string traces = scratch("interrupted-traces");
        ::execl(KVCHECK_BINARY, KVCHECK_BINARY, "run", "--adapter", "reference", "--property", "store-contract",
                "--property", "dump-safe", "--cases", "1000000000", "--jobs", "2", "--report", "json", "--out",
                report.c_str(), "--trace-dir", traces.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::setpgid(pid, pid);
    // Wait until both children have begun traces (their progress lines
    // count them); the limit is only there to end the test if kvcheck
    // never gets that far.
    const auto traces_so_far = [](const std::string& text, const std::string& property) {
        const std::size_t at = text.rfind(property + ": ");
        return at == std::string::npos ? 0 : std::strtoul(text.c_str() + at + property.size() + 2, nullptr, 10);
    };
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (traces_so_far(read_file(err), "dump-safe") == 0 || traces_so_far(read_file(err), "store-contract") == 0) {
        ASSERT_LT(std::chrono::steady_clock::now(), give_up) << read_file(err);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ::kill(-pid, SIGINT);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 130) << read_file(err);
    const std::string json = read_file(report);
    EXPECT_TRUE(contains(json, "\"complete\": false, \"interrupted_by\": \"SIGINT\"")) << json;
    EXPECT_TRUE(contains(json, "\"id\": \"dump-safe\", \"verdict\": \"not-run\"")) << json;
    EXPECT_TRUE(contains(json, "\"message\": \"not finished: interrupted by SIGINT (after ")) << json;
    // Not a pass: no property finished (engine-error, never searched on its
    // own, is the one row that passes). The traces the interrupted searches
    // ran are counted.
    EXPECT_TRUE(contains(json, "\"not_run\": 2, \"blocked\": 0, \"all_pass\": false}")) << json;
    EXPECT_GE(number_before(read_file(err), " distinct traces run "), 2u) << read_file(err);
    EXPECT_TRUE(contains(read_file(err), "interrupted by SIGINT: the report holds the results so far, marked incomplete"))
        << read_file(err);
}

// The job directory of a kvcheck killed outright (kill -9) is removed by the
// next kvcheck; that of a running one is not.
TEST_F(Cli, JobDirectoriesOfDeadRunsAreRemoved) {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    ::waitpid(child, nullptr, 0);
    const std::string dead = kvcheck_tmp() + "/kvcheck-job-" + std::to_string(child) + "-AbC123";
    const std::string alive = kvcheck_tmp() + "/kvcheck-job-" + std::to_string(::getpid()) + "-AbC123";
    for (const std::string& dir : {dead, alive}) {
        fs::create_directories(dir + "/run/slot-0");
        write_file(dir + "/run/slot-0/kvcheck-store.pt", "x");
    }
    const Outcome run = kvcheck("run --adapter reference --property store-contract --cases 2 --quiet --trace-dir " + scratch("t"));
    EXPECT_EQ(run.status, 0) << run.out;
    EXPECT_FALSE(fs::exists(dead));
    EXPECT_TRUE(fs::exists(alive));
    fs::remove_all(alive);
}

// ---- check-dump ------------------------------------------------------------------

// kvcheck killed outright (SIGKILL: no handler runs) in mid-run: --out is
// not left empty (the report is written beside it and renamed when
// complete), and the next kvcheck removes the directories the dead one
// left in $TMPDIR, its adapter process's output directory among them.
TEST_F(Cli, AKilledRunLeavesNoEmptyReportAndItsDirectoriesGoNextTime) {
    if (!have("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const std::string report = scratch("killed.json");
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::setenv("TMPDIR", kvcheck_tmp().c_str(), 1);
        const std::string adapter = "exec:/usr/bin/python3 " KVCHECK_SOURCE_DIR "/python/adapter_tests/fault_adapter.py --fault hang";
        const std::string traces = scratch("killed-traces");
        ::execl(KVCHECK_BINARY, KVCHECK_BINARY, "run", "--adapter", adapter.c_str(), "--property", "store-contract", "--cases",
                "5", "--timeout", "600", "--quiet", "--report", "json", "--out", report.c_str(), "--trace-dir", traces.c_str(),
                static_cast<char*>(nullptr));
        ::_exit(127);
    }
    // Both directories exist once the job has started (the limit only ends
    // the test if kvcheck never gets that far).
    const auto made = [](const std::string& prefix) {
        for (const std::string& name : entries(kvcheck_tmp())) {
            if (name.rfind(prefix, 0) == 0) return true;
        }
        return false;
    };
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (!made("kvcheck-adapter-") || !made("kvcheck-job-")) {
        ASSERT_LT(std::chrono::steady_clock::now(), give_up);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    EXPECT_FALSE(fs::exists(report)) << "an empty report was left at --out";
    for (const std::string& name : entries(scratch(""))) EXPECT_EQ(name.find(".kvcheck-"), std::string::npos) << name;
    EXPECT_TRUE(made("kvcheck-adapter-"));
    const Outcome next = kvcheck("run --adapter reference --property store-contract --cases 1 --quiet --trace-dir " + scratch("t"));
    EXPECT_EQ(next.status, 0) << next.out;
    EXPECT_FALSE(made("kvcheck-adapter-")) << "the dead run's adapter directory is still there";
    EXPECT_FALSE(made("kvcheck-job-")) << "the dead run's job directory is still there";
}

TEST_F(Cli, CheckDumpSaysWhetherADumpIsSoundAndWhatItHolds) {
    const std::string corpus = KVCHECK_SOURCE_DIR "/corpus/dump_load/";
    // Two sound dumps, a file and a directory's, in one check-dump: exit 0.
    const std::string dir = scratch("dump-dir");
    fs::create_directories(dir);
    fs::copy_file(corpus + "one-legacy-f32.pt", dir + "/kvcheck-store.pt");
    const Outcome valid = kvcheck("check-dump " + corpus + "mixed-three-items.pt " + dir);
    EXPECT_EQ(valid.status, 0) << valid.out;
    EXPECT_TRUE(contains(valid.stdout_text, "mixed-three-items.pt: a valid kvcheck dump (format version 1), 3 items")) << valid.out;
    EXPECT_TRUE(contains(valid.stdout_text, "kind=memory")) << valid.out;
    EXPECT_TRUE(contains(valid.stdout_text, "\n" + dir + "/kvcheck-store.pt: a valid kvcheck dump (format version 1), 1 item"))
        << valid.out;
    const Outcome json = kvcheck("check-dump --json " + corpus + "mixed-three-items.pt");
    EXPECT_EQ(json.status, 0) << json.out;
    EXPECT_TRUE(contains(json.stdout_text, "\"valid\": true, \"format_version\": 1")) << json.out;
    EXPECT_TRUE(contains(json.stdout_text, "{\"id\": \"a\", \"layout\": \"modern\", \"dtypes\": [\"float32\"]")) << json.out;
    std::string why;
    if (have("/usr/bin/python3")) {
        EXPECT_TRUE(valid_by("/usr/bin/python3 -m json.tool", json.stdout_text, &why)) << why;
    }

    // An invalid dump and three unreadable paths in one check-dump: each
    // said per file (INVALID: exit 1; UNREADABLE: exit 2), the worst, 2,
    // is the exit code.
    const std::string nested_file = KVCHECK_SOURCE_DIR "/corpus/regressions/dump_load/nested-tuples-200000.pt";
    const std::vector<std::string> unreadable = {scratch("no-such.pt"), kvcheck_tmp(), "/dev/zero"};
    const Outcome nested = kvcheck("check-dump " + nested_file + " " + unreadable[0] + " " + unreadable[1] + " " + unreadable[2]);
    EXPECT_EQ(nested.status, 2) << nested.out;
    const std::string nested_line = line_starting(nested.stdout_text, nested_file + ": ");
    EXPECT_TRUE(contains(nested_line, ": INVALID: corrupt dump")) << nested.out;
    EXPECT_TRUE(contains(nested_line, "tuples nested more than 32 deep")) << nested.out;
    for (const std::string& path : unreadable) {
        const std::string file = path == kvcheck_tmp() ? path + "/kvcheck-store.pt" : path;  // a directory without a dump
        EXPECT_EQ(line_starting(nested.stdout_text, file + ": ").rfind(file + ": UNREADABLE: ", 0), 0u) << path << "\n" << nested.out;
    }
    const std::string truncated = scratch("truncated.pt");
    const std::string bytes = read_file(corpus + "one-modern-f32.pt");
    write_file(truncated, bytes.substr(0, bytes.size() / 2));
    const Outcome cut = kvcheck("check-dump --json " + truncated);
    EXPECT_EQ(cut.status, 1) << cut.out;
    EXPECT_TRUE(contains(cut.stdout_text, "\"valid\": false, \"error\": \"corrupt dump ")) << cut.out;

    EXPECT_EQ(kvcheck("check-dump").status, 2);
    EXPECT_EQ(kvcheck("check-dump --frobnicate x").status, 2);
    const Outcome several_json = kvcheck("check-dump --json " + truncated + " " + truncated);
    EXPECT_EQ(several_json.status, 2) << several_json.out;
    EXPECT_TRUE(contains(several_json.stderr_text, "check-dump --json takes one dump file or directory")) << several_json.out;
}

}  // namespace
