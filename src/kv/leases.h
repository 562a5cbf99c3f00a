// Read leases with expiry on a clock the caller drives: what keeps a stored
// entry from being removed or replaced while a reader uses it (LMCache's
// L1Manager read locks, one TTLLock per object; Mooncake's leases).
//
// Each id holds a count of leases and one expiry: every lease sets the
// expiry to now + TTL (and starts the count again at 1 when the previous
// leases had expired); an id is leased while its count is above 0 and the
// clock is below its expiry. The clock starts at 0 and moves only by
// advance: nothing here reads the wall clock.
//
//   kv::Leases leases(4);                 // leases live 4 ms
//   leases.take("a");                     // "a" leased until t=4
//   leases.advance(4); leases.live("a");  // false: expired at t=4
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kv {

class Leases {
  public:
    struct Lease {
        std::int64_t count = 0;
        std::int64_t until_ms = 0;
    };

    explicit Leases(std::int64_t ttl_ms = 0) : ttl_ms_(ttl_ms) {}

    std::int64_t ttl_ms() const { return ttl_ms_; }
    std::int64_t now_ms() const { return now_ms_; }
    void advance(std::int64_t ms);  // ms >= 0
    void take(const std::string& id);
    // Gives one lease back: false (nothing changes) when `id` is not leased.
    bool give_back(const std::string& id);
    bool live(const std::string& id) const;
    // The leases `id` holds (count 0: none), live or expired.
    Lease lease(const std::string& id) const;
    // An entry left the store: its leases go with it.
    void forget(const std::string& id) { leases_.erase(id); }
    void forget_all() { leases_.clear(); }

  private:
    std::int64_t ttl_ms_;
    std::int64_t now_ms_ = 0;
    std::map<std::string, Lease> leases_;
};

}  // namespace kv
