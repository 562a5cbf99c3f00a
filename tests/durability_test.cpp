// The dump shim's record (harness/durability/dumpshim.h), the power-cut
// model built on it (power_cut.h), and the reference store's dump under
// both: killed at every counted call and cut at every state the model
// gives, it never loses the previous dump, and after it returns it survives.
// Kill points are counted calls: nothing here depends on timing.
#include "durability/dir_image.h"
#include "durability/dumpshim.h"
#include "durability/power_cut.h"
#include "durability/shim_log.h"
#include "kv/store.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using kvcheck::durability::Call;
using kvcheck::durability::CrashState;
using kvcheck::durability::DirImage;
using kvcheck::durability::PowerCutModel;
using kvcheck::durability::ShimEvent;

// A directory for one test, removed with everything in it at the end.
class TempDir {
  public:
    explicit TempDir(const std::string& tag) : path_(kvtest::fresh_dir("durability-" + tag)) {}
    ~TempDir() {
        std::error_code ignored;
        fs::remove_all(path_, ignored);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }
    std::string operator/(const std::string& name) const { return path_ + "/" + name; }

  private:
    std::string path_;
};

// A shim log in memory; armed on `dir` while it lives.
class Recording {
  public:
    Recording(const std::string& dir, long long kill_at = -1) : fd_(::memfd_create("durability-test", 0)) {
        EXPECT_GE(fd_, 0);
        EXPECT_EQ(kvcheck_dumpshim_arm(dir.c_str(), fd_, kill_at), 0);
    }
    ~Recording() {
        kvcheck_dumpshim_disarm();
        ::close(fd_);
    }
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;
    int fd() const { return fd_; }
    std::vector<ShimEvent> events() const { return kvcheck::durability::read_shim_log_fd(fd_); }

  private:
    int fd_;
};

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A file made the way a careful dump makes one: create, write, fsync, close.
void write_flushed(const std::string& path, const std::string& text, bool flush = true) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    if (flush) {
        ASSERT_EQ(::fsync(fd), 0);
    }
    ASSERT_EQ(::close(fd), 0);
}

void sync_directory(const std::string& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fsync(fd), 0);
    ASSERT_EQ(::close(fd), 0);
}

std::string kinds(const std::vector<ShimEvent>& events) {
    std::string text;
    for (const ShimEvent& event : events) text += (text.empty() ? "" : "; ") + kvcheck::durability::describe(event);
    return text;
}

// ---- the record -------------------------------------------------------------------

TEST(DumpShim, RecordsTheCallsUnderItsDirectoryAndNothingElse) {
    const TempDir dir("record");
    const TempDir outside("outside");
    write_text(dir / "b", "old");
    std::vector<ShimEvent> events;
    long long calls = 0;
    {
        const Recording recording(dir.path());
        write_flushed(dir / "a", "hello");
        write_flushed(outside / "x", "not recorded");
        ASSERT_EQ(::rename((dir / "a").c_str(), (dir / "b").c_str()), 0);
        sync_directory(dir.path());
        ASSERT_EQ(::mkdir((dir / "sub").c_str(), 0755), 0);
        ASSERT_EQ(::unlink((dir / "b").c_str()), 0);
        calls = kvcheck_dumpshim_calls();
        events = recording.events();
    }
    ASSERT_EQ(events.size(), 10u) << kinds(events);
    const auto at = [&](std::size_t i) -> const ShimEvent& { return events[i]; };
    EXPECT_EQ(at(0).kind, Call::open);
    EXPECT_EQ(at(0).path, "a");
    EXPECT_TRUE(at(0).has(KVCHECK_SHIM_CREATED));
    EXPECT_EQ(at(1).kind, Call::write);
    EXPECT_EQ(at(1).length, 5);
    EXPECT_EQ(at(2).kind, Call::fsync);
    EXPECT_EQ(at(2).data, "hello") << "an fsync carries the content it made durable";
    EXPECT_EQ(at(3).kind, Call::close);
    EXPECT_EQ(at(4).kind, Call::rename);
    EXPECT_EQ(at(4).path2, "b");
    EXPECT_TRUE(at(4).has(KVCHECK_SHIM_VICTIM));
    EXPECT_EQ(at(4).data, "old") << "a rename over a file carries the replaced content";
    EXPECT_EQ(at(5).kind, Call::open);
    EXPECT_EQ(at(5).path, "");
    EXPECT_TRUE(at(5).has(KVCHECK_SHIM_DIRECTORY));
    EXPECT_EQ(at(6).kind, Call::fsync);
    EXPECT_TRUE(at(6).has(KVCHECK_SHIM_DIRECTORY));
    EXPECT_EQ(at(7).kind, Call::close);
    EXPECT_EQ(at(8).kind, Call::mkdir);
    EXPECT_EQ(at(9).kind, Call::unlink);
    EXPECT_EQ(at(9).data, "hello");
    // Counted: create, write, fsync, close, rename, fsync of the directory,
    // mkdir, unlink; the directory's read-only open and close are not.
    const std::vector<std::int64_t> numbers = {0, 1, 2, 3, 4, -1, 5, -1, 6, 7};
    for (std::size_t i = 0; i < numbers.size(); ++i) EXPECT_EQ(at(i).call, numbers[i]) << kvcheck::durability::describe(at(i));
    EXPECT_EQ(calls, 8);
    EXPECT_EQ(kvcheck::durability::counted_calls(events), 8);
}

TEST(DumpShim, IsInertUntilArmed) {
    const TempDir dir("inert");
    write_flushed(dir / "a", "x");
    const Recording recording(dir.path());
    kvcheck_dumpshim_disarm();
    write_flushed(dir / "b", "y");
    EXPECT_EQ(kvcheck_dumpshim_calls(), 0);
    EXPECT_TRUE(recording.events().empty());
}

TEST(DumpShim, KillsTheProcessJustBeforeTheChosenCall) {
    const TempDir dir("kill");
    const int log = ::memfd_create("durability-kill", 0);
    ASSERT_GE(log, 0);
    std::fflush(nullptr);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        if (kvcheck_dumpshim_arm(dir.path().c_str(), log, 2) != 0) ::_exit(2);
        const int fd = ::open((dir / "a").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (::write(fd, "hello", 5) != 5) ::_exit(3);
        ::fsync(fd);  // call 2: never runs
        ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    const std::vector<ShimEvent> events = kvcheck::durability::read_shim_log_fd(log);
    ::close(log);
    ASSERT_EQ(events.size(), 3u) << kinds(events);
    EXPECT_EQ(events[0].kind, Call::open);
    EXPECT_EQ(events[1].kind, Call::write);
    EXPECT_EQ(events[2].kind, Call::kill);
    EXPECT_EQ(events[2].call, 2);
    EXPECT_EQ(read_text(dir / "a"), "hello") << "what was written before the kill stays (no power was cut)";
}

TEST(DumpShim, FollowsStdioDuplicatesAndDescriptorsOpenedBeforeArming) {
    const TempDir dir("follow");
    const int early = ::open((dir / "early").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(early, 0);
    std::vector<ShimEvent> events;
    {
        const Recording recording(dir.path());
        FILE* file = std::fopen((dir / "s").c_str(), "w");
        ASSERT_NE(file, nullptr);
        std::fputs("stdio", file);
        std::fflush(file);
        ASSERT_EQ(::fsync(::fileno(file)), 0);
        ASSERT_EQ(std::fclose(file), 0);
        {
            std::ofstream stream(dir / "o", std::ios::binary);  // libstdc++: fopen64, write, fclose
            stream << "ofstream";
        }
        const int reopened = ::open((dir / "o").c_str(), O_RDONLY);
        ASSERT_EQ(::fsync(reopened), 0);
        ::close(reopened);
        ASSERT_EQ(::write(early, "e", 1), 1);
        const int copy = ::dup(early);
        ASSERT_EQ(::fsync(copy), 0);
        ::close(copy);
        events = recording.events();
    }
    ::close(early);
    const auto find = [&](Call kind, const std::string& path) {
        return std::find_if(events.begin(), events.end(), [&](const ShimEvent& e) { return e.kind == kind && e.path == path; });
    };
    ASSERT_NE(find(Call::open, "s"), events.end()) << kinds(events);
    EXPECT_TRUE(find(Call::open, "s")->has(KVCHECK_SHIM_CREATED));
    ASSERT_NE(find(Call::fsync, "s"), events.end()) << kinds(events);
    EXPECT_EQ(find(Call::fsync, "s")->data, "stdio");
    EXPECT_NE(find(Call::close, "s"), events.end()) << kinds(events);
    ASSERT_NE(find(Call::open, "o"), events.end()) << "std::ofstream: " << kinds(events);
    EXPECT_TRUE(find(Call::open, "o")->has(KVCHECK_SHIM_CREATED));
    EXPECT_NE(find(Call::write, "o"), events.end()) << kinds(events);
    ASSERT_NE(find(Call::fsync, "o"), events.end()) << kinds(events);
    EXPECT_EQ(find(Call::fsync, "o")->data, "ofstream");
    EXPECT_NE(find(Call::write, "early"), events.end()) << kinds(events);
    ASSERT_NE(find(Call::fsync, "early"), events.end()) << "an fsync through a duplicate: " << kinds(events);
    EXPECT_EQ(find(Call::fsync, "early")->data, "e");
}

// Issue 28: an fsync made through syscall(2) bypasses the fsync wrapper.
// The shim sees it all the same, as a call the model does not follow named
// "syscall(SYS_fsync)", and the model says so (an engine error naming the
// call in dump-safe) instead of taking the file for never flushed.
TEST(DumpShim, AFileCallThroughSyscallIsSeenAndNamed) {
    const TempDir dir("syscall");
    const DirImage before = kvcheck::durability::read_image(dir.path());
    std::vector<ShimEvent> events;
    {
        const Recording recording(dir.path());
        const int fd = ::open((dir / "d").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(::write(fd, "data", 4), 4);
        ASSERT_EQ(::syscall(SYS_fsync, fd), 0);
        ASSERT_EQ(::close(fd), 0);
        ASSERT_EQ(::syscall(SYS_getpid), ::getpid()) << "other calls pass through";
        events = recording.events();
    }
    const auto unmodelled = std::find_if(events.begin(), events.end(), [](const ShimEvent& e) { return e.kind == Call::unmodelled; });
    ASSERT_NE(unmodelled, events.end()) << kinds(events);
    EXPECT_EQ(unmodelled->data, "syscall(SYS_fsync)") << kinds(events);
    EXPECT_EQ(unmodelled->path, "d") << kinds(events);
    const PowerCutModel model =
        kvcheck::durability::power_cut_states(before, events, kvcheck::durability::read_image(dir.path()));
    EXPECT_NE(model.unfollowed.find("syscall(SYS_fsync)"), std::string::npos) << model.unfollowed;
}

TEST(DumpShim, AWriteOnASynchronousDescriptorIsAFlush) {
    const TempDir dir("dsync");
    std::vector<ShimEvent> events;
    {
        const Recording recording(dir.path());
        const int fd = ::open((dir / "a").c_str(), O_WRONLY | O_CREAT | O_DSYNC, 0644);
        ASSERT_EQ(::write(fd, "abc", 3), 3);
        ::close(fd);
        events = recording.events();
    }
    const auto flush = std::find_if(events.begin(), events.end(), [](const ShimEvent& e) { return e.kind == Call::fsync; });
    ASSERT_NE(flush, events.end()) << kinds(events);
    EXPECT_TRUE(flush->has(KVCHECK_SHIM_IMPLIED));
    EXPECT_EQ(flush->data, "abc");
}

// ---- the model -----------------------------------------------------------------------

ShimEvent event(Call kind, const std::string& path, int fd = -1, std::uint16_t flags = 0) {
    ShimEvent e;
    e.kind = kind;
    e.path = path;
    e.fd = fd;
    e.flags = flags;
    return e;
}

ShimEvent flushed(int fd, const std::string& path, const std::string& content) {
    ShimEvent e = event(Call::fsync, path, fd);
    e.data = content;
    return e;
}

ShimEvent renamed(const std::string& from, const std::string& to, const std::string& victim) {
    ShimEvent e = event(Call::rename, from, -1, KVCHECK_SHIM_VICTIM);
    e.path2 = to;
    e.data = victim;
    return e;
}

DirImage image(std::map<std::string, std::optional<std::string>> entries) { return DirImage{std::move(entries)}; }

std::vector<DirImage> images_of(const PowerCutModel& model) {
    std::vector<DirImage> images;
    for (const CrashState& state : model.states) images.push_back(state.image);
    return images;
}

bool has_state(const PowerCutModel& model, const DirImage& wanted) {
    const std::vector<DirImage> images = images_of(model);
    return std::find(images.begin(), images.end(), wanted) != images.end();
}

// The reference's dump, over a previous one: create T, write, fsync T,
// close, rename T over D, and (when `sync_dir`) fsync the directory.
std::vector<ShimEvent> careful_dump(bool flush_file, bool sync_dir) {
    std::vector<ShimEvent> events = {event(Call::open, "T", 3, KVCHECK_SHIM_CREATED), event(Call::write, "T", 3)};
    if (flush_file) events.push_back(flushed(3, "T", "new"));
    events.push_back(event(Call::close, "T", 3));
    events.push_back(renamed("T", "D", "old"));
    if (sync_dir) {
        events.push_back(event(Call::open, "", 4, KVCHECK_SHIM_DIRECTORY));
        events.push_back(event(Call::fsync, "", 4, KVCHECK_SHIM_DIRECTORY));
    }
    return events;
}

const DirImage old_dump = image({{"D", "old"}});
const DirImage new_dump = image({{"D", "new"}});

TEST(PowerCut, ADumpFlushedRenamedAndSyncedLeavesOnlyItself) {
    const PowerCutModel model = kvcheck::durability::power_cut_states(old_dump, careful_dump(true, true), new_dump);
    EXPECT_TRUE(model.unfollowed.empty()) << model.unfollowed;
    EXPECT_EQ(model.pending, 0u);
    ASSERT_EQ(model.states.size(), 1u);
    EXPECT_EQ(model.states[0].image, new_dump);
    EXPECT_EQ(model.created, std::vector<std::string>{"T"});
}

TEST(PowerCut, UnflushedBytesAreLostOrZeroedUnderADurableName) {
    const PowerCutModel model = kvcheck::durability::power_cut_states(old_dump, careful_dump(false, true), new_dump);
    EXPECT_TRUE(model.unfollowed.empty()) << model.unfollowed;
    EXPECT_TRUE(has_state(model, new_dump));
    EXPECT_TRUE(has_state(model, image({{"D", ""}}))) << "the rename durable, the bytes lost";
    EXPECT_TRUE(has_state(model, image({{"D", std::string(3, '\0')}}))) << "the size durable, the bytes zeros";
    EXPECT_FALSE(has_state(model, old_dump)) << "the directory was synced: the rename cannot be undone";
}

TEST(PowerCut, RenamesNotFollowedByADirectorySyncAreUndoneAsAPrefix) {
    const PowerCutModel model = kvcheck::durability::power_cut_states(old_dump, careful_dump(true, false), new_dump);
    EXPECT_TRUE(model.unfollowed.empty()) << model.unfollowed;
    EXPECT_EQ(model.pending, 2u);  // the create of T and the rename
    EXPECT_TRUE(has_state(model, old_dump)) << "both undone";
    EXPECT_TRUE(has_state(model, image({{"D", "old"}, {"T", "new"}}))) << "the create kept, the rename undone";
    EXPECT_TRUE(has_state(model, new_dump));
    EXPECT_EQ(model.states.size(), 3u) << "T was flushed: the data outcomes are all the same";
    // T was flushed: no state holds a D whose bytes are lost.
    EXPECT_FALSE(has_state(model, image({{"D", ""}})));
    // Never the rename without the create it renames (a prefix, not any subset).
    for (const CrashState& state : model.states) EXPECT_FALSE(state.image.entries.empty()) << state.description;
}

TEST(PowerCut, ManyPendingChangesAreSampledEvenlyNoneAndAllIncluded) {
    DirImage before;
    std::vector<ShimEvent> events;
    for (int i = 0; i < 20; ++i) {
        const std::string name = "f" + std::to_string(100 + i);
        before.entries[name] = "x";
        events.push_back(event(Call::unlink, name));
    }
    const PowerCutModel model = kvcheck::durability::power_cut_states(before, events, DirImage{});
    EXPECT_TRUE(model.unfollowed.empty()) << model.unfollowed;
    EXPECT_EQ(model.pending, 20u);
    ASSERT_EQ(model.states.size(), 8u);  // 8 prefixes, the data outcomes equal (nothing was written)
    EXPECT_EQ(model.states.front().image, before);
    EXPECT_EQ(model.states.back().image, DirImage{});
}

TEST(PowerCut, ARecordThatDoesNotExplainTheDirectoryIsUnfollowed) {
    DirImage stray = new_dump;
    stray.entries["stray"] = "?";
    EXPECT_NE(kvcheck::durability::power_cut_states(old_dump, careful_dump(true, true), stray).unfollowed, "");
    std::vector<ShimEvent> linked = careful_dump(true, true);
    ShimEvent link = event(Call::unmodelled, "L");
    link.data = "a hard link";
    linked.push_back(link);
    const PowerCutModel model = kvcheck::durability::power_cut_states(old_dump, linked, new_dump);
    EXPECT_NE(model.unfollowed.find("a hard link"), std::string::npos) << model.unfollowed;
}

// ---- directory images ------------------------------------------------------------------

TEST(DirImage, ReadsAndWritesNestedTrees) {
    const TempDir dir("image");
    const DirImage tree = image({{"a", "bytes"}, {"empty", ""}, {"sub", std::nullopt}, {"sub/b", std::string("\0\1", 2)}});
    kvcheck::durability::write_image(dir.path(), tree);
    EXPECT_EQ(kvcheck::durability::read_image(dir.path()), tree);
    EXPECT_EQ(kvcheck::durability::read_image(dir / "missing"), DirImage{});
    ASSERT_EQ(::symlink("a", (dir / "link").c_str()), 0);
    EXPECT_THROW(kvcheck::durability::read_image(dir.path()), std::runtime_error);
}

// ---- the reference store under the shim ------------------------------------------------

kv::Store store_of(std::uint64_t seed, int items) {
    kv::Store store;
    for (int i = 0; i < items; ++i) {
        store.add({{"item" + std::to_string(i), kvtest::make_cache(kv::Layout::modern, 2, 3, seed + static_cast<std::uint64_t>(i)), {}}});
    }
    return store;
}

struct DumpRecord {
    std::vector<ShimEvent> events;
    DirImage after;
    bool killed = false;
};

// `store.dump(dir)` in a child with the shim armed (killed at `kill_at` unless negative).
DumpRecord record_dump(const kv::Store& store, const std::string& dir, long long kill_at) {
    const int log = ::memfd_create("durability-dump", 0);
    EXPECT_GE(log, 0);
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child == 0) {
        if (kvcheck_dumpshim_arm(dir.c_str(), log, kill_at) != 0) ::_exit(2);
        try {
            store.dump(dir);
        } catch (...) {
            ::_exit(3);
        }
        ::_exit(0);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    DumpRecord record;
    record.events = kvcheck::durability::read_shim_log_fd(log);
    ::close(log);
    record.after = kvcheck::durability::read_image(dir);
    record.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    EXPECT_TRUE(record.killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) << "status " << status;
    return record;
}

// The number of items a fresh store loads from `image`, or -1 when the load fails.
int items_loaded(const DirImage& state, const std::string& scratch) {
    kvcheck::durability::write_image(scratch, state);
    kv::Store loaded;
    try {
        loaded.load(scratch);
    } catch (const std::exception&) {
        return -1;
    }
    return static_cast<int>(loaded.size());
}

// A pid no process has: a child's, once it has exited and been reaped. The
// reference removes the temporaries of dead processes (and its own), never
// a running process's dump in progress.
std::string dead_pid() {
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    ::waitpid(child, nullptr, 0);
    return std::to_string(child);
}

TEST(ReferenceDump, DumpAndLoadRemoveWhatACrashedDumpLeft) {
    const TempDir dir("leftovers");
    const std::string leftover = dir / (std::string(kv::dump_file_name) + kv::dump_temporary_suffix + dead_pid());
    const std::string unrelated = dir / "notes.txt";
    write_text(unrelated, "not the store's");
    write_text(leftover, "a crashed dump's temporary");
    store_of(1, 1).dump(dir.path());
    EXPECT_FALSE(fs::exists(leftover)) << "a dump removes it";
    write_text(leftover, "another one");
    kv::Store loaded;
    loaded.load(dir.path());
    EXPECT_FALSE(fs::exists(leftover)) << "a load removes it";
    EXPECT_TRUE(fs::exists(unrelated)) << "and nothing else";
    write_text(leftover, "and one in a directory without a dump");
    fs::remove(dir / kv::dump_file_name);
    EXPECT_THROW(loaded.load(dir.path()), kv::DumpError);
    EXPECT_FALSE(fs::exists(leftover)) << "even a failing load removes it";
    EXPECT_EQ(loaded.size(), 1u) << "and the failed load changed nothing in memory";
}

TEST(ReferenceDump, SurvivesAPowerCutOnceItReturned) {
    const TempDir dir("returned");
    const TempDir scratch("returned-scratch");
    store_of(1, 2).dump(dir.path());
    const DirImage before = kvcheck::durability::read_image(dir.path());
    const DumpRecord record = record_dump(store_of(2, 3), dir.path(), -1);
    ASSERT_FALSE(record.killed);
    const PowerCutModel model = kvcheck::durability::power_cut_states(before, record.events, record.after);
    ASSERT_TRUE(model.unfollowed.empty()) << model.unfollowed;
    EXPECT_EQ(model.pending, 0u) << "the reference syncs its directory after the rename";
    for (const CrashState& state : model.states) EXPECT_EQ(items_loaded(state.image, scratch.path()), 3) << state.description;
}

TEST(ReferenceDump, KilledAtEveryCallAndCutThereItKeepsThePreviousDumpOrTheNew) {
    const TempDir dir("every-call");
    const TempDir scratch("every-call-scratch");
    const kv::Store previous = store_of(3, 2);
    const kv::Store next = store_of(4, 3);
    previous.dump(dir.path());
    write_text(dir / (std::string(kv::dump_file_name) + kv::dump_temporary_suffix + dead_pid()), "a crashed dump's leftover");
    const DirImage before = kvcheck::durability::read_image(dir.path());
    const std::int64_t calls = kvcheck::durability::counted_calls(record_dump(next, dir.path(), -1).events);
    ASSERT_GE(calls, 7) << "remove the leftover, create, write, fsync, close, rename, fsync the directory";
    std::size_t states = 0;
    for (std::int64_t point = 0; point < calls; ++point) {
        kvcheck::durability::write_image(dir.path(), before);
        const DumpRecord record = record_dump(next, dir.path(), point);
        ASSERT_TRUE(record.killed) << "point " << point;
        const int killed_items = items_loaded(record.after, scratch.path());
        EXPECT_TRUE(killed_items == 2 || killed_items == 3)
            << "killed before call " << point << ": " << kvcheck::durability::describe(record.after);
        const PowerCutModel model = kvcheck::durability::power_cut_states(before, record.events, record.after);
        ASSERT_TRUE(model.unfollowed.empty()) << "point " << point << ": " << model.unfollowed;
        for (const CrashState& state : model.states) {
            const int items = items_loaded(state.image, scratch.path());
            EXPECT_TRUE(items == 2 || items == 3) << "point " << point << ", " << state.description << ": " << items;
            // The load removed every temporary.
            for (const std::string& name : kvcheck::durability::read_image(scratch.path()).names()) {
                EXPECT_EQ(name, kv::dump_file_name) << "point " << point << ", " << state.description;
            }
            ++states;
        }
    }
    EXPECT_GT(states, static_cast<std::size_t>(calls)) << "the model must give more than the kill states";
}

// ---- an engine that runs as a program of its own ------------------------------------------

// Python, started with the shim preloaded and armed from the environment,
// writes a dump the way `tmp, os.replace` code does; with and without an
// fsync of the file. The record and the model see what the program did.
PowerCutModel python_dump(const TempDir& dir, bool flush) {
    const std::string script = std::string("import os\n") +
                               "d = os.environ['DUMP_DIR']\n"
                               "with open(d + '/x.tmp', 'wb') as f:\n"
                               "    f.write(b'new dump')\n" +
                               (flush ? "    f.flush(); os.fsync(f.fileno())\n" : "") +
                               "os.replace(d + '/x.tmp', d + '/x')\n"
                               "fd = os.open(d, os.O_RDONLY)\n"
                               "os.fsync(fd)\n"
                               "os.close(fd)\n";
    write_text(dir / "x", "old dump");
    const DirImage before = kvcheck::durability::read_image(dir.path());
    const int log = ::memfd_create("durability-python", 0);  // inherited by the program
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child == 0) {
        const std::string runtime = KVCHECK_PRELOAD_RUNTIME;
        ::setenv("LD_PRELOAD", (runtime.empty() ? "" : runtime + " ").append(KVCHECK_DUMPSHIM_PATH).c_str(), 1);
        if (!runtime.empty()) ::setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
        ::setenv("KVCHECK_DUMPSHIM_DIR", dir.path().c_str(), 1);
        ::setenv("KVCHECK_DUMPSHIM_LOG_FD", std::to_string(log).c_str(), 1);
        ::setenv("DUMP_DIR", dir.path().c_str(), 1);
        ::execl("/usr/bin/python3", "python3", "-c", script.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    const std::vector<ShimEvent> events = kvcheck::durability::read_shim_log_fd(log);
    ::close(log);
    return kvcheck::durability::power_cut_states(before, events,
                                                 kvcheck::durability::read_image(dir.path()));
}

TEST(PreloadedShim, SeesAPythonProgramsDumpWithoutAnFsync) {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const TempDir dir("python-unflushed");
    const PowerCutModel model = python_dump(dir, false);
    ASSERT_TRUE(model.unfollowed.empty()) << model.unfollowed;
    EXPECT_TRUE(has_state(model, image({{"x", ""}}))) << "renamed durably, its bytes never flushed";
}

TEST(PreloadedShim, SeesAPythonProgramsCarefulDump) {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const TempDir dir("python-flushed");
    const PowerCutModel model = python_dump(dir, true);
    ASSERT_TRUE(model.unfollowed.empty()) << model.unfollowed;
    ASSERT_EQ(model.states.size(), 1u);
    EXPECT_EQ(model.states[0].image, image({{"x", "new dump"}}));
}

}  // namespace
