// The thread level's yield hook (docs/semantics.md#the-thread-level): a
// point inside an engine where kvcheck's scheduler may run another client's
// thread. Outside a thread-level run the hook is unset and a yield does
// nothing, so an engine may call it freely.
//
// Under the thread level exactly one client thread runs at a time, between
// yield points (a cooperative token-passing scheduler, as Loom, Shuttle and
// CHESS run): at each yield the seeded schedule picks the thread that runs
// next. The harness yields before and after every engine call; an engine
// yields where its own threads could be interleaved (inside a critical
// section it does not lock, say): there a drawn schedule runs another
// client's thread (going on is the run without the yield). An engine that
// yields while it holds a lock must take that lock with lock_yielding, so
// that a thread waiting for it lets the holder run instead of blocking the
// only running thread. Points kvcheck names: "call" (before each call),
// "lock" (lock_yielding waiting), "reply" (a process engine's request in
// flight) and "locked" (an engine's lock just taken: in half the drawn
// schedules the thread goes on there, in the other half others may start
// their calls and wait for the lock).
//
//   void MyEngine::paged_free(std::int64_t seq) {
//       const auto held = kvcheck::lock_yielding(mutex_);
//       ...
//   }
#pragma once

#include <mutex>

extern "C" {
typedef void (*kvcheck_yield_fn)(const char* point);
}

namespace kvcheck {

// Set by kvcheck for the length of a thread-level run only (a plugin's copy
// through kvcheck_plugin::yield_hook).
inline kvcheck_yield_fn yield_hook = nullptr;

// A point where another client's thread may run (a no-op outside the
// thread level). `point` names it in reports: "take_free", "lock".
inline void yield(const char* point) {
    if (const kvcheck_yield_fn hook = yield_hook) hook(point);
}

// Locks `mutex`; under the thread level by trying, yielding until it is
// free (the holder may be a client suspended at a yield point).
template <typename Mutex>
std::unique_lock<Mutex> lock_yielding(Mutex& mutex) {
    if (yield_hook == nullptr) return std::unique_lock<Mutex>(mutex);
    std::unique_lock<Mutex> held(mutex, std::try_to_lock);
    while (!held.owns_lock()) {
        yield("lock");
        held.try_lock();
    }
    return held;
}

}  // namespace kvcheck
