#include "run/verdicts.h"
#include "kvcheck/limits.h"

#include <algorithm>

namespace kvcheck {

bool Verdicts::checking(Property property) const {
    if (!checked_.has(property)) return false;
    const char* id = property_id(property);
    for (const Failure& failure : failures_) {
        if (failure.property == id) return false;
    }
    return true;
}

void Verdicts::record(const std::string& property, const std::string& message) {
    const char* late = rechecking_ ? " (found when every entry was read again at the end of the run)" : "";
    failures_.push_back(Failure{property, step_, cut_text(message) + note_ + late, {}});
}

std::optional<Failure> Verdicts::settle() {
    if (failures_.empty()) return std::nullopt;
    auto rank = [](const Failure& failure) {
        const std::optional<Property> property = parse_property(failure.property);
        return property ? static_cast<int>(*property) : -1;
    };
    std::stable_sort(failures_.begin(), failures_.end(), [&](const Failure& a, const Failure& b) { return rank(a) < rank(b); });
    Failure primary = failures_.front();
    for (std::size_t i = 1; i < failures_.size(); ++i) primary.also.push_back(failures_[i].property + ": " + failures_[i].message);
    failures_.clear();
    return primary;
}

}  // namespace kvcheck
