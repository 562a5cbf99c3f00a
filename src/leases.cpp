#include "kv/leases.h"

#include <stdexcept>

namespace kv {

void Leases::advance(std::int64_t ms) {
    if (ms < 0) throw std::invalid_argument("the clock does not go back (" + std::to_string(ms) + " ms)");
    now_ms_ += ms;
}

void Leases::take(const std::string& id) {
    Lease& lease = leases_[id];
    lease.count = live(id) ? lease.count + 1 : 1;
    lease.until_ms = now_ms_ + ttl_ms_;
}

bool Leases::give_back(const std::string& id) {
    if (!live(id)) return false;
    --leases_.at(id).count;
    return true;
}

bool Leases::live(const std::string& id) const {
    const Lease found = lease(id);
    return found.count > 0 && now_ms_ < found.until_ms;
}

Leases::Lease Leases::lease(const std::string& id) const {
    const auto found = leases_.find(id);
    return found == leases_.end() ? Lease{} : found->second;
}

}  // namespace kv
