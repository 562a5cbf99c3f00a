// The verdicts of one step: every violation found while the step runs and
// is read, at most one per property (the first), ranked in property order
// when the step ends; an engine error ranks first (it cut the step short or
// made it unjudgeable).
#pragma once

#include "kvcheck/executor.h"

#include <optional>
#include <string>
#include <vector>

namespace kvcheck {

class Verdicts {
  public:
    explicit Verdicts(PropertySet checked) : checked_(checked) {}

    const PropertySet& checked() const { return checked_; }
    // Is `property` checked, and not already violated at this step?
    bool checking(Property property) const;
    void fail(Property property, const std::string& message) { record(property_id(property), message); }
    void engine_error(const std::string& message) { record(engine_error_id, message); }
    bool any() const { return !failures_.empty(); }

    // Where the violations found now come from: the step, a note on the
    // read that found them, and whether it is the end-of-run read.
    void at_step(std::size_t step) { step_ = step; }
    std::size_t step() const { return step_; }
    void note(std::string note) { note_ = std::move(note); }
    void rechecking() { rechecking_ = true; }

    // The step's failure, if any: the first in rank, with the others as
    // `also`. Clears the step's violations.
    std::optional<Failure> settle();

  private:
    void record(const std::string& property, const std::string& message);

    PropertySet checked_;
    std::vector<Failure> failures_;
    std::size_t step_ = 0;
    std::string note_;
    bool rechecking_ = false;
};

}  // namespace kvcheck
