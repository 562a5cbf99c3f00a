// The thread level (kvcheck/threads.h, docs/semantics.md#the-thread-level):
// a cooperative token-passing scheduler over one thread per client lane,
// each cache family's calls and quiescent checks (PagedFamily,
// StoreFamily), and the search that finds, shrinks and replays a failure.
#include "kvcheck/threads.h"

#include "checkers/checker.h"
#include "kvcheck/yield.h"
#include "ram_dir.h"
#include "thread_family.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <stdlib.h>

namespace kvcheck {
namespace threads_detail {

// One thread runs at a time: `running_` holds the token, and a yield hands
// it to the lane the schedule picks (itself included).
class Scheduler {
  public:
    Scheduler(std::size_t lanes, const ThreadRunOptions& options)
        : done_(lanes, false), choose_(options.seed), replay_(options.schedule) {
        done_[0] = true;  // lane 0 ran alone before
        // A draw of its own, so that the lanes' draws are those a run
        // without `locked` points always drew.
        whole_once_locked_ = SeededChooser(options.seed ^ locked_draw_salt).one_in(2);
    }

    void wait_turn(std::size_t lane) {
        std::unique_lock<std::mutex> held(mutex_);
        turn_.wait(held, [&] { return running_ == lane; });
    }

    // The lane that runs after `lane`'s yield at `point` (itself, or
    // another: then hand_over).
    std::size_t next_after(std::size_t lane, const char* point) {
        const std::lock_guard<std::mutex> held(mutex_);
        return pick(lane, std::strcmp(point, "lock") == 0, kind_of(point));
    }

    // Runs `next` and waits until `lane` runs again.
    void hand_over(std::size_t lane, std::size_t next) {
        std::unique_lock<std::mutex> held(mutex_);
        running_ = next;
        turn_.notify_all();
        turn_.wait(held, [&] { return running_ == lane; });
    }

    void finish(std::size_t lane) {
        std::unique_lock<std::mutex> held(mutex_);
        done_[lane] = true;
        if (std::all_of(done_.begin(), done_.end(), [](bool d) { return d; })) return;
        running_ = pick(lane, true);
        turn_.notify_all();
    }

    const std::vector<std::int64_t>& schedule() const { return schedule_; }
    bool diverged() const { return diverged_; }

  private:
    // How a drawn schedule treats a yield point (kvcheck/yield.h).
    enum class Point {
        passed,  // one every call passes: kvcheck's own `call`, `lock`, `reply`
        locked,  // a lock just taken: other lanes start their calls and wait
        engine,  // the engine's own: its threads could interleave there
    };
    static Point kind_of(const char* point) {
        if (std::strcmp(point, "locked") == 0) return Point::locked;
        for (const char* passed : {"call", "lock", "reply"}) {
            if (std::strcmp(point, passed) == 0) return Point::passed;
        }
        return Point::engine;
    }

    // The next lane to run after `current` (done or yielding). With `wait`
    // (a lock it waits for, or its end) the fallback moves on to the next
    // lane, so that the holder runs. A drawn schedule draws among every
    // lane at a point every call passes; at the engine's own point among
    // the others (the yielding lane going on is the run without that
    // yield: the point is there for another lane to run); at `locked`, in
    // half the traces (drawn from the seed) the yielding lane goes on (a
    // lane drawn there starts its call and waits, so that its call, open
    // from then on, fits more orders: the half that goes on keeps calls
    // apart, the other half has them wait on the lock). A replayed schedule
    // may name any lane at any point.
    std::size_t pick(std::size_t current, bool wait, Point point = Point::passed) {
        std::vector<std::size_t> ready;
        for (std::size_t lane = 0; lane < done_.size(); ++lane) {
            if (!done_[lane]) ready.push_back(lane);
        }
        if (ready.size() == 1) return ready.front();
        std::size_t next = 0;
        if (!replay_) {
            std::vector<std::size_t> drawn = ready;
            if (point == Point::engine) drawn.erase(std::remove(drawn.begin(), drawn.end(), current), drawn.end());
            if (point == Point::locked && whole_once_locked_) drawn = {current};
            next = drawn[choose_.below(drawn.size())];
        } else if (used_ < replay_->size()) {
            const std::int64_t want = (*replay_)[used_++];
            const bool can = want >= 0 && static_cast<std::size_t>(want) < done_.size() && !done_[static_cast<std::size_t>(want)];
            diverged_ = diverged_ || !can;
            next = can ? static_cast<std::size_t>(want) : fallback(ready, current, wait);
        } else {
            next = fallback(ready, current, wait);
        }
        schedule_.push_back(static_cast<std::int64_t>(next));
        return next;
    }

    static std::size_t fallback(const std::vector<std::size_t>& ready, std::size_t current, bool wait) {
        const bool current_ready = std::find(ready.begin(), ready.end(), current) != ready.end();
        if (current_ready && !wait) return current;
        const auto after = std::upper_bound(ready.begin(), ready.end(), current);
        return after == ready.end() ? ready.front() : *after;
    }

    std::mutex mutex_;
    std::condition_variable turn_;
    std::size_t running_ = 1;
    std::vector<bool> done_;
    SeededChooser choose_;
    std::optional<std::vector<std::int64_t>> replay_;
    std::size_t used_ = 0;
    std::vector<std::int64_t> schedule_;
    bool diverged_ = false;
    bool whole_once_locked_ = false;  // drawn: at `locked` the lane goes on
    static constexpr std::uint64_t locked_draw_salt = 0x6c6f636b6564;  // "locked"
};

}  // namespace threads_detail

namespace {

using threads_detail::Family;
using threads_detail::Scheduler;
using threads_detail::Shared;

constexpr std::size_t replays_of_a_finding = 3;
// A shrink step's candidates are tried at most this many times in all.
constexpr std::size_t shrink_runs_max = 2000;

thread_local Shared* current_shared = nullptr;
thread_local std::size_t current_lane = 0;

void note(Shared& shared, std::string line) { shared.result.history.push_back(std::move(line)); }

void fail(Shared& shared, const std::string& property, const std::string& message) {
    if (shared.result.failure) return;
    shared.result.failure = Failure{property, shared.result.history.size() - 1, message, {}};
}

// The kvcheck::yield hook: a point inside the engine, on a lane's thread.
void yield_in_engine(const char* point) {
    Shared* shared = current_shared;
    if (shared == nullptr || shared->scheduler == nullptr || shared->checking) return;
    const std::size_t lane = current_lane;
    const std::size_t next = shared->scheduler->next_after(lane, point);
    if (next == lane) return;
    note(*shared, "  lane " + std::to_string(lane) + " paused at " + point + "; lane " + std::to_string(next) + " runs");
    shared->scheduler->hand_over(lane, next);
}

// Reads the engine at a quiescent point: no yield inside is taken.
template <typename Read>
auto reading(Shared& shared, Read read) -> decltype(read()) {
    shared.checking = true;
    try {
        auto value = read();
        shared.checking = false;
        return value;
    } catch (...) {
        shared.checking = false;
        throw;
    }
}

// ---- the paged family ----

// The sequences a lane holds (lane-private, so never raced on).
using Alive = std::set<std::int64_t>;

class PagedFamily final : public Family {
  public:
    PagedFamily(PagedEngine& paged, std::size_t lanes) : paged_(paged), alive_(lanes) {}

    // Runs one paged call; nothing when it was not applicable (a sequence
    // a refused alloc never made).
    std::optional<std::string> call(std::size_t lane, const Op& operation, std::size_t) override {
        Alive& alive = alive_.at(lane);
        PagedEngine& paged = paged_;
        return std::visit(
            [&](const auto& o) -> std::optional<std::string> {
                using O = std::decay_t<decltype(o)>;
                if constexpr (std::is_same_v<O, op::PagedLookup>) {
                    return "cached " + std::to_string(paged.paged_lookup(o.tokens, o.salt));
                } else if constexpr (std::is_same_v<O, op::PagedAlloc>) {
                    if (alive.count(o.seq) != 0) return std::nullopt;
                    const std::int64_t cached = paged.paged_alloc(o.seq, o.tokens, o.salt);
                    alive.insert(o.seq);
                    return "cached " + std::to_string(cached);
                } else if constexpr (std::is_same_v<O, op::PagedAppend>) {
                    if (alive.count(o.seq) == 0) return std::nullopt;
                    return "appended " + checkers::tokens_text(paged.paged_append(o.seq, o.count));
                } else if constexpr (std::is_same_v<O, op::PagedFork>) {
                    if (alive.count(o.parent) == 0 || alive.count(o.child) != 0) return std::nullopt;
                    paged.paged_fork(o.parent, o.child);
                    alive.insert(o.child);
                    return std::string("forked");
                } else if constexpr (std::is_same_v<O, op::PagedFree>) {
                    if (alive.count(o.seq) == 0) return std::nullopt;
                    alive.erase(o.seq);
                    paged.paged_free(o.seq);
                    return std::string("freed");
                } else if constexpr (std::is_same_v<O, op::PagedEvict>) {
                    paged.paged_evict();
                    return std::string("evicted");
                } else if constexpr (std::is_same_v<O, op::PagedStep>) {
                    paged.paged_step();
                    return std::string("stepped");
                } else {
                    throw std::invalid_argument(std::string("the thread level's paged lanes run paged requests only, not ") + O::name);
                }
            },
            operation);
    }

    // op-atomic's refusals: the pool is full.
    bool may_refuse(const Op& operation) const override {
        return std::holds_alternative<op::PagedAlloc>(operation) || std::holds_alternative<op::PagedAppend>(operation) ||
               std::holds_alternative<op::PagedFork>(operation);
    }

    // The pool's whole-state invariants.
    void quiescent(Shared& shared, const std::string& after) override {
        const PagedState state = reading(shared, [&] { return paged_.paged_state(); });
        if (const std::optional<std::string> wrong = checkers::refcount_wrong(state)) {
            fail(shared, property_id(Property::refcount_exact), "at the quiescent point after " + after + ": " + *wrong);
        } else if (const std::optional<std::string> queue = checkers::free_queue_wrong(state)) {
            fail(shared, property_id(Property::free_iff_unreferenced), "at the quiescent point after " + after + ": " + *queue);
        }
    }

  private:
    PagedEngine& paged_;
    std::vector<Alive> alive_;
};

// ---- the store family ----
//
// Each call a request of the linearizable model (checkers::StoreRequest,
// its first and last lines of the history: invocation and response), a
// read from its get_cache to its release. At each quiescent point: each
// held copy is what it was when handed out and shares no storage with a
// stored entry (stored-immutable), the listing names each id once
// (store-contract), and the store as read there, with every request ended
// so far, must be linearizable (with a capacity, its evictions those of
// the declared policy: a read is then placed inside its get_cache, a use);
// every dump is read back at the end (loaded into the engine, once its
// lanes have ended) and must be one state too.
class StoreFamily final : public Family, private checkers::StoreModel {
  public:
    StoreFamily(Engine& engine, const Capabilities& capabilities, std::size_t lanes)
        : engine_(engine), capabilities_(capabilities), calling_(lanes) {}
    ~StoreFamily() override {
        for (const std::string& dir : dirs_) {
            std::error_code ignored;
            std::filesystem::remove_all(dir, ignored);
        }
    }
    StoreFamily(const StoreFamily&) = delete;
    StoreFamily& operator=(const StoreFamily&) = delete;

    std::optional<std::string> call(std::size_t lane, const Op& operation, std::size_t invoked) override {
        checkers::StoreRequest request;
        request.lane = static_cast<std::int64_t>(lane);
        request.first = request.last = invoked;
        {
            const std::lock_guard<std::mutex> book(book_);
            calling_[lane] = std::nullopt;
        }
        return std::visit([&](const auto& o) { return run(o, request); }, operation);
    }

    bool may_refuse(const Op&) const override { return false; }

    void responded(std::size_t lane, std::size_t line) override {
        const std::lock_guard<std::mutex> book(book_);
        if (!calling_[lane]) return;
        checkers::StoreRequest& request = requests_[*calling_[lane]];
        request.last = line;
        if (request.kind == checkers::StoreRequest::Kind::write || request.kind == checkers::StoreRequest::Kind::erase) {
            request.ended = true;
            writes_ended_ = true;
        } else if (request.kind == checkers::StoreRequest::Kind::read && bounded()) {
            request.ended = true;  // placed inside its get_cache: there it was a use (lru) and got its copy
        }
        calling_[lane] = std::nullopt;
    }

    void quiescent(Shared& shared, const std::string& after) override {
        const std::string at = "at the quiescent point after " + after + ": ";
        if (const std::optional<std::string> held = held_changed(shared)) {
            fail(shared, property_id(Property::stored_immutable), at + *held);
            return;
        }
        const std::vector<std::string> listed = reading(shared, [&] { return engine_.stored_ids(); });
        const std::set<std::string> distinct(listed.begin(), listed.end());
        if (distinct.size() != listed.size()) {
            fail(shared, property_id(Property::store_contract), at + "the store lists an id twice: " + checkers::id_list(listed));
            return;
        }
        if (writes_ended_) {
            // A line of its own: after every call that returned, before every call to come.
            note(shared, "  quiescent: the store holds " + checkers::id_list(listed));
            checkers::StoreRequest whole;
            whole.kind = checkers::StoreRequest::Kind::whole;
            whole.first = whole.last = shared.result.history.size() - 1;
            whole.ended = true;
            whole.what = "the store read at the quiescent point after " + after;
            for (const std::string& id : listed) whole.held[id] = reading(shared, [&] { return engine_.entry_digest(id); });
            requests_.push_back(std::move(whole));
            writes_ended_ = false;
        }
        judge(shared, at);
    }

    // Each dump read back: loaded into the engine (whose run is over).
    void ended(Shared& shared) override {
        for (const Dumped& dumped : dumps_) {
            checkers::StoreRequest& whole = requests_[dumped.request];
            const LoadResult loaded = engine_.load(dumped.dir);
            if (!loaded.ok) {
                note(shared, "lane " + std::to_string(whole.lane) + "'s dump does not load: " + loaded.error);
                fail(shared, property_id(Property::dump_safe), whole.what + " does not load: " + loaded.error);
                return;
            }
            for (const std::string& id : engine_.stored_ids()) whole.held[id] = engine_.entry_digest(id);
            whole.ended = true;
        }
        if (!dumps_.empty()) judge(shared, "with the dumps read back: ");
    }

  private:
    struct Dumped {
        std::string dir;
        std::size_t request = 0;
    };

    std::optional<std::string> run(const op::Add& o, checkers::StoreRequest& request) {
        CacheContent content = expand(o.cache);
        engine_.add(o.id, content, item_metadata(o.meta));
        const std::lock_guard<std::mutex> book(book_);
        contents_.push_back(std::move(content));
        request.kind = checkers::StoreRequest::Kind::write;
        request.ids = {o.id};
        request.object = static_cast<ObjectId>(contents_.size());  // 1-based: contents_[object - 1]
        return begin(std::move(request), "stored");
    }
    std::optional<std::string> run(const op::Delete& o, checkers::StoreRequest& request) {
        engine_.remove(o.ids);
        request.kind = checkers::StoreRequest::Kind::erase;
        request.ids = o.ids;
        const std::lock_guard<std::mutex> book(book_);
        return begin(std::move(request), "deleted");
    }
    // get_cache, then the copy's digest (read by its client, as part of the call).
    std::optional<std::string> run(const op::GetCache& o, checkers::StoreRequest& request) {
        if (o.ids.size() != 1 || read_of(o.out.value)) {
            throw std::invalid_argument("the thread level's store lanes read one id into a fresh handle: " + format_op(o));
        }
        engine_.get_cache(o.ids, o.out.value);
        request.kind = checkers::StoreRequest::Kind::read;
        request.ids = o.ids;
        request.handle = o.out.value;
        if (engine_.handle_facts(o.out.value).exists) {
            request.copy = engine_.handle_digest(o.out.value);
        }
        const std::lock_guard<std::mutex> book(book_);
        if (request.copy) held_[o.out.value] = *request.copy;
        reads_[o.out.value] = requests_.size();
        const bool copied = request.copy.has_value();
        return begin(std::move(request), copied ? "a copy" : "no cache");
    }
    std::optional<std::string> run(const op::Generate& o, checkers::StoreRequest&) {
        const GenerateResult result = engine_.generate(o.source.value, o.prompt, o.max, false);
        bool held = false;
        {
            const std::lock_guard<std::mutex> book(book_);
            const auto read = reads_.find(o.source.value);
            if (read != reads_.end() && !requests_[read->second].generated) {
                checkers::StoreRequest& request = requests_[read->second];
                request.generated = true;
                request.prompt = o.prompt;
                request.max = o.max;
                request.tokens = result.tokens;
            }
            held = held_.count(o.source.value) != 0;
        }
        // The model wrote into the copy: what its client now holds.
        if (held) {
            const std::uint64_t digest = engine_.handle_digest(o.source.value);
            const std::lock_guard<std::mutex> book(book_);
            held_[o.source.value] = digest;
        }
        return "generated " + checkers::tokens_text(result.tokens);
    }
    std::optional<std::string> run(const op::Release& o, checkers::StoreRequest&) {
        engine_.release(o.handle.value);
        const std::lock_guard<std::mutex> book(book_);
        const auto read = reads_.find(o.handle.value);
        if (read != reads_.end()) {
            requests_[read->second].ended = true;  // at this call's response (bounded: at its get_cache's)
            held_.erase(o.handle.value);
            if (!bounded()) calling_[static_cast<std::size_t>(requests_[read->second].lane)] = read->second;
            reads_.erase(read);
        }
        return std::string("released");
    }
    std::optional<std::string> run(const op::Dump& o, checkers::StoreRequest& request) {
        std::string dir = (posix::ram_backed_temp_dir() / "kvcheck-threads-dump-XXXXXX").string();
        if (::mkdtemp(dir.data()) == nullptr) throw std::runtime_error("cannot make a temporary directory for a dump: " + dir);
        {
            const std::lock_guard<std::mutex> book(book_);
            dirs_.push_back(dir);
        }
        engine_.dump(dir);  // other lanes may run inside: the request's index is known after it
        const std::lock_guard<std::mutex> book(book_);
        dumps_.push_back({dir, requests_.size()});
        request.kind = checkers::StoreRequest::Kind::whole;
        request.what = "lane " + std::to_string(request.lane) + "'s dump (slot " + std::to_string(o.slot) + ")";
        const std::size_t lane = static_cast<std::size_t>(request.lane);
        requests_.push_back(std::move(request));
        calling_[lane] = requests_.size() - 1;  // ends when read back
        return std::string("dumped");
    }
    bool read_of(std::int64_t handle) {
        const std::lock_guard<std::mutex> book(book_);
        return reads_.count(handle) != 0;
    }
    template <typename O>
    std::optional<std::string> run(const O&, checkers::StoreRequest&) {
        throw std::invalid_argument(std::string("the thread level's store lanes run reads, adds, deletes and dumps, not ") + O::name);
    }

    // With book_ held.
    std::optional<std::string> begin(checkers::StoreRequest request, std::string answer) {
        const std::size_t lane = static_cast<std::size_t>(request.lane);
        requests_.push_back(std::move(request));
        calling_[lane] = requests_.size() - 1;
        return answer;
    }

    // A held copy changed by anything but its own client's generations (the
    // model writes into it), or sharing storage with a stored entry.
    std::optional<std::string> held_changed(Shared& shared) {
        const std::vector<std::string> listed = reading(shared, [&] { return engine_.stored_ids(); });
        for (const auto& [handle, digest] : held_) {
            const checkers::StoreRequest& read = requests_[reads_.at(handle)];
            const std::string which = checkers::handle_text(handle) + " (lane " + std::to_string(read.lane) + "'s copy of " +
                                      checkers::in_quotes(read.ids.front()) + ")";
            const std::uint64_t now = reading(shared, [&, h = handle] { return engine_.handle_digest(h); });
            if (now != digest) return which + " changed while its client held it";
            if (!capabilities_.storage_identity) continue;
            const std::vector<std::uint64_t> mine = reading(shared, [&, h = handle] { return engine_.storage_of_handle(h); });
            for (const std::string& id : listed) {
                const std::vector<std::uint64_t> theirs = reading(shared, [&] { return engine_.storage_of_entry(id); });
                for (const std::uint64_t storage : mine) {
                    if (std::find(theirs.begin(), theirs.end(), storage) != theirs.end()) {
                        return which + " shares storage with the stored entry " + checkers::in_quotes(id);
                    }
                }
            }
        }
        return std::nullopt;
    }

    void judge(Shared& shared, const std::string& at) {
        if (!judged_) return;
        std::vector<const checkers::StoreRequest*> ended;
        for (const checkers::StoreRequest& request : requests_) {
            if (request.ended) ended.push_back(&request);
        }
        if (ended.size() > checkers::linearizable_requests_max) {
            judged_ = false;  // past what the search's memo holds: not judged further
            return;
        }
        shared.checking = true;
        std::optional<std::size_t> stuck;
        try {
            stuck = checkers::linearization_stuck(ended, *this, capabilities_.policy);
        } catch (...) {
            shared.checking = false;
            throw;
        }
        shared.checking = false;
        if (!stuck) return;
        const checkers::StoreRequest& request = *ended[*stuck];
        fail(shared, property_id(Property::linearizable),
             at + "no order of the " + std::to_string(ended.size()) +
                 " requests ended so far, each at one point between its invocation and its response, gives what they "
                 "gave: " + checkers::store_request_text(request, "lines") +
                 " (the requests of other lanes begun inside it: " + checkers::requests_inside(requests_, request, "line") + ")");
    }

    // A store with a capacity: its evictions are in the model, in the order
    // its uses made, so a read is placed inside its get_cache (its use).
    bool bounded() const { return capabilities_.policy.bounded(); }

    // ---- the model: the contents the adds stored ----

    const CacheContent& content(ObjectId object) const { return contents_.at(static_cast<std::size_t>(object - 1)); }
    bool holds_tokens(ObjectId object) override { return content_holds_tokens(content(object)); }
    std::uint64_t digest(ObjectId object) override {
        const CacheContent& held = content(object);
        return expected_digest(capabilities_.window > 0 ? expected_window(held, capabilities_.window) : held);
    }
    const Tokens& fresh(ObjectId object, const Tokens& prompt, std::int64_t max) override {
        const auto key = std::make_tuple(object, prompt, max);
        auto at = fresh_.find(key);
        if (at == fresh_.end()) at = fresh_.emplace(key, engine_.generate_fresh(content(object), prompt, max)).first;
        return at->second;
    }

    Engine& engine_;
    Capabilities capabilities_;
    std::vector<std::optional<std::size_t>> calling_;  // per lane: the request its call in progress makes or ends
    std::vector<checkers::StoreRequest> requests_;
    std::map<std::int64_t, std::size_t> reads_;  // handle -> its read, until released
    // handle -> the digest of what its client holds: the copy, then what
    // its own generations wrote into it; no other lane may change it.
    std::map<std::int64_t, std::uint64_t> held_;
    std::vector<CacheContent> contents_;         // what each add stored (ObjectId - 1)
    std::vector<Dumped> dumps_;
    std::vector<std::string> dirs_;  // the dumps' temporary directories, removed at the end
    bool writes_ended_ = true;  // the store is read whole at the next quiescent point
    bool judged_ = true;
    std::map<std::tuple<ObjectId, Tokens, std::int64_t>, Tokens> fresh_;
    // Guards the members above while lanes call at once (a stress run; at
    // the thread level only the token's holder runs): never held in an
    // engine call, so never across a yield.
    std::mutex book_;
};

}  // namespace

threads_detail::CallOutcome threads_detail::call_family(Family& family, std::size_t lane, const Op& operation, std::size_t invoked) {
    try {
        return {family.call(lane, operation, invoked), std::nullopt};
    } catch (const std::invalid_argument&) {
        throw;
    } catch (const std::exception& error) {
        if (!family.may_refuse(operation)) return {std::nullopt, std::string(error.what())};
        return {std::string("refused: ") + error.what(), std::nullopt};
    }
}

namespace {

// The call's return (or throw), in the order calls returned; its index.
std::size_t returned(Shared& shared, std::size_t lane) {
    shared.result.returned.push_back(static_cast<std::int64_t>(lane));
    return shared.result.returned.size() - 1;
}

void run_call(Shared& shared, std::size_t lane, const Op& operation) {
    const std::string who = "lane " + std::to_string(lane) + "'s " + format_op(operation);
    note(shared, "lane " + std::to_string(lane) + ": " + format_op(operation));
    const std::size_t invoked = shared.result.history.size() - 1;
    struct Blame {  // the failure, if it was found at this call's return: this call
        Shared& shared;
        bool failed_before;
        std::optional<std::size_t> index;
        ~Blame() {
            if (!failed_before && shared.result.failure && index) shared.result.failing_call = *index;
        }
    } blame{shared, shared.result.failure.has_value(), std::nullopt};
    ++shared.in_call;
    const threads_detail::CallOutcome outcome = threads_detail::call_family(shared.family, lane, operation, invoked);
    --shared.in_call;
    blame.index = returned(shared, lane);
    if (outcome.error) {
        note(shared, "lane " + std::to_string(lane) + ": threw " + *outcome.error);
        fail(shared, engine_error_id, "the engine threw at " + who + ": " + *outcome.error);
        return;
    }
    note(shared, "lane " + std::to_string(lane) + ": -> " + outcome.answer.value_or("not applicable"));
    shared.family.responded(lane, shared.result.history.size() - 1);
    if (shared.in_call == 0 && !shared.result.failure) shared.family.quiescent(shared, who);
}

void run_lane(Shared& shared, std::size_t lane, const Trace& calls) {
    current_shared = &shared;
    current_lane = lane;
    shared.scheduler->wait_turn(lane);
    try {
        for (const Op& operation : calls) {
            if (shared.result.failure) break;
            yield_in_engine("call");  // another lane may run first
            if (shared.result.failure) break;
            run_call(shared, lane, operation);
        }
    } catch (const std::exception& error) {
        const bool failed_before = shared.result.failure.has_value();
        fail(shared, engine_error_id, "lane " + std::to_string(lane) + ": " + error.what());
        // At a quiescent check this lane ran: its last call's return.
        const std::vector<std::int64_t>& calls = shared.result.returned;
        const auto own = std::find(calls.rbegin(), calls.rend(), static_cast<std::int64_t>(lane));
        if (!failed_before && own != calls.rend()) shared.result.failing_call = static_cast<std::size_t>(calls.rend() - own) - 1;
    }
    shared.scheduler->finish(lane);
    current_shared = nullptr;
}

// The yield hooks kvcheck sets: its own, and those of the plugins loaded.
std::vector<kvcheck_yield_fn*>& hook_slots() {
    static std::vector<kvcheck_yield_fn*> slots{&yield_hook};
    return slots;
}

struct HooksSet {
    HooksSet() {
        for (kvcheck_yield_fn* slot : hook_slots()) *slot = &yield_in_engine;
    }
    ~HooksSet() {
        for (kvcheck_yield_fn* slot : hook_slots()) *slot = nullptr;
    }
    HooksSet(const HooksSet&) = delete;
    HooksSet& operator=(const HooksSet&) = delete;
};

}  // namespace

void add_yield_slot(kvcheck_yield_fn* slot) {
    if (slot != nullptr && std::find(hook_slots().begin(), hook_slots().end(), slot) == hook_slots().end()) {
        hook_slots().push_back(slot);
    }
}

std::optional<std::string> store_not_judged_by_threads(const Capabilities& capabilities) {
    const StorePolicy& policy = capabilities.policy;
    if (capabilities.lease_ttl_ms > 0) return "the thread level's store lanes judge no leases (they run on kvcheck's virtual clock)";
    if (capabilities.content_tolerance.declared()) {
        return "the thread level's store lanes compare what they read with the expected content exactly, and the adapter "
               "declares a content tolerance (docs/semantics.md#content-tolerance)";
    }
    if (policy.capacity_bytes > 0) return "the thread level's store lanes judge a capacity of items, not of bytes";
    if (policy.bounded() && !evicts_in_order(policy.eviction)) {
        return std::string("the thread level's store lanes judge a capacity evicted lru, fifo or lrs, not ") + eviction_name(policy.eviction);
    }
    return std::nullopt;
}

namespace {

// Does the plan call the paged family (else: the store's)?
bool plan_is_paged(const LanePlan& plan) {
    for (const Trace& lane : plan.lanes) {
        for (const Op& operation : lane) {
            if (std::visit([](const auto& o) { return (std::decay_t<decltype(o)>::needs & needs_paged) != 0; }, operation)) return true;
        }
    }
    return false;
}

}  // namespace

std::unique_ptr<Family> threads_detail::family_for(Engine& engine, const LanePlan& plan) {
    const Capabilities capabilities = engine.capabilities();
    if (!capabilities.thread_safe) throw std::invalid_argument("the thread level needs an engine that declares thread_safe");
    if (plan_is_paged(plan)) {
        if (!capabilities.paged || engine.paged() == nullptr) throw std::invalid_argument("paged lanes need a paged engine");
        return std::make_unique<PagedFamily>(*engine.paged(), plan.lanes.size());
    }
    if (!capabilities.store) throw std::invalid_argument("store lanes need an engine with a store");
    if (const std::optional<std::string> why = store_not_judged_by_threads(capabilities)) throw std::invalid_argument(*why);
    return std::make_unique<StoreFamily>(engine, capabilities, plan.lanes.size());
}

ThreadRunResult run_threads(Engine& engine, const LanePlan& plan, const ThreadRunOptions& options) {
    const std::unique_ptr<Family> family = threads_detail::family_for(engine, plan);
    Shared shared{engine, *family, nullptr, 0, false, {}};
    for (const Op& operation : plan.lanes.at(0)) {
        if (!shared.result.failure) run_call(shared, 0, operation);
    }
    if (shared.result.failure || plan.lanes.size() < 2) return std::move(shared.result);
    Scheduler scheduler(plan.lanes.size(), options);
    shared.scheduler = &scheduler;
    {
        const HooksSet hooks;
        std::vector<std::thread> threads;
        for (std::size_t lane = 1; lane < plan.lanes.size(); ++lane) {
            threads.emplace_back(run_lane, std::ref(shared), lane, std::cref(plan.lanes[lane]));
        }
        for (std::thread& thread : threads) thread.join();
    }
    shared.scheduler = nullptr;
    if (!shared.result.failure) family->ended(shared);
    shared.result.schedule = scheduler.schedule();
    shared.result.diverged = scheduler.diverged();
    return std::move(shared.result);
}

LanePlan thread_plan(std::uint64_t seed, WorkloadOptions options) {
    options.threads = true;
    // A paged engine's lanes are paged requests; a store's, store requests.
    if (options.capabilities.paged) options.capabilities.store = false;
    SeededChooser choose(seed);
    return draw_lanes(choose, options);
}

namespace {

struct Shrinker {
    const EngineFactory& make;
    std::string property;
    std::size_t runs = 0;

    std::optional<ThreadRunResult> fails(const LanePlan& plan, const std::vector<std::int64_t>& schedule) {
        if (runs >= shrink_runs_max) return std::nullopt;
        ++runs;
        const std::shared_ptr<Engine> engine = make();
        ThreadRunResult result = run_threads(*engine, plan, {0, schedule});
        if (!result.failure || result.failure->property != property) return std::nullopt;
        return result;
    }

    // A smaller plan under each of `schedules` (the old one with its
    // choices moved to what was dropped), else under a few seeded
    // schedules: a dropped call or lane moves every choice after it, so
    // the old schedule may no longer line up. The run's own schedule (its
    // `schedule`) replays what failed.
    std::optional<ThreadRunResult> fails_rescheduled(const LanePlan& plan, const std::vector<std::vector<std::int64_t>>& schedules) {
        for (const std::vector<std::int64_t>& schedule : schedules) {
            if (auto result = fails(plan, schedule)) return result;
        }
        for (std::uint64_t seed = 1; seed <= reschedules && runs < shrink_runs_max; ++seed) {
            ++runs;
            const std::shared_ptr<Engine> engine = make();
            ThreadRunResult result = run_threads(*engine, plan, {seed, std::nullopt});
            if (result.failure && result.failure->property == property) return result;
        }
        return std::nullopt;
    }

    static constexpr std::uint64_t reschedules = 8;
};

// The schedules to try once lane `gone` is taken out (its calls dropped, or
// merged into lane `into` of what is left): later lanes move down one, and
// a choice of `gone` becomes one of `into` (where its calls now are), of
// each other lane left in turn (one that ran once `gone` had nothing left
// to run), or is left out.
std::vector<std::vector<std::int64_t>> without_lane(const std::vector<std::int64_t>& schedule, std::int64_t gone, std::int64_t into,
                                                    std::size_t lanes_left) {
    std::vector<std::int64_t> order;
    if (into >= 1) order.push_back(into);
    for (std::int64_t lane = 1; lane < static_cast<std::int64_t>(lanes_left); ++lane) {
        if (lane != into) order.push_back(lane);
    }
    std::vector<std::vector<std::int64_t>> schedules;
    for (std::size_t variant = 0; variant <= order.size(); ++variant) {
        std::vector<std::int64_t> moved;
        for (const std::int64_t lane : schedule) {
            if (lane != gone) {
                moved.push_back(lane > gone ? lane - 1 : lane);
            } else if (variant < order.size()) {
                moved.push_back(order[variant]);
            }
        }
        if (std::find(schedules.begin(), schedules.end(), moved) == schedules.end()) schedules.push_back(std::move(moved));
    }
    return schedules;
}

// Adopts a smaller plan that failed, with the schedule that ran it.
void adopt(ThreadFinding& found, std::vector<std::int64_t>& schedule, LanePlan plan, ThreadRunResult result) {
    found.plan = std::move(plan);
    schedule = result.schedule;
    found.result = std::move(result);
}

// Fewer lanes: each client lane dropped.
bool drop_lanes(Shrinker& shrinker, ThreadFinding& found, std::vector<std::int64_t>& schedule) {
    bool smaller = false;
    for (std::size_t lane = found.plan.lanes.size() - 1; lane >= 1 && found.plan.lanes.size() > 2; --lane) {
        LanePlan fewer = found.plan;
        fewer.lanes.erase(fewer.lanes.begin() + static_cast<std::ptrdiff_t>(lane));
        const auto gone = static_cast<std::int64_t>(lane);
        if (auto result = shrinker.fails_rescheduled(fewer, without_lane(schedule, gone, gone, fewer.lanes.size()))) {
            adopt(found, schedule, std::move(fewer), std::move(*result));
            smaller = true;
        }
    }
    return smaller;
}

// Fewer lanes, the calls kept: a client lane's calls appended to another
// lane's (lane 0's included: they then run alone, first), so that calls
// which need not overlap share a lane.
bool merge_lanes(Shrinker& shrinker, ThreadFinding& found, std::vector<std::int64_t>& schedule) {
    bool smaller = false;
    for (std::size_t lane = found.plan.lanes.size() - 1; lane >= 1 && found.plan.lanes.size() > 2; --lane) {
        for (std::size_t into = 0; into < found.plan.lanes.size(); ++into) {
            if (into == lane) continue;
            LanePlan merged = found.plan;
            merged.lanes[into].insert(merged.lanes[into].end(), merged.lanes[lane].begin(), merged.lanes[lane].end());
            merged.lanes.erase(merged.lanes.begin() + static_cast<std::ptrdiff_t>(lane));
            const auto gone = static_cast<std::int64_t>(lane);
            const auto target = static_cast<std::int64_t>(into > lane ? into - 1 : into);
            if (auto result = shrinker.fails_rescheduled(merged, without_lane(schedule, gone, target, merged.lanes.size()))) {
                adopt(found, schedule, std::move(merged), std::move(*result));
                smaller = true;
                break;
            }
        }
    }
    return smaller;
}

void shrink(Shrinker& shrinker, ThreadFinding& found, std::vector<std::int64_t>& schedule) {
    for (bool smaller = true; smaller;) {
        smaller = drop_lanes(shrinker, found, schedule);
        // Fewer calls, lane 0's too (a merge may have moved calls there).
        for (std::size_t lane = 0; lane < found.plan.lanes.size(); ++lane) {
            for (std::size_t at = found.plan.lanes[lane].size(); at-- > 0;) {
                LanePlan fewer = found.plan;
                fewer.lanes[lane].erase(fewer.lanes[lane].begin() + static_cast<std::ptrdiff_t>(at));
                if (auto result = shrinker.fails_rescheduled(fewer, {schedule})) {
                    adopt(found, schedule, std::move(fewer), std::move(*result));
                    smaller = true;
                }
            }
        }
        // Fewer choices: the schedule's shortest prefix that still fails,
        // then each choice left out in turn.
        for (std::size_t keep = 0; keep < schedule.size(); ++keep) {
            const std::vector<std::int64_t> prefix(schedule.begin(), schedule.begin() + static_cast<std::ptrdiff_t>(keep));
            if (auto result = shrinker.fails(found.plan, prefix)) {
                schedule = prefix;
                found.result = std::move(*result);
                smaller = true;
                break;
            }
        }
        for (std::size_t at = schedule.size(); at-- > 0;) {
            std::vector<std::int64_t> fewer = schedule;
            fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(at));
            if (auto result = shrinker.fails(found.plan, fewer)) {
                schedule = std::move(fewer);
                found.result = std::move(*result);
                smaller = true;
            }
        }
        // Merged lanes, once nothing else is dropped: the calls a merge
        // keeps are then dropped in the next round where they can be.
        if (!smaller) smaller = merge_lanes(shrinker, found, schedule);
    }
    // The schedule that replays it: as many choices as were given, each
    // the lane that did run there (a choice that could not be followed
    // reads as the lane the fallback ran), not those made past them.
    std::vector<std::int64_t>& ran = found.result.schedule;
    ran.resize(std::min(schedule.size(), ran.size()));
}

}  // namespace

std::optional<ThreadFinding> search_threads(const EngineFactory& make, const WorkloadOptions& options, std::uint64_t seed,
                                            std::size_t traces) {
    for (std::size_t trace = 0; trace < traces; ++trace) {
        const std::uint64_t trace_seed = seed + trace;
        const LanePlan plan = thread_plan(trace_seed, options);
        const std::shared_ptr<Engine> engine = make();
        ThreadRunResult result = run_threads(*engine, plan, {trace_seed, std::nullopt});
        if (!result.failure) continue;
        ThreadFinding found;
        found.seed = trace_seed;
        found.traces = trace + 1;
        found.plan = plan;
        std::vector<std::int64_t> schedule = result.schedule;
        found.result = std::move(result);
        Shrinker shrinker{make, found.result.failure->property};
        shrink(shrinker, found, schedule);
        for (std::size_t replay = 0; replay < replays_of_a_finding; ++replay) {
            const std::shared_ptr<Engine> again = make();
            const ThreadRunResult rerun = run_threads(*again, found.plan, {0, found.result.schedule});
            ++found.replays;
            if (rerun.failure && rerun.failure->property == found.result.failure->property &&
                rerun.failure->message == found.result.failure->message && rerun.history == found.result.history) {
                ++found.replays_same;
            }
        }
        return found;
    }
    return std::nullopt;
}

std::string format_thread_finding(const ThreadFinding& found) {
    const Failure& failure = *found.result.failure;
    std::string text = "ERROR: " + failure.property + ": " + failure.message + " (thread level, trace seed " +
                       std::to_string(found.seed) + ", found after " + std::to_string(found.traces) + " traces)\n";
    text += "# the lanes' calls (lane 0 ran alone first):\n";
    for (std::size_t lane = 0; lane < found.plan.lanes.size(); ++lane) {
        for (const Op& operation : found.plan.lanes[lane]) text += "#   lane " + std::to_string(lane) + ": " + format_op(operation) + "\n";
    }
    text += "# what ran, in order:\n";
    for (std::size_t line = 0; line < found.result.history.size(); ++line) {
        text += (line == failure.step ? "# > " : "#   ") + found.result.history[line] + "\n";
    }
    text += "# schedule (the lane run at each yield with a choice): " + checkers::tokens_text(found.result.schedule) + "\n";
    text += "SUMMARY: kvcheck: " + failure.property + " violated at the thread level, " +
            (found.replays_same == found.replays ? std::string("replayed alike ")
                                                 : std::string("flaky: replayed alike ") + std::to_string(found.replays_same) + " of ") +
            std::to_string(found.replays) + " times\n";
    return text;
}

}  // namespace kvcheck
