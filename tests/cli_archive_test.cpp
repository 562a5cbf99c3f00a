// check-dump on the hostile archives of issue 28 (fuzz/hostile_archives.h),
// in a file of its own: the cli tests' kvcheck() and the kvcheck namespace
// of the archive builder cannot meet under one using-directive.
#include "cli_util.h"
#include "hostile_archives.h"

#include <string>

namespace {

namespace cli = kvtest::cli;
using Cli = cli::Cli;

// Issue 28: check-dump decides which records torch reads as torch does,
// and refuses an archive that torch (or another zip reader) could read
// otherwise. Before, the deep tuple behind a case-variant name or a ZIP64
// directory killed check-dump (SIGSEGV, exit 139) and the others passed
// the pickle check.
TEST_F(Cli, CheckDumpRefusesArchivesThatTorchWouldReadOtherwise) {
    const std::string real = cli::read_file(KVCHECK_SOURCE_DIR "/corpus/dump_load/one-modern-f32.pt");
    const auto hostile = kvcheck::fuzz::hostile_archives(kvcheck::fuzz::read_zip_records(real));
    ASSERT_GE(hostile.size(), 7u);
    // One check-dump of them all: each file's line says INVALID (its own
    // exit code 1, not 2) and names its fault; the exit code is the worst.
    std::string files;
    for (const auto& archive : hostile) {
        cli::write_file(cli::scratch(archive.name), archive.bytes);
        files += " " + cli::scratch(archive.name);
    }
    const cli::Outcome outcome = cli::kvcheck("check-dump" + files);
    EXPECT_EQ(outcome.status, 1) << outcome.out;
    for (const auto& archive : hostile) {
        SCOPED_TRACE(archive.name);
        const std::string file = cli::scratch(archive.name);
        const std::string line = cli::line_starting(outcome.stdout_text, file + ": ");
        EXPECT_EQ(line.rfind(file + ": INVALID: corrupt dump " + file + ": ", 0), 0u) << outcome.out;
        EXPECT_TRUE(cli::contains(line, archive.fault)) << line;
    }
    const std::string rebuilt = cli::scratch("rebuilt-zip64.pt");
    cli::write_file(rebuilt, kvcheck::fuzz::write_zip({kvcheck::fuzz::read_zip_records(real), {}, true, {}}));
    const cli::Outcome sound = cli::kvcheck("check-dump " + rebuilt);
    EXPECT_EQ(sound.status, 0) << sound.out;
    EXPECT_TRUE(cli::contains(sound.stdout_text, "a valid kvcheck dump (format version 1), 1 item")) << sound.out;
}

}  // namespace
