// The kvcheck command line, end to end: help and exit codes, reports, replay
// of the traces it writes, plugin loading errors, and isolation: an engine
// that crashes, aborts, throws, leaks or hangs is reported as a fault of the
// property and trace that triggered it, and the run completes.
#include "cli_util.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using namespace kvtest::cli;

TEST_F(Cli, HelpAndUsageErrors) {
    const Outcome help = kvcheck("--help");
    EXPECT_EQ(help.status, 0);
    for (const char* command : {"list", "run", "replay", "shrink"}) {
        EXPECT_TRUE(contains(help.out, command)) << help.out;
        EXPECT_EQ(kvcheck(std::string(command) + " --help").status, 0) << command;
    }
    EXPECT_EQ(kvcheck("frobnicate").status, 2);
    const Outcome bad_option = kvcheck("run --no-such-option");
    EXPECT_EQ(bad_option.status, 2);
    EXPECT_TRUE(contains(bad_option.out, "unknown option --no-such-option")) << bad_option.out;
    const Outcome bad_adapter = kvcheck("run --adapter nonesuch");
    EXPECT_EQ(bad_adapter.status, 2);
    EXPECT_TRUE(contains(bad_adapter.out, "unknown adapter 'nonesuch'")) << bad_adapter.out;
    EXPECT_EQ(kvcheck("run --adapter reference --property nonesuch").status, 2);
    EXPECT_EQ(kvcheck("run --adapter reference --cases x").status, 2);
    const Outcome bad_scope = kvcheck("run --adapter reference --scope huge");
    EXPECT_EQ(bad_scope.status, 2);
    EXPECT_TRUE(contains(bad_scope.out, "unknown scope 'huge' (expected small, default or large)")) << bad_scope.out;
    const Outcome missing = kvcheck("run --adapter /nonexistent/libengine.so");
    EXPECT_EQ(missing.status, 2);
    EXPECT_TRUE(contains(missing.out, "not found")) << missing.out;
    const Outcome not_plugin = kvcheck(std::string("run --adapter ") + KVCHECK_NOT_A_PLUGIN);
    EXPECT_EQ(not_plugin.status, 2);
    EXPECT_TRUE(contains(not_plugin.out, "is not a kvcheck plugin")) << not_plugin.out;
    const Outcome bad_also = kvcheck("run --adapter reference --also-report junit");
    EXPECT_EQ(bad_also.status, 2);
    EXPECT_TRUE(contains(bad_also.out, "--also-report takes FORMAT=FILE (e.g. junit=report.xml), not 'junit'")) << bad_also.out;
    // An --also-report file that cannot be written is refused before the run.
    const Outcome unwritable = kvcheck("run --adapter reference --cases 100000 --quiet --also-report json=/nonexistent/dir/r.json "
                                       "--trace-dir " + scratch("also-traces"));
    EXPECT_EQ(unwritable.status, 2);
    EXPECT_TRUE(contains(unwritable.stderr_text, "cannot write --also-report /nonexistent/dir/r.json")) << unwritable.out;
}

TEST_F(Cli, ListNamesEveryPropertyAndMutant) {
    const Outcome list = kvcheck("list");
    EXPECT_EQ(list.status, 0);
    for (const char* name : {"reference", "M1", "M10", "stored-immutable", "dump-safe", "store-contract"}) {
        EXPECT_TRUE(contains(list.out, name)) << name;
    }
}

TEST_F(Cli, TheReferencePassesAndExitsZero) {
    const Outcome run = kvcheck("run --adapter reference --cases 30 --quiet --trace-dir " + scratch("traces"));
    EXPECT_EQ(run.status, 0) << run.out;
    EXPECT_TRUE(contains(run.out, "stored-immutable")) << run.out;
    EXPECT_TRUE(contains(run.out, "scope default: 50% small traces")) << run.out;
    // The closing line counts what the jobs ran (sent up by each job).
    const unsigned long traces_run = number_before(run.stderr_text, " distinct traces run ");
    const unsigned long operations = number_before(run.stderr_text, " operations checked, in ");
    EXPECT_GT(traces_run, 30u) << run.stderr_text;
    EXPECT_GT(operations, 2 * traces_run) << run.stderr_text;  // 1-24 operations, about 12 on average
    // Large caches under a sanitizer on a busy machine: a generation may
    // take more than the default 30 s without progress.
    const Outcome large =
        kvcheck("run --adapter reference --cases 10 --scope large --timeout 300 --quiet --trace-dir " + scratch("traces"));
    EXPECT_EQ(large.status, 0) << large.out;
    EXPECT_TRUE(contains(large.out, "scope large:")) << large.out;
    EXPECT_FALSE(contains(run.out, "FAIL ")) << run.out;  // a cell; the legend says "FAIL:"
}

// A bundled adapter's engine, made in kvcheck's process, says before any
// job which properties it can be judged on: no job (a fork) starts for the
// others, and the report lists them n/a as before (issue 39).
TEST_F(Cli, NoJobStartsForAPropertyABundledAdapterCannotBeJudgedOn) {
    const Outcome run = kvcheck("run --adapter reference --cases 1 --jobs 1 --trace-dir " + scratch("traces"));
    EXPECT_EQ(run.status, 0) << run.out;
    // The 12 of `kvcheck list --adapter reference`; of them only
    // lease-respected is skipped (the reference declares no leases: its job
    // says so, as trim-exact's does for an engine without trim).
    EXPECT_TRUE(contains(run.stderr_text, " 12/12] reference")) << run.stderr_text;
    EXPECT_TRUE(contains(run.stderr_text, "reference  lease-respected        skipped")) << run.stderr_text;
    const std::size_t skipped = run.stderr_text.find("skipped");
    EXPECT_EQ(run.stderr_text.find("skipped", skipped + 1), std::string::npos) << run.stderr_text;
    EXPECT_TRUE(contains(run.out, "17 properties left out, n/a for every adapter: 15 of the other cache family")) << run.out;
}

// The line of the (index)-th property finished, "" when there is none.
std::string finished_line(const std::string& text, const std::string& index) {
    const std::size_t at = text.find("[" + index + "] ");
    return at == std::string::npos ? "" : text.substr(at, text.find('\n', at) - at);
}

// Progress lines say how long the run has left once it has lasted
// --progress-seconds (0 here: from the first line on): from the time the
// finished properties took, or from a --seconds budget; the last line,
// with nothing left, says nothing of it.
TEST_F(Cli, ProgressLinesEstimateTheTimeLeft) {
    const std::string three = "run --adapter reference --property single-copy --property store-contract "
                              "--property clone-independent --jobs 1 --progress-seconds 0 --trace-dir " + scratch("traces");
    const Outcome counted = kvcheck(three + " --cases 5");
    EXPECT_EQ(counted.status, 0) << counted.out;
    EXPECT_TRUE(contains(finished_line(counted.stderr_text, "  1/3"), " s left")) << counted.stderr_text;
    EXPECT_TRUE(contains(finished_line(counted.stderr_text, "  2/3"), "; about ")) << counted.stderr_text;
    EXPECT_FALSE(contains(finished_line(counted.stderr_text, "  3/3"), "left")) << counted.stderr_text;
    const Outcome budget = kvcheck(three + " --seconds 0.2");
    EXPECT_EQ(budget.status, 0) << budget.out;
    EXPECT_TRUE(contains(finished_line(budget.stderr_text, "  1/3"), "; about 1 s left")) << budget.stderr_text;
    const Outcome quiet = kvcheck(three + " --cases 5 --progress-seconds 60");
    EXPECT_FALSE(contains(quiet.stderr_text, "left")) << quiet.stderr_text;
}

// --model: the domain searched instead of the engine's, said in the run's
// first line and the report; a bad key or value is a usage error naming it.
TEST_F(Cli, ModelOverridesTheDomainAndIsParsedStrictly) {
    const std::string json = scratch("model.json");
    const Outcome run = kvcheck("run --adapter reference --property merge-correct --cases 20 --quiet --report json --out " + json +
                                " --trace-dir " + scratch("traces") + " --model layers=2,heads=2,head_dim=8,dtype=f32+bf16,layout=modern");
    EXPECT_EQ(run.status, 0) << run.out;
    EXPECT_TRUE(contains(run.stderr_text, "; domain: layers=2 heads=2 head_dim=8 dtype=f32+bf16 layout=modern; limits")) << run.out;
    EXPECT_TRUE(contains(read_file(json), "\"domain\": \"layers=2 heads=2 head_dim=8 dtype=f32+bf16 layout=modern\"")) << read_file(json);
    const Outcome undeclared = kvcheck("run --adapter reference --property merge-correct --cases 5 --trace-dir " + scratch("traces"));
    EXPECT_EQ(undeclared.status, 0) << undeclared.out;
    EXPECT_TRUE(contains(undeclared.stderr_text, "; domain: any (undeclared); limits")) << undeclared.out;
    EXPECT_TRUE(contains(undeclared.stdout_text, "domain: any (undeclared)\n")) << undeclared.out;
    EXPECT_TRUE(contains(kvcheck("run --help").out, "--model VALUE")) << "in run --help";
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"layers=2,dtype=f32", "--model: 'layout' is missing"},
        {"layers=x,dtype=f32,layout=modern", "--model: 'layers' takes a whole number, not 'x'"},
        {"layers=2,dtype=f8,layout=modern", "--model: 'dtype': unknown value 'f8'"},
        {"layers=2,dtype=f32,layout=modern,odd_layers=1", "--model: 'odd_layers' takes yes or no, not '1'"},
        {"layers=2,dtype=f32,layout=modern,vocab=7", "--model: unknown key 'vocab'"},
        {"layers=0,dtype=f32,layout=modern", "--model: 'layers' must be in [1, 1024], not 0"},
    };
    for (const auto& [value, message] : bad) {
        const Outcome refused = kvcheck("run --adapter reference --cases 1 --model " + value);
        EXPECT_EQ(refused.status, 2) << value << ": " << refused.out;
        EXPECT_TRUE(contains(refused.out, message)) << value << ": " << refused.out;
    }
    EXPECT_EQ(kvcheck("replay x.trace --adapter reference --model layers=2,dtype=f32,layout=modern").status, 2)
        << "replay draws nothing: --model is not one of its options";
}

TEST_F(Cli, AMutantFailsWithAJsonReportAndAReplayableTrace) {
    const std::string traces = scratch("mutant-traces");
    const std::string json = scratch("m3.json"), junit_file = scratch("m3.xml");
    const Outcome run = kvcheck("run --adapter M3 --property single-copy --property dump-safe --cases 100 --quiet --report json --out " +
                                json + " --also-report junit=" + junit_file + " --trace-dir " + traces);
    EXPECT_EQ(run.status, 1) << run.out;
    std::ifstream in(json);
    const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(contains(report, "\"adapter\": \"M3\"")) << report;
    EXPECT_TRUE(contains(report, "\"seed\": 20261202")) << report;
    EXPECT_TRUE(contains(report, "{\"id\": \"single-copy\", \"verdict\": \"fail\"")) << report;
    EXPECT_TRUE(contains(report, "{\"id\": \"dump-safe\", \"verdict\": \"pass\"")) << report;
    EXPECT_TRUE(contains(report, "\"reproduce\": \"kvcheck replay ")) << report;
    const std::string trace = traces + "/M3-single-copy.trace";
    ASSERT_TRUE(std::filesystem::exists(trace));
    const Outcome replay = kvcheck("replay " + trace + " --adapter M3");
    EXPECT_EQ(replay.status, 1) << replay.out;
    EXPECT_TRUE(contains(replay.out, "ERROR: single-copy:")) << replay.out;
    EXPECT_TRUE(contains(replay.out, "SUMMARY: kvcheck: single-copy violated")) << replay.out;
    EXPECT_EQ(kvcheck("replay " + trace + " --adapter reference").status, 0);
    const std::string junit = read_file(junit_file);
    EXPECT_TRUE(contains(junit, "<testcase classname=\"kvcheck.M3\" name=\"single-copy\"")) << junit;
    EXPECT_TRUE(contains(junit, "<failure")) << junit;
}

// A failure of several clients (--lanes): every report draws the lanes side
// by side with the conflicting steps marked, and `kvcheck replay` runs the
// schedule exactly: the same calls in another order pass.
TEST_F(Cli, ALanesFailureIsDrawnSideBySideAndReplaysItsSchedule) {
    const std::string traces = scratch("lanes-traces");
    // One search, its report in three formats (--also-report).
    const std::string json = scratch("lm2.json"), html = scratch("lm2.html");
    const Outcome run = kvcheck("run --adapter LM2 --lanes 3 --property generation-equivalent --cases 100 --quiet --trace-dir " + traces +
                                " --also-report json=" + json + " --also-report html=" + html);
    EXPECT_EQ(run.status, 1) << run.out;
    EXPECT_TRUE(contains(run.out, "# the lanes side by side, in schedule order")) << run.out;
    EXPECT_TRUE(contains(run.out, "  <- generation-equivalent")) << run.out;
    const std::string report = read_file(json);
    EXPECT_TRUE(contains(report, "\"lanes\": {\"lane_of_step\": [")) << report;
    EXPECT_TRUE(contains(report, "\"conflicting_steps\": [")) << report;
    const std::string page = read_file(html);
    EXPECT_TRUE(contains(page, "<table class=\"lanes\">")) << page;
    EXPECT_TRUE(contains(page, "<td class=\"failing\">")) << page;
    EXPECT_TRUE(contains(page, "<td class=\"conflict\">")) << page;

    const std::string setup = "add a modern/f32/3:[kv2]\nadd b modern/f32/3:[kv1]\n";
    const std::string raced = scratch("raced.trace"), apart = scratch("apart.trace");
    write_file(raced, setup + "switch lane=1\nh101 = get_cache a\nswitch lane=2\nadd a modern/f32/3:[kv1]\n"
                              "switch lane=1\ngenerate h101 prompt=5 max=2\nrelease h101\n");
    write_file(apart, setup + "switch lane=1\nh101 = get_cache a\ngenerate h101 prompt=5 max=2\nrelease h101\n"
                              "switch lane=2\nadd a modern/f32/3:[kv1]\n");
    const Outcome replay = kvcheck("replay " + raced + " --adapter LM2");
    EXPECT_EQ(replay.status, 1) << replay.out;
    EXPECT_TRUE(contains(replay.out, "violated after 8 operations")) << replay.out;
    EXPECT_TRUE(contains(replay.out, "* generate h101 prompt=5 max=2 |  <- ")) << replay.out;
    EXPECT_EQ(kvcheck("replay " + apart + " --adapter LM2").status, 0);
    EXPECT_EQ(kvcheck("replay " + raced + " --adapter reference").status, 0);
}

// The thread level (--threads): each thread mutant is caught by a property
// it breaks, shrunk to at most 3 client lanes, drawn side by side in every
// report, and its trace file replays the schedule exactly from the command
// line (3 runs alike); the same calls under no schedule (no switch inside a
// call) pass, as they do on the paged reference.
TEST_F(Cli, AThreadFindingIsDrawnSideBySideAndReplaysItsSchedule) {
    const std::string traces = scratch("thread-traces");
    // TM1's search also writes its report as JSON and HTML (--also-report).
    const std::string json = scratch("tm1.json"), html = scratch("tm1.html");
    for (const auto& [mutant, property, lanes] : {std::tuple{"TM1", "free-iff-unreferenced", "6"}, std::tuple{"TM2", "refcount-exact", "3"}}) {
        const std::string run_options = std::string("run --adapter ") + mutant + " --threads --lanes " + lanes + " --cases 60 --quiet --trace-dir " + traces +
                                        (std::string(mutant) == "TM1" ? " --also-report json=" + json + " --also-report html=" + html : "");
        const Outcome run = kvcheck(run_options);
        EXPECT_EQ(run.status, 1) << run.out;
        EXPECT_TRUE(contains(run.out, std::string("ERROR: ") + property + ": at the quiescent point after")) << run.out;
        EXPECT_TRUE(contains(run.out, "# the lanes side by side, in schedule order")) << run.out;
        EXPECT_TRUE(contains(run.out, std::string("  <- ") + property)) << run.out;
        EXPECT_TRUE(contains(run.out, "# what ran, in order")) << run.out;
        EXPECT_TRUE(contains(run.out, " paused at ")) << run.out;  // a call overlapped another
        const std::string trace = traces + "/threads-" + mutant + "-" + property + ".trace";
        ASSERT_TRUE(std::filesystem::exists(trace)) << run.out;
        EXPECT_TRUE(contains(run.out, "reproduce: kvcheck replay " + trace + " --adapter " + mutant)) << run.out;
        const std::string text = read_file(trace);
        const std::size_t header = text.find("\nthreads lanes=");
        ASSERT_NE(header, std::string::npos) << text;
        EXPECT_LE(std::stoi(text.substr(header + 15)), 4) << text;  // lane 0's setup and at most 3 clients

        const Outcome replay = kvcheck("replay " + trace + " --adapter " + mutant);
        EXPECT_EQ(replay.status, 1) << replay.out;
        EXPECT_TRUE(contains(replay.out, std::string("ERROR: ") + property + ":")) << replay.out;
        EXPECT_TRUE(contains(replay.out, "replayed alike 3 of 3 times")) << replay.out;
        EXPECT_EQ(kvcheck("replay " + trace + " --adapter paged-reference").status, 0);
        const std::string unswitched = scratch(std::string(mutant) + "-unswitched.trace");
        write_file(unswitched, text.substr(0, header) + "\nthreads lanes=" + text.substr(header + 15, text.find(' ', header + 15) - header - 15) +
                                   " schedule=" + text.substr(text.find('\n', header + 1)));
        const Outcome alone = kvcheck("replay " + unswitched + " --adapter " + mutant);
        EXPECT_EQ(alone.status, 0) << read_file(unswitched) << alone.out;
    }
    const std::string report = read_file(json);
    EXPECT_TRUE(contains(report, "\"lanes\": {\"lane_of_step\": [")) << report;
    EXPECT_TRUE(contains(report, "\"threads\": \"threads lanes=")) << report;
    const std::string page = read_file(html);
    EXPECT_TRUE(contains(page, "<table class=\"lanes\">")) << page;
    EXPECT_TRUE(contains(page, "<td class=\"failing\">")) << page;
    EXPECT_TRUE(contains(page, "<td class=\"conflict\">")) << page;

    // The store family: the reference passes, TM3 (an unlocked index
    // update) fails linearizable; the paged rows are n/a for a store.
    const Outcome store = kvcheck("run --adapter reference --threads --cases 5 --quiet --trace-dir " + traces);
    EXPECT_EQ(store.status, 0) << store.out;
    EXPECT_TRUE(contains(store.out, "n/a for every adapter: 2 of the other cache family")) << store.out;
    const Outcome index = kvcheck("run --adapter TM3 --threads --cases 60 --quiet --trace-dir " + traces);
    EXPECT_EQ(index.status, 1) << index.out;
    EXPECT_TRUE(contains(index.out, "ERROR: linearizable: at the quiescent point after")) << index.out;
    // No silent sequential run: an engine the thread level cannot run is n/a.
    const Outcome leased = kvcheck("run --adapter reference-leases --threads --cases 5 --quiet --trace-dir " + traces);
    EXPECT_EQ(leased.status, 0) << leased.out;
    EXPECT_TRUE(contains(leased.out, "judge no leases")) << leased.out;
    EXPECT_EQ(kvcheck("run --adapter TM1 --threads --lanes 1 --quiet --trace-dir " + traces).status, 2);
    EXPECT_EQ(kvcheck("run --adapter TM1 --threads --property single-copy --quiet --trace-dir " + traces).status, 2);
    EXPECT_EQ(kvcheck("shrink " + traces + "/threads-TM1-free-iff-unreferenced.trace --adapter TM1").status, 2);
}

// The report without the times it holds ("seconds": 0.123).
std::string without_seconds(std::string report) {
    const std::string key = "\"seconds\": ";
    for (std::size_t at = report.find(key); at != std::string::npos; at = report.find(key, at + key.size())) {
        const std::size_t end = report.find_first_not_of("0123456789.", at + key.size());
        report.erase(at + key.size(), end - at - key.size());
    }
    return report;
}

// --seed reproduces a run: the same report, the same trace found after the
// same number of traces (trace seeds are mixed from the run's seed, the
// property and the index: kvcheck::trace_seed). One job: with two, which
// of two searches first reports a failure found "while searching" the
// other depends on which finishes first.
TEST_F(Cli, TheSameSeedGivesTheSameReport) {
    const std::string run = "run --adapter M3 --property single-copy --property store-contract --cases 40 --seed 7 "
                            "--jobs 1 --quiet --report json --trace-dir " + scratch("seeded-traces");
    const Outcome first = kvcheck(run);
    const Outcome again = kvcheck(run);
    EXPECT_EQ(first.status, 1) << first.out;
    EXPECT_TRUE(contains(first.stdout_text, "\"seed\": 7")) << first.out;
    EXPECT_TRUE(contains(first.stdout_text, "{\"id\": \"single-copy\", \"verdict\": \"fail\"")) << first.out;
    EXPECT_EQ(without_seconds(first.stdout_text), without_seconds(again.stdout_text));
    EXPECT_GT(number_before(first.stderr_text, " distinct traces run "), 40u) << first.stderr_text;
    EXPECT_EQ(number_before(first.stderr_text, " distinct traces run "), number_before(again.stderr_text, " distinct traces run "));
    EXPECT_EQ(number_before(first.stderr_text, " operations checked, in "),
              number_before(again.stderr_text, " operations checked, in "));
}

TEST_F(Cli, ShrinkMakesALongFailingTraceShort) {
    const std::string path = scratch("long.trace");
    std::ofstream(path) << "# a long trace that M3 fails at the end\n"
                           "add a modern/f32/1:[kv3 kv2]\nadd b legacy/f32/2:[kv1]\nget_all\nh1 = get a\n"
                           "get_by_ids a b c\nh2 = get_cache a\ndelete c\nh3 = make modern/f32/3:[kv2]\n"
                           "generate h2 prompt=4,5 max=3\n";
    const std::string out = scratch("short.trace");
    const Outcome shrink = kvcheck("shrink " + path + " --adapter M3 --out " + out);
    EXPECT_EQ(shrink.status, 1) << shrink.out;
    std::ifstream in(out);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) lines += !line.empty() && line[0] != '#';
    EXPECT_LE(lines, 3) << shrink.out;
}

struct FaultCase {
    const char* plugin;
    std::vector<const char*> expected;  // any of these in the report
};

// The JSON object of property `id` in a report of one adapter (up to the
// next property's).
std::string property_json(const std::string& report, const std::string& id) {
    const std::size_t at = report.find("{\"id\": \"" + id + "\"");
    if (at == std::string::npos) return "";
    const std::size_t end = report.find("\n      {\"id\": ", at + 1);
    return report.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// The JSON object of adapter `name` in a report (up to the next adapter's).
std::string adapter_json(const std::string& report, const std::string& name) {
    const std::size_t at = report.find("{\"adapter\": \"" + name + "\"");
    if (at == std::string::npos) return "";
    const std::size_t end = report.find("\n    {\"adapter\": ", at + 1);
    return report.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// The adapter name of a plugin path: its file name without ".so".
std::string plugin_name(const std::string& path) {
    const std::string file = path.substr(path.rfind('/') + 1);
    return file.substr(0, file.rfind(".so"));
}

// Each fault strikes deterministically (faulty_engine.cpp: at the third add
// of a trace; the leak from the first add on, across the traces of a
// process). The limits are far from any operation's time even under ASan
// on a busy machine: only the hang waits for its limit, in both properties
// at once (--jobs 2), each with the full limit: a hang of one property
// shortens no other's (docs/semantics.md#limits). The five faults of one
// limit are the adapters of one run (one kvcheck start), each judged on
// its own part of the report; the hang has a run of its own.
TEST_F(Cli, EngineFaultsAreReportedAndTheRunCompletes) {
    const std::vector<std::pair<std::vector<FaultCase>, const char*>> runs = {
        {{{KVCHECK_FAULT_SEGV, {"crash: SIGSEGV", "exit: exit status"}},  // ASan turns a SEGV into an exit
          {KVCHECK_FAULT_ABORT, {"crash: SIGABRT", "exit: exit status"}},
          {KVCHECK_FAULT_THROW, {"the engine threw"}},
          {KVCHECK_FAULT_LEAK, {"memory: resident memory", "memory: peak resident memory", "memory: an allocation failed"}},
          {KVCHECK_FAULT_EXIT, {"exit: exit status 0 before its work was done"}}},
         "--timeout 60"},  // generous: no verdict may depend on the machine's load
        {{{KVCHECK_FAULT_HANG, {"hang: no progress for 10 s"}}}, "--timeout 10 --jobs 2"},
    };
    for (const auto& [cases, limits] : runs) {
        std::string adapters;
        for (const FaultCase& fault : cases) adapters += std::string(" --adapter ") + fault.plugin;
        const Outcome run = kvcheck("run" + adapters + " --property stored-immutable --property store-contract --cases 40 --memory-mb 1536 " +
                                    limits + " --quiet --report json --trace-dir " + scratch("fault-traces"));
        EXPECT_EQ(run.status, 1) << run.out;
        for (const FaultCase& fault : cases) {
            SCOPED_TRACE(fault.plugin);
            const std::string report = adapter_json(run.stdout_text, plugin_name(fault.plugin));
            ASSERT_FALSE(report.empty()) << run.out;
            bool found = false;
            for (const char* expected : fault.expected) found = found || contains(report, expected);
            EXPECT_TRUE(found) << report;
            // Both properties have a verdict: the fault did not end the run. An
            // engine error is counted under engine-error, and the trace judged
            // without the operations that raised (a pass, when that run
            // completes), or blocks a search when more than a tenth of its
            // traces still raise.
            for (const std::string id : {"stored-immutable", "store-contract"}) {
                const std::string prefix = "\"id\": \"" + id + "\", \"verdict\": ";
                EXPECT_TRUE(contains(report, prefix + "\"fail\"") || contains(report, prefix + "\"blocked\"") ||
                            contains(report, prefix + "\"pass\""))
                    << id << "\n" << report;
            }
            EXPECT_TRUE(contains(report, "\"trace\": \"")) << "the triggering trace is reported\n" << report;
            if (std::string(fault.plugin) == KVCHECK_FAULT_HANG) {
                for (const std::string id : {"stored-immutable", "store-contract"}) {
                    EXPECT_TRUE(contains(property_json(report, id), "hang: no progress for 10 s")) << id << "\n" << report;
                }
            }
        }
    }
}


// The whole number after "<name>": in `json` (its first occurrence).
unsigned long json_number(const std::string& json, const std::string& name) {
    const std::string key = "\"" + name + "\": ";
    const std::size_t at = json.find(key);
    if (at == std::string::npos) return 0;
    return std::stoul(json.substr(at + key.size(), 20));
}

// Every "count": of an engine-error row's groups, summed.
unsigned long counts_summed(const std::string& json) {
    unsigned long sum = 0;
    for (std::size_t at = json.find("\"count\": "); at != std::string::npos; at = json.find("\"count\": ", at + 1)) {
        sum += std::stoul(json.substr(at + 9, 20));
    }
    return sum;
}

std::size_t occurrences(const std::string& text, const std::string& part) {
    std::size_t count = 0;
    for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
    return count;
}

// An engine that raises on a few traces (an add of a one-head cache, about
// one trace in sixteen, in two wordings whose ids, counts and addresses
// differ from raise to raise): the searches go on past every raise, each
// trace is judged without the adds that raised (pass: nearly every trace
// judged),
// and the engine-error row holds two groups, one per wording, their counts
// the traces that raised, each with a shrunk trace that replays the same
// error.
TEST_F(Cli, EngineErrorsOnAFewTracesLeaveThePropertiesJudged) {
    const std::string traces = scratch("rare-traces");
    const Outcome run = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_RARE +
                                " --property store-contract --property stored-immutable --cases 200 --quiet --report json "
                                "--trace-dir " + traces);
    EXPECT_EQ(run.status, 1) << "the engine-error row fails\n" << run.out;
    for (const std::string id : {"store-contract", "stored-immutable"}) {
        const std::string json = property_json(run.stdout_text, id);
        EXPECT_TRUE(contains(json, "\"verdict\": \"pass\", \"cases\": 200, \"judged\": ")) << json;
        // A few traces raise on more than 3 adds (or on nothing else).
        EXPECT_GE(json_number(json, "judged"), 190u) << json;
        EXPECT_TRUE(contains(json, "\"not_applied\": null")) << "adds of other caches ran\n" << json;
    }
    const std::string errors = property_json(run.stdout_text, "engine-error");
    EXPECT_TRUE(contains(errors, "\"verdict\": \"fail\"")) << errors;
    EXPECT_EQ(occurrences(errors, "\"found_while_searching\": "), 2u) << "one group per wording\n" << errors;
    EXPECT_TRUE(contains(errors, "kvcheck-fault-rare: cannot add a single-head cache '")) << errors;
    EXPECT_TRUE(contains(errors, "kvcheck-fault-rare: no single-head legacy caches, refusing '")) << errors;
    EXPECT_GT(counts_summed(errors), 2u) << "a group counts every trace its shape raised in\n" << errors;
    for (const std::string file : {"/kvcheck-fault-rare-engine-error.trace", "/kvcheck-fault-rare-engine-error-2.trace"}) {
        EXPECT_TRUE(contains(errors, "\"reproduce\": \"kvcheck replay " + traces + file)) << errors;
        const Outcome replay = kvcheck("replay " + traces + file + " --adapter " + KVCHECK_FAULT_RARE);
        EXPECT_EQ(replay.status, 1) << replay.out;
        EXPECT_TRUE(contains(replay.stdout_text, "ERROR: engine-error: the engine threw: kvcheck-fault-rare: ")) << replay.out;
    }
    // The table's text says how much was judged.
    const Outcome table = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_RARE +
                                  " --property store-contract --cases 200 --quiet --trace-dir " + traces);
    EXPECT_TRUE(contains(table.stdout_text, "\nstore-contract  pass ")) << table.stdout_text;
    EXPECT_TRUE(contains(table.stdout_text, " of 200 traces: the others ended in an engine error (see engine-error)"))
        << table.stdout_text;
    EXPECT_TRUE(contains(table.stdout_text, "/ engine-error (2 groups by message, ")) << table.stdout_text;
}

// Every finding is replayed on a fresh engine before it is reported
// (docs/semantics.md#reproduction): a deterministic mutant's reproduces on
// every replay; --replays 0 leaves it unverified.
TEST_F(Cli, FindingsAreReplayVerified) {
    const std::string args = " --adapter M12 --property store-contract --cases 50 --failures 1 --quiet --report json --trace-dir " +
                             scratch("replayed-traces");
    const Outcome run = kvcheck("run" + args);
    const std::string json = property_json(run.stdout_text, "store-contract");
    EXPECT_TRUE(contains(json, "\"reproduction\": {\"kind\": \"reproduced\", \"replays\": 3, \"failed\": 3, \"prefix\": null"))
        << json;
    const Outcome unverified = kvcheck("run --replays 0" + args);
    const std::string plain = property_json(unverified.stdout_text, "store-contract");
    EXPECT_TRUE(contains(plain, "\"reproduction\": null")) << plain;
    EXPECT_EQ(kvcheck("run --replays -1" + args).status, 2);
    // A finding whose pinned failure names another property first (M32's
    // extract: stored-immutable's message, generation-equivalent also at
    // that step) reproduces too: a replay shows it when it fails any
    // property the finding names (it was labelled flaky, 0 of 3).
    const Outcome named = kvcheck("run --adapter M32 --property generation-equivalent --cases 50 --failures 1 --quiet "
                                  "--report json --trace-dir " + scratch("replayed-traces"));
    const std::string m32 = property_json(named.stdout_text, "generation-equivalent");
    EXPECT_TRUE(contains(m32, "\"reproduction\": {\"kind\": \"reproduced\", \"replays\": 3, \"failed\": 3, \"prefix\": null"))
        << m32;
}

// The text of the JSON string field `name` in `json` (its first
// occurrence), without unescaping: for paths and commands.
std::string json_text(const std::string& json, const std::string& name) {
    const std::string key = "\"" + name + "\": \"";
    const std::size_t at = json.find(key);
    if (at == std::string::npos) return "";
    const std::size_t start = at + key.size();
    return json.substr(start, json.find('"', start) - start);
}

// A plugin whose engines share a mutable static cache
// (kvcheck-fault-shared-static): its finding's replays run in kvcheck
// processes of their own (a fresh instance in the search's process would
// share the statics, and fail), so it is reported shared-state, on the
// adapter's engine-level shared-state row as on the property's, with a
// two-part reproducer that fails on replay while the trace alone passes.
TEST_F(Cli, APluginsStaticsSharedAcrossInstancesAreReportedSharedState) {
    const std::string traces = scratch("shared-static-traces");
    const std::string plugin = KVCHECK_FAULT_SHARED_STATIC;
    const Outcome run = kvcheck("run --adapter " + plugin + " --property stored-immutable --cases 10 --failures 1 --replays 1 --quiet "
                                "--report json --trace-dir " + traces);
    EXPECT_EQ(run.status, 1) << run.out;
    const std::string shared = property_json(run.stdout_text, "shared-state");
    EXPECT_TRUE(contains(shared, "\"verdict\": \"fail\"")) << shared;
    EXPECT_TRUE(contains(shared, "\"kind\": \"shared-state\", \"replays\": 1, \"failed\": 0")) << shared;
    EXPECT_TRUE(contains(shared, "\"prefix_replays\": 1, \"prefix_failed\": 1")) << shared;
    const std::string trace_file = json_text(shared, "trace_file");
    const std::string prefix_file = json_text(shared, "prefix_file");
    ASSERT_FALSE(trace_file.empty()) << shared;
    ASSERT_FALSE(prefix_file.empty()) << shared;
    EXPECT_TRUE(contains(json_text(shared, "reproduce"), " --prefix " + prefix_file)) << shared;
    const Outcome alone = kvcheck("replay " + trace_file + " --adapter " + plugin);
    EXPECT_EQ(alone.status, 0) << alone.out;
    const Outcome both = kvcheck("replay " + trace_file + " --adapter " + plugin + " --prefix " + prefix_file);
    EXPECT_EQ(both.status, 1) << both.out;
    EXPECT_TRUE(contains(run.stderr_text, "kvcheck run: kvcheck-fault-shared-static: engines share state across instances "
                                          "(the shared-state row: ")) << run.stderr_text;
    // The property's row keeps its failure, labelled.
    const std::string property = property_json(run.stdout_text, "stored-immutable");
    EXPECT_TRUE(contains(property, "\"message\": \"shared-state: engines share state across instances: ")) << property;
}

// An engine that raises on most traces (every merge of several ids): each
// trace is judged without the merges that raised, so the properties are
// judged on nearly every trace; no get_cache merge ever ran, so their pass
// is starred, naming what was not applied; the raises of both searches are
// one group, counted once per trace they raised in.
TEST_F(Cli, EngineErrorsOnMostTracesAreJudgedWithoutTheOperationsThatRaised) {
    const Outcome run = kvcheck(std::string("run --adapter ") + KVCHECK_FAULT_OFTEN +
                                " --property merge-correct --property store-contract --cases 40 --quiet --report json "
                                "--trace-dir " + scratch("often-traces"));
    EXPECT_EQ(run.status, 1) << run.out;
    for (const std::string id : {"merge-correct", "store-contract"}) {
        const std::string json = property_json(run.stdout_text, id);
        EXPECT_TRUE(contains(json, "\"verdict\": \"pass\", \"cases\": 40, \"judged\": ")) << json;
        EXPECT_GE(json_number(json, "judged"), 36u) << json;
        EXPECT_TRUE(contains(json, "\"not_applied\": \"get_cache of several parts (a merge): each of the ")) << json;
    }
    const std::string errors = property_json(run.stdout_text, "engine-error");
    EXPECT_EQ(occurrences(errors, "\"found_while_searching\": "), 1u) << errors;
    EXPECT_TRUE(contains(errors, "kvcheck-fault-often: cannot merge, starting at")) << errors;
    EXPECT_GE(counts_summed(errors), 8u) << errors;
}

// M3 breaks single-copy two ways: generate and generate_stream (two paths
// of an engine) each copy an owned copy again; the search goes on past the
// first failure and reports the second,
// each shrunk, each with its trace file; --failures 1 reports the first
// alone, as kvcheck did before it kept several.
const std::string two_ways_mutant = "M3";
const std::string two_ways_property = "single-copy";

TEST_F(Cli, AMutantBrokenTwoWaysReportsBoth) {
    const std::string traces = scratch("two-ways");
    const std::string base = std::string("run --adapter ") + two_ways_mutant + " --property " + two_ways_property +
                             " --cases 60 --quiet --report json --trace-dir " + traces;
    const Outcome several = kvcheck(base);
    EXPECT_EQ(several.status, 1) << several.out;
    const std::string json = property_json(several.stdout_text, two_ways_property);
    EXPECT_TRUE(contains(json, "\"verdict\": \"fail\"")) << json;
    EXPECT_GE(occurrences(json, "\"found_while_searching\": "), 2u) << json;
    const std::string stem = traces + "/" + two_ways_mutant + "-" + two_ways_property;
    for (const std::string& file : {stem + ".trace", stem + "-2.trace"}) {
        ASSERT_TRUE(std::filesystem::exists(file)) << file << "\n" << json;
        const Outcome replay = kvcheck("replay " + file + " --adapter " + two_ways_mutant);
        EXPECT_EQ(replay.status, 1) << replay.out;
        EXPECT_TRUE(contains(replay.stdout_text, std::string("ERROR: ") + two_ways_property + ": ")) << replay.out;
    }
    std::filesystem::remove_all(traces);
    const Outcome one = kvcheck(base + " --failures 1");
    EXPECT_EQ(one.status, 1) << one.out;
    const std::string first = property_json(one.stdout_text, two_ways_property);
    EXPECT_EQ(occurrences(first, "\"found_while_searching\": "), 1u) << first;
    EXPECT_TRUE(std::filesystem::exists(stem + ".trace"));
    EXPECT_FALSE(std::filesystem::exists(stem + "-2.trace"));
    // The first failure is the same either way, and its top-level fields are its own.
    EXPECT_EQ(json.substr(json.find("\"trace\": "), json.find("\"found_length\"") - json.find("\"trace\": ")),
              first.substr(first.find("\"trace\": "), first.find("\"found_length\"") - first.find("\"trace\": ")));
    EXPECT_EQ(kvcheck(base + " --failures 0").status, 2);
}

}  // namespace
