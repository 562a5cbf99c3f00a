// linearizable: the requests of concurrent clients (kvcheck/lanes.h) give
// what running each alone, at one point between its first and its last
// call, gives, the points in an order that keeps the schedule's (a request
// that ended before another began comes first): Wing and Gong's search
// with Lowe's memoization (a set of requests placed and the model's state,
// once found to lead nowhere, is not tried again), as Porcupine searches,
// against the store as the auditor knows it (docs/semantics.md#linearizable).
//
// A request is a lane's calls from the get_cache that makes a handle to its
// release (a read: the copy it got, the tokens of its first generation),
// or one call (add, delete: a write). The model is the store: each id's
// object, as the trace's adds make them (the auditor's, built from the
// trace); a read placed at a state got the entry's content (its digest)
// and generated what the engine's model generates on that content.
// Checked: traces of several lanes of those calls only, at each read's
// release, over the requests ended so far (a read changes nothing, so the
// reads still open cannot change the verdict of those ended).
// Not checked: a trace of one lane (its requests are its calls: the other
// properties judge each); a trace with another call (a paged one, a merge,
// a conversion: not in the model), or an engine with a declared capacity
// (its evictions are not in the model); a read that found no entry is
// judged by that alone, and one of an entry holding no tokens by nothing.
//
// The search (linearization_stuck) is also the thread level's
// (harness/threads.cpp), whose requests are calls that overlap in time
// (first and last: a call's invocation and response), with two more kinds
// of request: a dump read back and the store read at a quiescent point,
// each a reading of the whole store that must equal one state; and a
// store with a capacity, whose evictions follow its declared policy.
#include "checkers/checker.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace kvcheck::checkers {
namespace {

using Request = StoreRequest;

// The store as the model knows it: each id's object and, for a bounded
// store, the order its policy evicts in (the first goes first); without a
// bound the order is not kept (it changes nothing, and would split the memo).
struct State {
    std::map<std::string, ObjectId> entries;
    std::vector<std::string> order;

    bool operator<(const State& other) const { return std::tie(entries, order) < std::tie(other.entries, other.order); }
};

// ---- the model ----

// Does `read`, placed at `state`, give what it gave?
bool read_fits(const Request& read, const State& state, StoreModel& model) {
    const auto entry = state.entries.find(read.ids.front());
    if (entry == state.entries.end()) return !read.copy;
    if (!model.holds_tokens(entry->second)) return true;
    if (!read.copy || *read.copy != model.digest(entry->second)) return false;
    return !read.generated || read.tokens == model.fresh(entry->second, read.prompt, read.max);
}

// Does a whole reading, placed at `state`, hold exactly its entries?
bool whole_fits(const Request& whole, const State& state, StoreModel& model) {
    if (whole.held.size() != state.entries.size()) return false;
    for (const auto& [id, object] : state.entries) {
        const auto held = whole.held.find(id);
        if (held == whole.held.end() || held->second != model.digest(object)) return false;
    }
    return true;
}

bool fits(const Request& request, const State& state, StoreModel& model) {
    if (request.kind == Request::Kind::read) return read_fits(request, state, model);
    if (request.kind == Request::Kind::whole) return whole_fits(request, state, model);
    return true;
}

// `id` used: last in the eviction order.
void use(State& state, const std::string& id) {
    state.order.erase(std::remove(state.order.begin(), state.order.end(), id), state.order.end());
    state.order.push_back(id);
}

void erase(State& state, const std::string& id) {
    state.entries.erase(id);
    state.order.erase(std::remove(state.order.begin(), state.order.end(), id), state.order.end());
}

// `state` after `request`: a write stores (and, past a capacity, evicts
// the first of the order), a delete erases; a read changes nothing but,
// under lru, its entry's recency.
State after(const Request& request, State state, const StorePolicy& policy) {
    const bool ordered = policy.capacity_items > 0;
    if (request.kind == Request::Kind::write) {
        const std::string& id = request.ids.front();
        if (!request.object) {
            erase(state, id);
            return state;
        }
        const bool fresh = state.entries.count(id) == 0;
        state.entries[id] = *request.object;
        if (ordered && (fresh || policy.eviction != Eviction::fifo)) use(state, id);  // fifo: an overwrite keeps its place
        while (ordered && state.entries.size() > static_cast<std::size_t>(policy.capacity_items)) erase(state, state.order.front());
    } else if (request.kind == Request::Kind::erase) {
        for (const std::string& id : request.ids) erase(state, id);
    } else if (request.kind == Request::Kind::read && ordered && policy.eviction == Eviction::lru &&
               state.entries.count(request.ids.front()) != 0) {
        use(state, request.ids.front());
    }
    return state;
}

// ---- the search (Wing & Gong, memoized as Lowe's) ----

struct Search {
    const std::vector<const Request*>& requests;
    StoreModel& model;
    const StorePolicy& policy;
    std::set<std::pair<std::uint64_t, State>> dead;
    std::size_t deepest = 0;           // the most requests placed in one order
    std::optional<std::size_t> stuck;  // a read that fitted no state there
};

bool place(Search& search, std::uint64_t placed, const State& state, std::size_t count) {
    if (count == search.requests.size()) return true;
    if (search.dead.count({placed, state}) != 0) return false;
    // A request may go next when no request left ended before it began.
    std::size_t ends_first = SIZE_MAX;
    for (std::size_t i = 0; i < search.requests.size(); ++i) {
        if (((placed >> i) & 1U) == 0) ends_first = std::min(ends_first, search.requests[i]->last);
    }
    for (std::size_t i = 0; i < search.requests.size(); ++i) {
        const Request& request = *search.requests[i];
        if (((placed >> i) & 1U) != 0 || request.first > ends_first) continue;
        if (!fits(request, state, search.model)) {
            if (count >= search.deepest) {
                search.deepest = count;
                search.stuck = i;
            }
            continue;
        }
        if (place(search, placed | (std::uint64_t{1} << i), after(request, state, search.policy), count + 1)) return true;
    }
    search.dead.insert({placed, state});
    return false;
}

const char* kind_text(Request::Kind kind) {
    switch (kind) {
        case Request::Kind::write: return "add ";
        case Request::Kind::erase: return "delete ";
        case Request::Kind::read: return "read ";
        case Request::Kind::whole: return "whole read ";
    }
    return "";
}

std::string digest_text(std::uint64_t digest) {
    char text[24];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(digest));
    return text;
}

}  // namespace

std::optional<std::size_t> linearization_stuck(const std::vector<const StoreRequest*>& requests, StoreModel& model,
                                               const StorePolicy& policy) {
    if (requests.size() > linearizable_requests_max) throw std::invalid_argument("linearization_stuck: too many requests");
    if (policy.bounded() && (policy.capacity_bytes > 0 || !evicts_in_order(policy.eviction))) {
        throw std::invalid_argument("linearization_stuck: a bound of items evicted in order (lru, fifo, lrs) only");
    }
    Search search{requests, model, policy, {}, 0, std::nullopt};
    if (place(search, 0, {}, 0)) return std::nullopt;
    return search.stuck.value_or(requests.size() - 1);
}

std::string store_request_text(const StoreRequest& request, const char* unit) {
    const std::string span = " (" + std::string(unit) + " " + std::to_string(request.first + 1) + " to " +
                             std::to_string(request.last + 1) + ")";
    if (request.kind == Request::Kind::whole) {
        std::string text = request.what + span + " held ";
        if (request.held.empty()) return text + "nothing";
        bool first = true;
        for (const auto& [id, digest] : request.held) {
            text += (first ? "" : ", ") + in_quotes(id) + " of content " + digest_text(digest);
            first = false;
        }
        return text;
    }
    if (request.kind != Request::Kind::read) {
        return "lane " + std::to_string(request.lane) + "'s " + kind_text(request.kind) + id_list(request.ids) + span;
    }
    std::string text = "lane " + std::to_string(request.lane) + "'s read of " + in_quotes(request.ids.front()) + span;
    text += " got " + (request.copy ? "a copy of content " + digest_text(*request.copy) : std::string("no cache"));
    if (request.generated) text += " and generated " + tokens_text(request.tokens);
    return text;
}

std::string requests_inside(const std::vector<StoreRequest>& all, const StoreRequest& request, const char* unit) {
    std::string text;
    for (const Request& other : all) {
        if (other.kind == Request::Kind::whole || other.lane == request.lane || other.first < request.first ||
            other.first > request.last) {
            continue;
        }
        text += (text.empty() ? "" : ", ") + std::string(kind_text(other.kind)) + id_list(other.ids) + " at " + unit + " " +
                std::to_string(other.first + 1) + " (lane " + std::to_string(other.lane) + ")";
    }
    return text.empty() ? "none" : text;
}

namespace {

class Linearizable final : public Checker, private StoreModel {
  public:
    Linearizable() : Checker(Property::linearizable) {}

    void generated(const Generated& generation, Probe&) override {
        const auto open = open_.find(generation.source);
        if (open == open_.end() || requests_[open->second].generated) return;
        Request& read = requests_[open->second];
        read.generated = true;
        read.prompt = generation.prompt;
        read.max = generation.max;
        read.tokens = generation.result.tokens;
    }

    void called(const Op& operation, Probe& probe) override {
        if (!judged_ || !checking(probe)) return;
        if (probe.capabilities().policy.bounded()) judged_ = false;
        std::visit([&](const auto& o) { follow(o, probe); }, operation);
        if (requests_.size() > linearizable_requests_max) judged_ = false;
    }

  private:
    void follow(const op::SwitchLane& o, Probe&) {
        lane_ = o.lane;
        lanes_ = true;
    }
    void follow(const op::Add& o, Probe& probe) {
        Request write = one_call(probe, Request::Kind::write);
        write.ids = {o.id};
        write.object = probe.auditor().entry(o.id);
        requests_.push_back(std::move(write));
    }
    void follow(const op::Delete& o, Probe& probe) {
        Request erase = one_call(probe, Request::Kind::erase);
        erase.ids = o.ids;
        requests_.push_back(std::move(erase));
    }
    void follow(const op::GetCache& o, Probe& probe) {
        if (o.ids.size() != 1 || open_.count(o.out.value) != 0) {
            judged_ = false;
            return;
        }
        Request read = one_call(probe, Request::Kind::read);
        read.ended = false;
        read.ids = o.ids;
        read.handle = o.out.value;
        if (probe.handle(o.out.value).exists) read.copy = probe.engine().handle_digest(o.out.value);
        open_[o.out.value] = requests_.size();
        requests_.push_back(std::move(read));
    }
    void follow(const op::Generate& o, Probe&) {
        if (open_.count(o.source.value) == 0) judged_ = false;
    }
    void follow(const op::Release& o, Probe& probe) {
        const auto open = open_.find(o.handle.value);
        if (open == open_.end()) {
            judged_ = false;
            return;
        }
        Request& read = requests_[open->second];
        read.last = probe.step();
        read.ended = true;
        open_.erase(open);
        if (lanes_) judge(read, probe);
    }
    template <typename O>
    void follow(const O&, Probe&) {
        judged_ = false;  // not in the model
    }

    Request one_call(const Probe& probe, Request::Kind kind) const {
        Request request;
        request.lane = lane_;
        request.first = request.last = probe.step();
        request.ended = true;
        request.kind = kind;
        return request;
    }

    // ---- the model: the auditor's objects, the engine's model ----

    bool holds_tokens(ObjectId object) override { return content_holds_tokens(probe_->auditor().object(object).content); }
    std::uint64_t digest(ObjectId object) override { return probe_->auditor().digest_of(object); }
    const Tokens& fresh(ObjectId object, const Tokens& prompt, std::int64_t max) override {
        const auto key = std::make_tuple(object, prompt, max);
        auto at = fresh_.find(key);
        if (at == fresh_.end()) {
            at = fresh_.emplace(key, probe_->engine().generate_fresh(probe_->auditor().object(object).content, prompt, max)).first;
        }
        return at->second;
    }

    void judge(const Request& ended, Probe& probe) {
        if (!judged_) return;
        std::vector<const Request*> ended_so_far;
        for (const Request& request : requests_) {
            if (request.ended) ended_so_far.push_back(&request);
        }
        probe_ = &probe;
        const std::optional<std::size_t> stuck = linearization_stuck(ended_so_far, *this);
        probe_ = nullptr;
        if (!stuck) return;
        const Request& read = stuck < ended_so_far.size() ? *ended_so_far[*stuck] : ended;
        fail(probe, "no order of the " + std::to_string(ended_so_far.size()) +
                        " requests ended so far, each run alone at one point between its first and last call, gives "
                        "what they gave: " + store_request_text(read, "steps") + " (the requests of other lanes in between: " +
                        requests_inside(requests_, read, "step") + ")");
    }

    std::vector<Request> requests_;
    std::map<std::int64_t, std::size_t> open_;  // handle -> its read, until released
    std::int64_t lane_ = 0;
    bool lanes_ = false;   // a switch was seen: a trace of several lanes
    bool judged_ = true;   // false once the trace leaves the model
    Probe* probe_ = nullptr;  // while judging
    std::map<std::tuple<ObjectId, Tokens, std::int64_t>, Tokens> fresh_;
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::linearizable>() {
    return std::make_unique<Linearizable>();
}

}  // namespace kvcheck::checkers
