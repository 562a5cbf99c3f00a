// The fault plugins: the vector engine (adapters/examples) with one fault
// injected, to prove that kvcheck survives an adapter that crashes, aborts,
// throws, leaks or hangs, and reports it against the property and trace
// that triggered it. KVCHECK_FAULT (set per plugin by CMakeLists.txt)
// selects the fault. It strikes on the third call of `add` on one engine
// (the leak: on the first, and on every frequent call after it): kvcheck
// makes one engine per trace, so any trace with three adds triggers it, and
// the shrunk trace is three adds.
#include "adapter.h"

#include <kvcheck/plugin.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#define KVCHECK_FAULT_SEGV 1
#define KVCHECK_FAULT_ABORT 2
#define KVCHECK_FAULT_THROW 3
#define KVCHECK_FAULT_LEAK 4
#define KVCHECK_FAULT_HANG 5

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
#else
#error "define KVCHECK_FAULT as one of the KVCHECK_FAULT_* kinds"
#endif

namespace {

// The leak strikes from the first add on, so that every trace leaks and the
// leak outgrows a memory limit within a few traces; the others from the
// third, so that their shrunk trace shows an engine failing in mid-trace.
constexpr int fault_call = KVCHECK_FAULT == KVCHECK_FAULT_LEAK ? 1 : 3;
[[maybe_unused]] constexpr std::size_t leak_bytes_per_call = std::size_t{64} << 20;

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

void inject_fault() {
#if KVCHECK_FAULT == KVCHECK_FAULT_SEGV
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

    void add(const std::string& id, const kvcheck::CacheContent& content, const kvcheck::Metadata& metadata) override {
        armed_ = armed_ || ++adds_ >= fault_call;
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
};

}  // namespace

KVCHECK_PLUGIN(FaultyEngine, KVCHECK_FAULT_NAME, "vector engine that " KVCHECK_FAULT_WHAT " (see adapters/faulty)")
