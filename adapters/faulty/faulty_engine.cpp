// The fault plugins: the vector engine (adapters/examples) with one fault
// injected, to prove that kvcheck survives an adapter that crashes, aborts,
// throws, leaks, hangs, exits, prints or names itself with hostile text, and
// reports it against the property and trace that triggered it.
// KVCHECK_FAULT (set per plugin by CMakeLists.txt) selects the fault. It
// strikes on the third call of `add` on one engine (the leak: on the first,
// and on every frequent call after it): kvcheck makes one engine per trace,
// so any trace with three adds triggers it, and the shrunk trace is three
// adds. Two faults strike before any engine exists: load-segv crashes in a
// static constructor (while the library is loaded), load-exit exits from
// the plugin's entry point. shared-static is no crash: its engines share a
// static cache (a trace fails only after another ran in its process).
#include "adapter.h"

#include <kvcheck/plugin.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#define KVCHECK_FAULT_SEGV 1
#define KVCHECK_FAULT_ABORT 2
#define KVCHECK_FAULT_THROW 3
#define KVCHECK_FAULT_LEAK 4
#define KVCHECK_FAULT_HANG 5
#define KVCHECK_FAULT_LOAD_SEGV 6
#define KVCHECK_FAULT_LOAD_EXIT 7
#define KVCHECK_FAULT_EXIT 8
#define KVCHECK_FAULT_NOISY 9
#define KVCHECK_FAULT_NAME_ESCAPE 10
#define KVCHECK_FAULT_RESERVE 11
#define KVCHECK_FAULT_RARE 12
#define KVCHECK_FAULT_OFTEN 13
#define KVCHECK_FAULT_EXIT_CREATE 14
#define KVCHECK_FAULT_EXIT_DESTROY 15
#define KVCHECK_FAULT_SHARED_STATIC 16
#define KVCHECK_FAULT_ODD_IDS 17

#if KVCHECK_FAULT == KVCHECK_FAULT_SEGV
#define KVCHECK_FAULT_NAME "kvcheck-fault-segv"
#define KVCHECK_FAULT_WHAT "writes through a null pointer"
#elif KVCHECK_FAULT == KVCHECK_FAULT_ABORT
#define KVCHECK_FAULT_NAME "kvcheck-fault-abort"
#define KVCHECK_FAULT_WHAT "calls std::abort"
#elif KVCHECK_FAULT == KVCHECK_FAULT_THROW
#define KVCHECK_FAULT_NAME "kvcheck-fault-throw"
#define KVCHECK_FAULT_WHAT "throws std::runtime_error"
#elif KVCHECK_FAULT == KVCHECK_FAULT_LEAK
#define KVCHECK_FAULT_NAME "kvcheck-fault-leak"
#define KVCHECK_FAULT_WHAT "allocates and touches 64 MiB per call, never freed"
#elif KVCHECK_FAULT == KVCHECK_FAULT_HANG
#define KVCHECK_FAULT_NAME "kvcheck-fault-hang"
#define KVCHECK_FAULT_WHAT "sleeps forever"
#elif KVCHECK_FAULT == KVCHECK_FAULT_LOAD_SEGV
#define KVCHECK_FAULT_NAME "kvcheck-fault-load-segv"
#define KVCHECK_FAULT_WHAT "writes through a null pointer in a static constructor"
#elif KVCHECK_FAULT == KVCHECK_FAULT_LOAD_EXIT
#define KVCHECK_FAULT_NAME "kvcheck-fault-load-exit"
#define KVCHECK_FAULT_WHAT "calls exit(0) in its plugin entry point"
#elif KVCHECK_FAULT == KVCHECK_FAULT_EXIT
#define KVCHECK_FAULT_NAME "kvcheck-fault-exit"
#define KVCHECK_FAULT_WHAT "calls exit(0)"
#elif KVCHECK_FAULT == KVCHECK_FAULT_NOISY
#define KVCHECK_FAULT_NAME "kvcheck-fault-noisy"
#define KVCHECK_FAULT_WHAT "prints to stdout and stderr, then throws text with control bytes and invalid UTF-8"
#elif KVCHECK_FAULT == KVCHECK_FAULT_NAME_ESCAPE
// A name no file name may be made of as it is: it climbs out of any
// directory it is joined to.
#define KVCHECK_FAULT_NAME "../../kvcheck-fault-escape"
#define KVCHECK_FAULT_WHAT "has a name with slashes and dots, and throws"
#elif KVCHECK_FAULT == KVCHECK_FAULT_RESERVE
#define KVCHECK_FAULT_NAME "kvcheck-fault-reserve"
#define KVCHECK_FAULT_WHAT "allocates 8 GiB per call and never touches it"
#elif KVCHECK_FAULT == KVCHECK_FAULT_RARE
#define KVCHECK_FAULT_NAME "kvcheck-fault-rare"
#define KVCHECK_FAULT_WHAT "throws on an add of a cache of one head (a few traces in a hundred), in two wordings"
#elif KVCHECK_FAULT == KVCHECK_FAULT_OFTEN
#define KVCHECK_FAULT_NAME "kvcheck-fault-often"
#define KVCHECK_FAULT_WHAT "throws on every get_cache of several ids (most traces)"
#elif KVCHECK_FAULT == KVCHECK_FAULT_EXIT_CREATE
#define KVCHECK_FAULT_NAME "kvcheck-fault-exit-create"
#define KVCHECK_FAULT_WHAT "calls exit(0) when the third engine of its process is made"
#elif KVCHECK_FAULT == KVCHECK_FAULT_EXIT_DESTROY
#define KVCHECK_FAULT_NAME "kvcheck-fault-exit-destroy"
#define KVCHECK_FAULT_WHAT "calls exit(0) in the destructor of an engine that ran an add"
#elif KVCHECK_FAULT == KVCHECK_FAULT_SHARED_STATIC
#define KVCHECK_FAULT_NAME "kvcheck-fault-shared-static"
#define KVCHECK_FAULT_WHAT "memoizes added caches by id in a static map every engine of its process shares"
#elif KVCHECK_FAULT == KVCHECK_FAULT_ODD_IDS
#define KVCHECK_FAULT_NAME "kvcheck-fault-odd-ids"
#define KVCHECK_FAULT_WHAT "stores each added cache a second and third time, under its id with a tab and a newline"
#else
#error "define KVCHECK_FAULT as one of the KVCHECK_FAULT_* kinds"
#endif

namespace {

// What an engine says when it refuses an odd input, as real code says it:
// the id quoted, numbers and an address that differ from one raise to the
// next. kvcheck groups such raises by the message's shape.
[[maybe_unused]] std::string refusal(const char* what, const std::string& id, std::size_t count, const void* at) {
    char address[32];
    std::snprintf(address, sizeof address, "%p", at);
    return std::string(KVCHECK_FAULT_NAME ": ") + what + " '" + id + "' (" + std::to_string(count) + ") at " + address;
}

// The leak strikes from the first add on, so that every trace leaks and the
// leak outgrows a memory limit within a few traces; the others from the
// third, so that their shrunk trace shows an engine failing in mid-trace.
[[maybe_unused]] constexpr int fault_call = KVCHECK_FAULT == KVCHECK_FAULT_LEAK ? 1 : 3;
[[maybe_unused]] constexpr std::size_t leak_bytes_per_call = std::size_t{64} << 20;
// Never touched, so never resident: only an address-space limit sees it.
[[maybe_unused]] constexpr std::size_t reserve_bytes_per_call = std::size_t{8} << 30;

// Held so that the leak stays reachable (LeakSanitizer stays quiet) yet is
// never freed: the process only grows.
[[maybe_unused]] std::vector<char*>& leaked() {
    static std::vector<char*> blocks;
    return blocks;
}

// A real segfault in every build. Under the asan preset the sanitizers would
// catch the store first (UBSan's null check, or ASan's SEGV handler) and end
// the process with exit status 1; an uninstrumented adapter dies by
// SIGSEGV, and that is what the isolation tests must see in both presets.
[[maybe_unused]] __attribute__((no_sanitize("undefined"))) void write_through_null() {
    std::signal(SIGSEGV, SIG_DFL);
    // Both volatile: the compiler can neither prove the pointer null (and
    // turn the store into a trap) nor drop the store as dead.
    volatile int* volatile target = nullptr;
    *target = 1;
}

#if KVCHECK_FAULT == KVCHECK_FAULT_LOAD_SEGV
// Runs when the library is loaded, before kvcheck can call anything.
struct CrashOnLoad {
    CrashOnLoad() { write_through_null(); }
} crash_on_load;
#endif

// What a noisy engine prints and throws: everything a report must survive
// (quotes, markup, a NUL-free run of control bytes, an ANSI escape, bytes
// that are not UTF-8, a lone continuation byte, an encoded surrogate).
[[maybe_unused]] const char hostile_text[] =
    "\"quoted\" <tag attr='x'> & \\ \x01\x02\x07\x08\x0b\x0c\x1b[31mred\x1b[0m \x7f \xff\xfe \x80 \xed\xa0\x80 end";

[[maybe_unused]] void inject_fault() {
#if KVCHECK_FAULT == KVCHECK_FAULT_SEGV || KVCHECK_FAULT == KVCHECK_FAULT_LOAD_SEGV
    write_through_null();
#elif KVCHECK_FAULT == KVCHECK_FAULT_ABORT
    std::abort();
#elif KVCHECK_FAULT == KVCHECK_FAULT_THROW
    throw std::runtime_error(KVCHECK_FAULT_NAME ": injected failure in add");
#elif KVCHECK_FAULT == KVCHECK_FAULT_LEAK
    char* block = new char[leak_bytes_per_call];
    std::memset(block, 0x5A, leak_bytes_per_call);  // touched: it counts as resident
    leaked().push_back(block);
#elif KVCHECK_FAULT == KVCHECK_FAULT_HANG
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
#elif KVCHECK_FAULT == KVCHECK_FAULT_EXIT
    std::exit(0);
#elif KVCHECK_FAULT == KVCHECK_FAULT_NOISY
    throw std::runtime_error(std::string(KVCHECK_FAULT_NAME ": ") + hostile_text);
#elif KVCHECK_FAULT == KVCHECK_FAULT_NAME_ESCAPE
    throw std::runtime_error(KVCHECK_FAULT_NAME ": injected failure in add");
#elif KVCHECK_FAULT == KVCHECK_FAULT_RESERVE
    leaked().push_back(new char[reserve_bytes_per_call]);
#elif KVCHECK_FAULT == KVCHECK_FAULT_LOAD_EXIT
    // Never reached: the entry point exits first.
#endif
}

// The noisy engine writes to both standard streams on every add, as a
// chatty library would, and with the same hostile text it throws.
[[maybe_unused]] void chatter() {
#if KVCHECK_FAULT == KVCHECK_FAULT_NOISY
    std::printf("{\"noise\": \"stdout\"} ]} %s\n", hostile_text);
    std::fflush(stdout);
    std::fprintf(stderr, "noise on stderr: %s\n", hostile_text);
#endif
}

// Armed by the `fault_call`-th add; from then on every add, get_cache,
// generate and make strikes. The first strike is that add itself, which
// ends the process for every fault but the leak; the leak grows with each
// later operation (a few hundred MiB per trace, so that one trace stays
// quick) and across the traces a child process runs, so a memory limit of
// a GiB or two is crossed within a few traces.
class FaultyEngine final : public vector_engine::VectorEngine {
  public:
    std::string name() const override { return KVCHECK_FAULT_NAME; }

#if KVCHECK_FAULT == KVCHECK_FAULT_EXIT_CREATE || KVCHECK_FAULT == KVCHECK_FAULT_EXIT_DESTROY
    // These strike outside any operation: in the making of an engine (the
    // plugin's create, the third in a process), or in
    // the destruction of one that served an add (after its trace's last
    // step). Otherwise the vector engine.
    FaultyEngine() {
        static int made = 0;
        if (KVCHECK_FAULT == KVCHECK_FAULT_EXIT_CREATE && ++made == 3) std::exit(0);
    }
    ~FaultyEngine() override {
        if (KVCHECK_FAULT == KVCHECK_FAULT_EXIT_DESTROY && added_) std::exit(0);
    }
    void add(const std::string& id, const kvcheck::CacheContent& content, const kvcheck::Metadata& metadata) override {
        added_ = true;
        VectorEngine::add(id, content, metadata);
    }

  private:
    bool added_ = false;
#elif KVCHECK_FAULT == KVCHECK_FAULT_SHARED_STATIC
    // A mutable static cache that outlives its engine: an add of an id
    // that an earlier engine of the process added stores that engine's
    // cache. One engine alone is the vector engine (an id it re-adds is
    // memoized anew), so a trace fails only after another ran first in
    // the process: state shared across instances, which a replay in a
    // fresh instance of the same process would not show as fresh.
    FaultyEngine() : instance_(++instances()) {}
    void add(const std::string& id, const kvcheck::CacheContent& content, const kvcheck::Metadata& metadata) override {
        auto& memo = memoized();
        const auto found = memo.find(id);
        if (found != memo.end() && found->second.first != instance_) {
            VectorEngine::add(id, found->second.second, metadata);
            return;
        }
        memo[id] = {instance_, content};
        VectorEngine::add(id, content, metadata);
    }

  private:
    static int& instances() {
        static int made = 0;
        return made;
    }
    static std::map<std::string, std::pair<int, kvcheck::CacheContent>>& memoized() {
        static std::map<std::string, std::pair<int, kvcheck::CacheContent>> memo;
        return memo;
    }
    int instance_;
#elif KVCHECK_FAULT == KVCHECK_FAULT_ODD_IDS
    // Entries the trace never added (store-contract fails), under ids that
    // hold the bytes a line- or tab-separated format would split on; each
    // is a real entry, read as any other.
    void add(const std::string& id, const kvcheck::CacheContent& content, const kvcheck::Metadata& metadata) override {
        VectorEngine::add(id, content, metadata);
        VectorEngine::add(id + "\tb", content, metadata);
        VectorEngine::add(id + "\nb", content, metadata);
    }
#elif KVCHECK_FAULT == KVCHECK_FAULT_RARE || KVCHECK_FAULT == KVCHECK_FAULT_OFTEN
    // These raise on some inputs only, as std::invalid_argument, and are
    // otherwise the vector engine (which passes every property).
    void add(const std::string& id, const kvcheck::CacheContent& content, const kvcheck::Metadata& metadata) override {
        if (KVCHECK_FAULT == KVCHECK_FAULT_RARE && content.heads == 1) {
            const char* what = content.layout == kvcheck::Layout::legacy ? "no single-head legacy caches, refusing"
                                                                         : "cannot add a single-head cache";
            throw std::invalid_argument(refusal(what, id, content.layers.size(), &content));
        }
        VectorEngine::add(id, content, metadata);
    }
    void get_cache(const std::vector<std::string>& ids, kvcheck::Handle out) override {
        if (KVCHECK_FAULT == KVCHECK_FAULT_OFTEN && ids.size() > 1) {
            throw std::invalid_argument(refusal("cannot merge, starting at", ids.front(), ids.size(), &ids));
        }
        VectorEngine::get_cache(ids, out);
    }
#else
    void add(const std::string& id, const kvcheck::CacheContent& content, const kvcheck::Metadata& metadata) override {
        armed_ = armed_ || ++adds_ >= fault_call;
        chatter();
        strike();
        VectorEngine::add(id, content, metadata);
    }
    void get_cache(const std::vector<std::string>& ids, kvcheck::Handle out) override {
        strike();
        VectorEngine::get_cache(ids, out);
    }
    kvcheck::GenerateResult generate(kvcheck::Handle handle, const std::vector<std::int64_t>& prompt,
                                     std::int64_t max_new_tokens, bool stream) override {
        strike();
        return VectorEngine::generate(handle, prompt, max_new_tokens, stream);
    }
    void make(const kvcheck::CacheContent& content, kvcheck::Handle out) override {
        strike();
        VectorEngine::make(content, out);
    }

  private:
    void strike() {
        if (armed_) inject_fault();
    }

    int adds_ = 0;
    bool armed_ = false;
#endif
};

}  // namespace

#if KVCHECK_FAULT == KVCHECK_FAULT_LOAD_EXIT
// The entry point KVCHECK_PLUGIN would define, exiting before it returns.
extern "C" __attribute__((visibility("default"))) const kvcheck_plugin* KVCHECK_PLUGIN_ENTRY() {
    std::exit(0);
}
#else
KVCHECK_PLUGIN(FaultyEngine, KVCHECK_FAULT_NAME, "vector engine that " KVCHECK_FAULT_WHAT " (see adapters/faulty)")
#endif
