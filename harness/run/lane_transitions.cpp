// The transition of a context switch between clients (op::SwitchLane,
// docs/semantics.md#concurrent-clients): it calls nothing and changes no
// expected state; the steps after it are another client's calls.
#include "run/transitions.h"

namespace kvcheck {

template <>
std::optional<Fact> Transitions::apply(const op::SwitchLane&) {
    return Fact{};
}

}  // namespace kvcheck
