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
#include "checkers/checker.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace kvcheck::checkers {
namespace {

// Requests past this many are not judged (the memo's key is a bit set).
constexpr std::size_t requests_max = 64;

struct Request {
    std::int64_t lane = 0;
    std::size_t first = 0;  // steps
    std::size_t last = 0;
    bool ended = false;
    enum class Kind : std::uint8_t { write, erase, read } kind = Kind::write;
    Ids ids;                         // write: its id; erase: its ids; read: its id
    std::optional<ObjectId> object;  // write: what it stored
    // read: the cache get_cache handed out (its digest), and the first
    // generation from it.
    std::int64_t handle = 0;
    std::optional<std::uint64_t> copy;
    bool generated = false;
    Tokens prompt;
    std::int64_t max = 0;
    Tokens tokens;
};

using State = std::map<std::string, ObjectId>;

class Linearizable final : public Checker {
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
        if (requests_.size() > requests_max) judged_ = false;
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

    // ---- the model ----

    // Does `read`, placed at `state`, give what it gave?
    bool read_fits(const Request& read, const State& state, Probe& probe) {
        const auto entry = state.find(read.ids.front());
        if (entry == state.end()) return !read.copy;
        const Object& object = probe.auditor().object(entry->second);
        if (!content_holds_tokens(object.content)) return true;
        if (!read.copy || *read.copy != probe.auditor().digest_of(entry->second)) return false;
        return !read.generated || read.tokens == fresh_tokens(entry->second, read, probe);
    }

    const Tokens& fresh_tokens(ObjectId object, const Request& read, Probe& probe) {
        const auto key = std::make_tuple(object, read.prompt, read.max);
        auto at = fresh_.find(key);
        if (at == fresh_.end()) {
            at = fresh_.emplace(key, probe.engine().generate_fresh(probe.auditor().object(object).content, read.prompt,
                                                                     read.max)).first;
        }
        return at->second;
    }

    // `state` after `request` (a read changes nothing).
    static State after(const Request& request, State state) {
        if (request.kind == Request::Kind::write) {
            if (request.object) {
                state[request.ids.front()] = *request.object;
            } else {
                state.erase(request.ids.front());
            }
        } else if (request.kind == Request::Kind::erase) {
            for (const std::string& id : request.ids) state.erase(id);
        }
        return state;
    }

    // ---- the search (Wing & Gong, memoized as Lowe's) ----

    struct Search {
        std::vector<const Request*> requests;  // ended, by first step
        std::set<std::pair<std::uint64_t, State>> dead;
        std::size_t deepest = 0;               // the most requests placed in one order
        std::optional<std::size_t> stuck;      // a read that fitted no state there
    };

    bool place(Search& search, std::uint64_t placed, const State& state, std::size_t count, Probe& probe) {
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
            if (request.kind == Request::Kind::read && !read_fits(request, state, probe)) {
                if (count >= search.deepest) {
                    search.deepest = count;
                    search.stuck = i;
                }
                continue;
            }
            if (place(search, placed | (std::uint64_t{1} << i), after(request, state), count + 1, probe)) return true;
        }
        search.dead.insert({placed, state});
        return false;
    }

    void judge(const Request& ended, Probe& probe) {
        if (!judged_) return;
        Search search;
        for (const Request& request : requests_) {
            if (request.ended) search.requests.push_back(&request);
        }
        if (place(search, 0, {}, 0, probe)) return;
        const Request& stuck = search.stuck ? *search.requests[*search.stuck] : ended;
        fail(probe, "no order of the " + std::to_string(search.requests.size()) +
                        " requests ended so far, each run alone at one point between its first and last call, gives "
                        "what they gave: " + read_text(stuck) + " (the requests of other lanes in between: " +
                        between(stuck) + ")");
    }

    static std::string read_text(const Request& read) {
        std::string text = "lane " + std::to_string(read.lane) + "'s read of " + in_quotes(read.ids.front()) + " (steps " +
                           std::to_string(read.first + 1) + " to " + std::to_string(read.last + 1) + ") got ";
        char digest[24];
        std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(read.copy.value_or(0)));
        text += read.copy ? "a copy of content " + std::string(digest) : std::string("no cache");
        if (read.generated) text += " and generated " + tokens_text(read.tokens);
        return text;
    }

    std::string between(const Request& read) const {
        std::string text;
        for (const Request& other : requests_) {
            if (other.lane == read.lane || other.first < read.first || other.first > read.last) continue;
            const char* what = other.kind == Request::Kind::write ? "add " : other.kind == Request::Kind::erase ? "delete " : "read ";
            text += (text.empty() ? "" : ", ") + std::string(what) + id_list(other.ids) + " at step " +
                    std::to_string(other.first + 1) + " (lane " + std::to_string(other.lane) + ")";
        }
        return text.empty() ? "none" : text;
    }

    std::vector<Request> requests_;
    std::map<std::int64_t, std::size_t> open_;  // handle -> its read, until released
    std::int64_t lane_ = 0;
    bool lanes_ = false;   // a switch was seen: a trace of several lanes
    bool judged_ = true;   // false once the trace leaves the model
    std::map<std::tuple<ObjectId, Tokens, std::int64_t>, Tokens> fresh_;
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::linearizable>() {
    return std::make_unique<Linearizable>();
}

}  // namespace kvcheck::checkers
