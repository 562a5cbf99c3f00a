#include "durability/dump_kill.h"

#include "durability/child.h"
#include "durability/dir_image.h"
#include "durability/dumpshim.h"
#include "durability/power_cut.h"
#include "durability/shim_log.h"
#include "signal_name.h"

#include "kvcheck/splitmix.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kvcheck::durability {
namespace {

// An anonymous file the shim records into: nothing is left on disk.
class ShimLog {
  public:
    ShimLog() : fd_(::memfd_create("kvcheck-dump-log", MFD_CLOEXEC)) {
        if (fd_ < 0) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
    }
    ~ShimLog() { ::close(fd_); }
    ShimLog(const ShimLog&) = delete;
    ShimLog& operator=(const ShimLog&) = delete;
    int fd() const { return fd_; }
    std::vector<ShimEvent> events() const { return read_shim_log_fd(fd_); }

  private:
    int fd_;
};

// ---- one dump in a child ---------------------------------------------------------

struct DumpRun {
    std::vector<ShimEvent> events;
    DirImage after;
    bool killed = false;  // by the shim, at its kill point
};

// How the dump's process ended: a fork of this one, or a copy of an adapter process.
struct DumpEnd {
    int status = 0;
    bool hung = false;
    std::string error;  // what the dump threw (exit status 3)
};

DumpEnd dump_in_fork(const KillTest& test, int log_fd, std::int64_t kill_at) {
    const ChildEnd end = run_child(
        [&](int) {
            if (kvcheck_dumpshim_arm(test.dir.c_str(), log_fd, kill_at) != 0) {
                throw std::runtime_error("cannot arm the dump shim on " + test.dir);
            }
            test.engine.dump(test.dir);
            kvcheck_dumpshim_disarm();
        },
        test.options.child_seconds_max);
    return {end.status, end.hung, WIFEXITED(end.status) && WEXITSTATUS(end.status) == 3 ? child_error(end.output) : ""};
}

// The log file next to the dump directory (not under it: the shim does not
// record it), removed when read.
std::vector<ShimEvent> dump_through_copy(const KillTest& test, DumpInCopy& copies, std::int64_t kill_at, DumpEnd& end) {
    const std::string log_path = test.dir + ".shim-log";
    const int fd = ::open(log_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot make the dump shim's log " + log_path + ": " + std::strerror(errno));
    struct Remove {
        int fd;
        const std::string& path;
        ~Remove() {
            ::close(fd);
            ::unlink(path.c_str());
        }
    } remove{fd, log_path};
    const DumpInCopy::End copy = copies.dump_in_copy(test.dir, log_path, kill_at);
    end.status = copy.status;
    end.error = copy.error;
    return read_shim_log_fd(fd);
}

DumpRun run_dump(const KillTest& test, std::int64_t kill_at) {
    DumpRun run;
    DumpEnd end;
    if (auto* copies = dynamic_cast<DumpInCopy*>(&test.engine)) {
        run.events = dump_through_copy(test, *copies, kill_at, end);
    } else {
        ShimLog log;
        end = dump_in_fork(test, log.fd(), kill_at);
        run.events = log.events();
    }
    run.after = read_image(test.dir);
    const bool shim_kill = !run.events.empty() && run.events.back().kind == Call::kill;
    const std::string what = kill_at < 0 ? "the dump" : "the dump to be killed at call " + std::to_string(kill_at);
    if (end.hung) throw std::runtime_error(what + " made no progress for " + std::to_string(static_cast<int>(test.options.child_seconds_max)) + " s");
    if (WIFSIGNALED(end.status) && WTERMSIG(end.status) == SIGKILL && shim_kill) {
        run.killed = true;
        return run;
    }
    if (WIFSIGNALED(end.status)) throw std::runtime_error(what + " crashed in its child process (" + posix::signal_name(WTERMSIG(end.status)) + ")");
    if (WIFEXITED(end.status) && WEXITSTATUS(end.status) == 3) throw std::runtime_error(what + " threw: " + end.error);
    if (!WIFEXITED(end.status) || WEXITSTATUS(end.status) != 0) {
        throw std::runtime_error(what + " did not end its child process normally (" + posix::wait_status_text(end.status) + ")");
    }
    return run;
}

// ---- the stores a load gave ----------------------------------------------------------

struct StoreReading {
    std::vector<std::string> ids;
    std::vector<std::uint64_t> digests;
};

// An entry's metadata folded into its digest, so that a dump that loses
// metadata loads unlike the dump (with Capabilities::metadata).
std::uint64_t with_metadata(std::uint64_t digest, const Metadata& metadata) {
    for (const auto& [key, value] : metadata) {
        for (const char c : key + '\0' + value + '\0') digest = splitmix64(digest ^ static_cast<unsigned char>(c));
    }
    return digest;
}

void write_store(Writer& out, Engine& engine) {
    const bool metadata = engine.capabilities().metadata;
    const std::vector<std::string> ids = engine.stored_ids();
    out.number(ids.size());
    for (const std::string& id : ids) {
        out.text(id);
        const std::uint64_t digest = engine.entry_digest(id);
        out.number(metadata ? with_metadata(digest, engine.entry_metadata(id)) : digest);
    }
}

StoreReading read_store(Reader& in) {
    StoreReading store;
    const std::uint64_t count = in.number();
    for (std::uint64_t i = 0; i < count; ++i) {
        store.ids.push_back(in.text());
        store.digests.push_back(in.number());
    }
    return store;
}

// A snapshot's entries as the digests an engine reports for them.
using Digests = std::map<std::string, std::uint64_t>;

Digests digests_of(const Snapshot& snapshot, bool metadata) {
    Digests digests;
    for (const auto& [id, content] : snapshot.entries) {
        const auto view = snapshot.views.find(id);  // an entry the model made
        const std::uint64_t digest = view != snapshot.views.end() ? view_digest(view->second)
                                    : expected_digest(snapshot.window > 0 ? expected_window(content, snapshot.window) : content);
        digests[id] = metadata ? with_metadata(digest, snapshot.metadata.at(id)) : digest;
    }
    return digests;
}

std::string id_list(const std::vector<std::string>& ids) {
    std::string text;
    for (const std::string& id : ids) text += (text.empty() ? "" : " ") + ("\"" + id + "\"");
    return "[" + text + "]";
}

// How `store` differs from `expected` (ids in any order, then content); empty when it does not.
std::string difference(const StoreReading& store, const Digests& expected) {
    std::vector<std::string> have = store.ids;
    std::sort(have.begin(), have.end());
    std::vector<std::string> want;
    for (const auto& [id, digest] : expected) want.push_back(id);
    if (have != want) return "it holds " + id_list(have) + ", the dump " + id_list(want);
    for (std::size_t i = 0; i < store.ids.size(); ++i) {
        if (store.digests[i] != expected.at(store.ids[i])) return "entry \"" + store.ids[i] + "\" holds other content than the dump";
    }
    return {};
}

// ---- loading the states in a fresh process ---------------------------------------------

struct State {
    std::string description;
    DirImage image;
    bool after_return = false;
};

struct StateLoad {
    LoadResult result;
    StoreReading store;
    bool checked_failure = false;  // the failed load was repeated on a store loaded from the complete dump
    LoadResult complete;           // that store's load
    StoreReading after_failure;    // and the store after the repeated load
};

void write_load(Writer& out, const LoadResult& result) {
    out.number(result.ok ? 1 : 0);
    out.text(result.error);
}

LoadResult read_load(Reader& in) {
    LoadResult result;
    result.ok = in.number() != 0;
    result.error = in.text();
    return result;
}

// In the loading child: each state by a fresh engine.
void load_states(int out, const std::function<std::shared_ptr<Engine>()>& fresh, const std::vector<State>& states,
                 const std::vector<std::string>& dirs, const std::string& complete_dir) {
    for (std::size_t i = 0; i < states.size(); ++i) {
        Writer report;
        const std::shared_ptr<Engine> engine = fresh();
        const LoadResult result = engine->load(dirs[i]);
        write_load(report, result);
        if (result.ok) write_store(report, *engine);
        report.number(result.ok ? 0 : 1);
        if (!result.ok) {
            // Once more, from the state as it was, on a store that holds the complete dump.
            write_image(dirs[i], states[i].image);
            const std::shared_ptr<Engine> loaded = fresh();
            write_load(report, loaded->load(complete_dir));
            loaded->load(dirs[i]);
            write_store(report, *loaded);
        }
        Writer framed;
        framed.number(loaded_message);
        framed.text(report.bytes());
        write_all(out, framed.bytes());
    }
}

// The loads the child reported whole, up to its error or its death.
std::vector<StateLoad> read_loads(const std::string& output, std::size_t states) {
    std::vector<StateLoad> loads;
    Reader frames(output);
    while (!frames.done() && loads.size() < states) {
        std::string frame;
        try {
            if (frames.number() != loaded_message) break;
            frame = frames.text();
        } catch (const std::runtime_error&) {
            break;  // cut short by the child's death
        }
        Reader in(frame);
        StateLoad load;
        load.result = read_load(in);
        if (load.result.ok) load.store = read_store(in);
        load.checked_failure = in.number() != 0;
        if (load.checked_failure) {
            load.complete = read_load(in);
            load.after_failure = read_store(in);
        }
        loads.push_back(std::move(load));
    }
    return loads;
}

std::vector<std::string> names_in(const std::vector<std::string>& names, const std::set<std::string>& wanted) {
    std::vector<std::string> found;
    for (const std::string& name : names) {
        if (wanted.count(name) != 0) found.push_back(name);
    }
    return found;
}

std::string kill_text(const DumpRun& run, std::int64_t point, std::int64_t calls) {
    std::string text = "killed before call " + std::to_string(point) + " of " + std::to_string(calls);
    for (auto it = run.events.rbegin(); it != run.events.rend(); ++it) {
        if (it->kind != Call::kill && it->call >= 0) return text + ", after " + describe(*it);
    }
    return text + ", before any";
}

// Scratch directories next to the dump directory, removed when done.
class Scratch {
  public:
    explicit Scratch(std::string base) : base_(std::move(base)) {}
    ~Scratch() {
        for (const std::string& dir : dirs_) {
            std::error_code ignored;
            std::filesystem::remove_all(dir, ignored);
        }
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    std::string make(const std::string& name, const DirImage& image) {
        dirs_.push_back(base_ + "." + name);
        write_image(dirs_.back(), image);
        return dirs_.back();
    }

  private:
    std::string base_;
    std::vector<std::string> dirs_;
};

}  // namespace

bool shim_interposes() {
    static const bool interposes = [] {
        std::string dir = (std::filesystem::temp_directory_path() / "kvcheck-shim-probe-XXXXXX").string();
        if (::mkdtemp(dir.data()) == nullptr) return false;
        long long calls = 0;
        if (kvcheck_dumpshim_arm(dir.c_str(), -1, -1) == 0) {
            ::unlink((dir + "/probe").c_str());  // no such file: a counted call that changes nothing
            calls = kvcheck_dumpshim_calls();
            kvcheck_dumpshim_disarm();
        }
        ::rmdir(dir.c_str());
        return calls == 1;
    }();
    return interposes;
}

std::string shim_library_path(std::string& why_not) {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&kvcheck_dumpshim_arm), &info) == 0 || info.dli_fname == nullptr ||
        std::strstr(info.dli_fname, "dumpshim") == nullptr) {
        why_not = "kvcheck has no libkvcheck_dumpshim.so loaded to preload into it";
        return {};
    }
    std::error_code error;
    const std::string path = std::filesystem::canonical(info.dli_fname, error).string();
    if (error) {
        why_not = std::string("the dump shim kvcheck loaded (") + info.dli_fname + ") is gone: " + error.message();
        return {};
    }
    if (path.find_first_of(" :") != std::string::npos) {
        why_not = "the dump shim's path has a space or a colon, which LD_PRELOAD cannot name: " + path;
        return {};
    }
    return path;
}

KillOutcome run_kill_test(const KillTest& test) {
    if (dynamic_cast<DumpInCopy*>(&test.engine) == nullptr && !shim_interposes()) {
        throw std::runtime_error("the dump shim does not see this process's calls (libkvcheck_dumpshim.so must come before libc)");
    }
    std::filesystem::create_directories(test.dir);
    const DirImage before = read_image(test.dir);
    const PowerCutOptions model_options{test.options.prefixes_max};

    KillOutcome outcome;
    checkers::DumpKilled& fact = outcome.fact;
    fact.expected = test.slot;

    // 1. The dump to its end, and the power cuts right after it returned.
    const DumpRun complete = run_dump(test, -1);
    const PowerCutModel returned = power_cut_states(before, complete.events, complete.after, model_options);
    const std::int64_t calls = counted_calls(complete.events);
    const std::vector<std::string> complete_names = complete.after.names();
    fact.unfollowed = returned.unfollowed;
    std::set<std::string> temporaries(test.temporaries.begin(), test.temporaries.end());
    for (const std::string& name : returned.created) temporaries.insert(name);

    std::vector<State> states;
    for (const CrashState& state : returned.states) {
        states.push_back({"a power cut right after the dump returned (" + state.description + ")", state.image, true});
    }

    // 2. The dump again from the same directory, killed at its point.
    DirImage left = complete.after;
    if (calls > 0) {
        write_image(test.dir, before);
        const std::int64_t point = ((test.point % calls) + calls) % calls;
        const DumpRun killed = run_dump(test, point);
        if (!killed.killed) {
            fact.unfollowed = "the dump made fewer calls the second time than the first (" + std::to_string(counted_calls(killed.events)) +
                              " of " + std::to_string(calls) + "): its kill points are not reproducible";
        }
        const PowerCutModel cut = power_cut_states(before, killed.events, killed.after, model_options);
        if (fact.unfollowed.empty()) fact.unfollowed = cut.unfollowed;
        for (const std::string& name : cut.created) temporaries.insert(name);
        fact.kill = kill_text(killed, point, calls);
        states.push_back({"the directory as the kill left it", killed.after, false});
        for (const CrashState& state : cut.states) {
            if (state.image == killed.after) continue;  // the same directory, loaded already
            states.push_back({"a power cut at the kill (" + state.description + ")", state.image, false});
        }
        left = killed.after;
        outcome.killed = killed.killed;
    }
    for (const std::string& name : complete_names) temporaries.erase(name);
    outcome.temporaries = names_in(left.names(), temporaries);
    if (!fact.unfollowed.empty()) return outcome;  // nothing may be concluded from the states

    // 3. Each state loaded by a fresh engine in a fresh process.
    Scratch scratch(test.dir);
    const std::string complete_dir = scratch.make("complete", complete.after);
    std::vector<std::string> dirs;
    for (std::size_t i = 0; i < states.size(); ++i) dirs.push_back(scratch.make("state-" + std::to_string(i), states[i].image));
    const ChildEnd end = run_child([&](int out) { load_states(out, test.fresh, states, dirs, complete_dir); },
                                   test.options.child_seconds_max);
    const std::vector<StateLoad> loads = read_loads(end.output, states.size());
    if (loads.size() < states.size()) {
        const std::string state = states[loads.size()].description;
        if (end.hung) throw std::runtime_error("a fresh engine made no progress loading " + state);
        if (WIFSIGNALED(end.status)) throw std::runtime_error("a fresh engine crashed (" + posix::signal_name(WTERMSIG(end.status)) + ") loading " + state);
        if (WIFEXITED(end.status) && WEXITSTATUS(end.status) == 3) {
            throw std::runtime_error("a fresh engine threw loading " + state + ": " + child_error(end.output));
        }
        throw std::runtime_error("a fresh engine's process ended early (" + posix::wait_status_text(end.status) + ") loading " + state);
    }

    const bool metadata = test.engine.capabilities().metadata;
    const Digests now = digests_of(test.store, metadata);
    std::vector<Digests> previous;
    for (const Snapshot& snapshot : test.slot.candidates) previous.push_back(digests_of(snapshot, metadata));
    for (std::size_t i = 0; i < states.size(); ++i) {
        const StateLoad& load = loads[i];
        checkers::CrashLoad judged;
        judged.state = states[i].description;
        judged.after_return = states[i].after_return;
        judged.result = load.result;
        if (load.result.ok) {
            judged.difference = difference(load.store, now);
            judged.matched = judged.difference.empty();
            for (std::size_t k = 0; !judged.matched && !judged.after_return && k < previous.size(); ++k) {
                judged.matched = difference(load.store, previous[k]).empty();
            }
        }
        judged.leftovers = names_in(states[i].image.names(), temporaries);
        if (load.checked_failure && load.complete.ok) judged.changed_by_failure = difference(load.after_failure, now);
        fact.loads.push_back(std::move(judged));
    }
    return outcome;
}

}  // namespace kvcheck::durability
