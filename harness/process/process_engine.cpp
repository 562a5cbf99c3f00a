#include "process_engine.h"

#include "paged_wire.h"
#include "wire.h"

#include "durability/dump_kill.h"
#include "kvcheck/yield.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <sys/resource.h>
#include <unistd.h>
#include <unordered_map>

namespace kvcheck::process {

struct Connection {
    std::unique_ptr<AdapterProcess> process;
    std::uint64_t session = 0;  // the engine allowed to use the process
    bool used = false;          // a request was sent since the last reset
    bool reset_due = false;     // the next request carries "reset": a fresh engine first
};

namespace {

// An operation the adapter rejected: the error, then its traceback.
std::string engine_error_text(const Json& reply) {
    std::string text = "the adapter raised ";
    const Json* error = reply.find("error");
    text += error != nullptr && error->type() == Json::Type::string ? error->as_string() : std::string("an error (no message)");
    const Json* traceback = reply.find("traceback");
    if (traceback != nullptr && traceback->type() == Json::Type::string && !traceback->as_string().empty()) {
        std::string trace = traceback->as_string();
        while (!trace.empty() && trace.back() == '\n') trace.pop_back();
        text += "\n" + trace;
    }
    return text;
}

// The adapter could not make a fresh engine (a reset): the process is of
// no more use.
[[noreturn]] void reset_failed(AdapterProcess& process, const Json& reply, const FaultHandler& on_fault) {
    const ProcessFault fault{"start", "the adapter could not make a fresh engine: " + engine_error_text(reply)};
    process.shut_down();
    if (on_fault) on_fault(fault);
    throw ProcessError(fault);
}

// An error reply that says an allocation was refused: Python's MemoryError
// (the SDK words it "MemoryError: ..."), or "out_of_memory": true from an
// adapter in any language (docs/protocol.md section 9). Under kvcheck run
// the adapter process lives under the address-space limit that backs the
// memory limit: such a refusal is the memory fault, not the engine's error.
bool refused_memory(const Json& reply) {
    const Json* flag = reply.find("out_of_memory");
    if (flag != nullptr && flag->type() == Json::Type::boolean && flag->as_bool()) return true;
    const Json* error = reply.find("error");
    return error != nullptr && error->type() == Json::Type::string && error->as_string().rfind("MemoryError", 0) == 0;
}

[[noreturn]] void memory_fault(AdapterProcess& process, const Json& reply, const FaultHandler& on_fault) {
    rlimit limit{};
    ::getrlimit(RLIMIT_AS, &limit);
    const std::string where = limit.rlim_cur == RLIM_INFINITY
                                  ? "the system refused it"
                                  : "refused at the address-space limit that backs the memory limit (" +
                                        std::to_string(limit.rlim_cur >> 20) + " MiB of address space)";
    const std::string error = engine_error_text(reply);
    const ProcessFault fault{"memory", "an allocation failed in the adapter process, " + where + ": " +
                                           error.substr(0, error.find('\n'))};
    process.shut_down();
    if (on_fault) on_fault(fault);
    throw ProcessError(fault);
}

// What is known of a handle or an entry until the next operation.
struct HandleKnown {
    std::optional<HandleFacts> facts;
    std::optional<std::uint64_t> digest;
    std::optional<std::vector<std::uint64_t>> storage;
    std::optional<Metadata> metadata;
};

struct EntryKnown {
    std::optional<std::uint64_t> digest;
    std::optional<bool> owned;
    std::optional<std::vector<std::uint64_t>> storage;
    std::optional<Metadata> metadata;
};

class ProcessEngine final : public Engine, public PagedEngine, public durability::DumpInCopy {
  public:
    ProcessEngine(std::shared_ptr<Connection> connection, std::uint64_t session, FaultHandler on_fault)
        : connection_(std::move(connection)), session_(session), hello_(connection_->process->hello()),
          on_fault_(std::move(on_fault)) {}

    std::string name() const override { return hello_.name; }
    Capabilities capabilities() const override { return hello_.capabilities; }
    PagedEngine* paged() override { return hello_.capabilities.paged ? this : nullptr; }

    // ---- the store ----

    void add(const std::string& id, const CacheContent& content, const Metadata& metadata) override {
        operation(Request("add").field("id", id).field("metadata", metadata).field("cache", content));
    }

    void add_handle(const std::string& id, Handle handle) override {
        operation(Request("add_handle").field("id", id).field("handle", handle));
    }

    void get(const std::string& id, Handle out) override { operation(Request("get").field("id", id).field("out", out)); }

    std::vector<std::optional<std::string>> get_by_ids(const std::vector<std::string>& ids) override {
        const Json reply = operation(Request("get_by_ids").field("ids", ids));
        return reading("get_by_ids", [&] {
            std::vector<std::optional<std::string>> items;
            for (const Json& item : member(reply, "items").as_array()) {
                items.push_back(item.is_null() ? std::nullopt : std::optional<std::string>(item.as_string()));
            }
            return items;
        });
    }

    std::vector<std::string> get_all_ids() override {
        const Json reply = operation(Request("get_all_ids"));
        return reading("get_all_ids", [&] { return read_strings(reply, "ids"); });
    }

    void get_cache(const std::vector<std::string>& ids, Handle out) override {
        operation(Request("get_cache").field("ids", ids).field("out", out));
    }

    void remove(const std::vector<std::string>& ids) override { operation(Request("remove").field("ids", ids)); }

    void remove_all() override { operation(Request("remove_all")); }

    void dump(const std::string& dir) override { operation(Request("dump").field("dir", dir)); }

    // dump_kill's dumps (docs/durability.md): the adapter forks a copy that
    // arms the shim kvcheck preloaded, dumps and exits; its store and
    // everything kvcheck knows of it are untouched.
    End dump_in_copy(const std::string& dir, const std::string& log_path, std::int64_t kill_at) override {
        if (!hello_.dump_fork) throw std::logic_error("dump_fork asked of an adapter that does not serve it");
        const Json reply = call(Request("dump_fork").field("dir", dir).field("log", log_path).field("kill_at", kill_at).text());
        return reading("dump_fork", [&] {
            End end;
            end.status = static_cast<int>(read_int(reply, "status"));
            if (reply.find("error") != nullptr && !reply.at("error").is_null()) end.error = read_string(reply, "error");
            return end;
        });
    }

    void dump_interrupted(const std::string& dir, std::int64_t bytes_budget) override {
        operation(Request("dump_interrupted").field("dir", dir).field("bytes_budget", bytes_budget));
    }

    LoadResult load(const std::string& dir) override {
        const Json reply = operation(Request("load").field("dir", dir));
        return reading("load", [&] {
            const Json& error = member(reply, "error");
            return error.is_null() ? LoadResult{true, {}} : LoadResult{false, error.as_string()};
        });
    }

    // ---- generation ----

    GenerateResult generate(Handle handle, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                            bool stream) override {
        const Json reply = operation(Request("generate")
                                         .field("handle", handle)
                                         .field("prompt", prompt)
                                         .field("max_new_tokens", max_new_tokens)
                                         .flag("stream", stream));
        return reading("generate", [&] {
            return GenerateResult{read_ints(reply, "tokens"), read_int(reply, "peak_live_sets")};
        });
    }

    std::vector<std::int64_t> generate_fresh(const CacheContent& content, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens) override {
        const Json reply = operation(
            Request("generate_fresh").field("prompt", prompt).field("max_new_tokens", max_new_tokens).field("cache", content));
        return reading("generate_fresh", [&] { return read_ints(reply, "tokens"); });
    }

    // ---- caches the model makes (protocol 4, docs/protocol.md section 7) ----
    // With the returned_caches capability. fed_view is read-only (a fresh
    // copy fed the tokens): an observation, so that the facts the turn's
    // reply reported stay known.

    GenerateResult generate_returning(Handle handle, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                                      Handle out) override {
        const Json reply = operation(Request("generate_returning")
                                         .field("handle", handle)
                                         .field("prompt", prompt)
                                         .field("max_new_tokens", max_new_tokens)
                                         .field("out", out));
        return reading("generate_returning", [&] {
            return GenerateResult{read_ints(reply, "tokens"), read_int(reply, "peak_live_sets")};
        });
    }

    void extract(const std::string& id, const std::vector<std::int64_t>& prompt) override {
        operation(Request("extract").field("id", id).field("prompt", prompt));
    }

    CacheView fed_view(const CacheContent& content, const std::vector<std::int64_t>& tokens) override {
        const Json reply = observation(Request("fed_view").field("tokens", tokens).field("cache", content));
        return reading("fed_view", [&] { return read_view(member(reply, "view")); });
    }

    // ---- cache-level ----

    void make(const CacheContent& content, Handle out) override {
        operation(Request("make").field("out", out).field("cache", content));
    }

    void clone(Handle source, Handle out) override { operation(Request("clone").field("source", source).field("out", out)); }
    void to_legacy(Handle source, Handle out) override { operation(Request("to_legacy").field("source", source).field("out", out)); }
    void from_legacy(Handle source, Handle out) override { operation(Request("from_legacy").field("source", source).field("out", out)); }

    void concat(const std::vector<Handle>& parts, Handle out) override {
        operation(Request("concat").field("parts", parts).field("out", out));
    }

    void release(Handle handle) override { operation(Request("release").field("handle", handle)); }
    // With the trim capability.
    void trim(Handle handle, std::int64_t keep) override {
        operation(Request("trim").field("handle", handle).field("keep", keep));
    }
    // With lease_ttl_ms (docs/protocol.md, "Leases"): the adapter's clock
    // is kvcheck's, moved only by advance_clock.
    void advance_clock(std::int64_t ms) override { operation(Request("advance_clock").field("ms", ms)); }
    void lease(const std::string& id) override { operation(Request("lease").field("id", id)); }
    void unlease(const std::string& id) override { operation(Request("unlease").field("id", id)); }
    // With the batch capability.
    void batch_row(const std::vector<Handle>& rows, std::int64_t repeat, const std::vector<std::int64_t>& reorder,
                   std::int64_t select, Handle out) override {
        operation(Request("batch")
                      .field("rows", rows)
                      .field("repeat", repeat)
                      .field("reorder", reorder)
                      .field("select", select)
                      .field("out", out));
    }

    // ---- the reads after a step ----

    void expect_reads(const std::vector<std::string>& entries, bool every_entry) override {
        const auto lock = kvcheck::lock_yielding(state_mutex_);
        read_ids_ = entries;
        read_store_ = every_entry;
    }

    // ---- observations ----

    std::vector<std::string> stored_ids() override {
        const Observing observing(*this);
        check_current();
        if (!stored_ids_) {
            const Json reply = observation(Request("stored_ids"));
            stored_ids_ = reading("stored_ids", [&] { return read_strings(reply, "ids"); });
        }
        return *stored_ids_;
    }

    CacheView view_entry(const std::string& id) override {
        const Json reply = observation(Request("view_entry").field("id", id));
        return reading("view_entry", [&] { return read_view(member(reply, "view")); });
    }

    Metadata entry_metadata(const std::string& id) override {
        const Observing observing(*this);
        check_current();
        if (const auto found = entries_.find(id); found != entries_.end() && found->second.metadata) {
            return *found->second.metadata;
        }
        const Json reply = observation(Request("entry_metadata").field("id", id));
        Metadata metadata = reading("entry_metadata", [&] { return read_metadata(member(reply, "metadata")); });
        entries_[id].metadata = metadata;
        return metadata;
    }

    Metadata handle_metadata(Handle handle) override {
        const Observing observing(*this);
        check_current();
        if (const auto found = handles_.find(handle); found != handles_.end() && found->second.metadata) {
            return *found->second.metadata;
        }
        const Json reply = observation(Request("handle_metadata").field("handle", handle));
        Metadata metadata = reading("handle_metadata", [&] { return read_metadata(member(reply, "metadata")); });
        handles_[handle].metadata = metadata;
        return metadata;
    }

    CacheView view_handle(Handle handle) override {
        const Json reply = observation(Request("view_handle").field("handle", handle));
        return reading("view_handle", [&] { return read_view(member(reply, "view")); });
    }

    std::uint64_t entry_digest(const std::string& id) override {
        const Observing observing(*this);
        check_current();
        EntryKnown& known = entry(id);
        if (!known.digest) fetch_entries_with(id);
        return entry_fact(id, &EntryKnown::digest, "digest");
    }

    bool entry_owned(const std::string& id) override {
        const Observing observing(*this);
        check_current();
        EntryKnown& known = entry(id);
        if (!known.owned) fetch_entries_with(id);
        return entry_fact(id, &EntryKnown::owned, "owned");
    }

    std::vector<std::uint64_t> storage_of_entry(const std::string& id) override {
        const Observing observing(*this);
        check_current();
        EntryKnown& known = entry(id);
        if (!known.storage) fetch_entries_with(id);
        return entry_fact(id, &EntryKnown::storage, "storage");
    }

    std::uint64_t handle_digest(Handle handle) override {
        const Observing observing(*this);
        check_current();
        HandleKnown& known = handles_[handle];
        if (!known.digest && !known.facts) fetch_handle(handle);
        if (!handles_[handle].digest) {
            const Json reply = observation(Request("handle_digest").field("handle", handle));
            handles_[handle].digest = reading("handle_digest", [&] {
                const std::optional<std::uint64_t> digest = read_digest(reply);
                if (!digest) throw ProtocolError("the reply has neither 'digest' nor 'view'");
                return *digest;
            });
        }
        return *handles_[handle].digest;
    }

    HandleFacts handle_facts(Handle handle) override {
        const Observing observing(*this);
        check_current();
        if (!handles_[handle].facts) fetch_handle(handle);
        return *handles_[handle].facts;
    }

    std::vector<std::uint64_t> storage_of_handle(Handle handle) override {
        const Observing observing(*this);
        check_current();
        HandleKnown& known = handles_[handle];
        if (!known.storage && !known.facts) fetch_handle(handle);
        if (!handles_[handle].storage) {
            const Json reply = observation(Request("storage_of_handle").field("handle", handle));
            handles_[handle].storage = reading("storage_of_handle", [&] { return read_uints(reply, "storage"); });
        }
        return *handles_[handle].storage;
    }

    std::vector<CopyRecord> take_copies() override {
        const Observing observing(*this);
        check_current();
        if (!hello_.copies_in_replies) {
            const Json reply = observation(Request("take_copies"));
            return reading("take_copies", [&] { return read_copies(member(reply, "copies")); });
        }
        std::vector<CopyRecord> taken;
        taken.swap(copies_);
        return taken;
    }

    std::uint64_t entry_version(const std::string& id) override {
        const Json reply = observation(Request("entry_version").field("id", id));
        return reading("entry_version", [&] { return read_uint(reply, "version"); });
    }

    std::vector<std::uint64_t> entry_versions(const std::vector<std::string>& ids) override {
        const Json reply = observation(Request("entry_versions").field("ids", ids));
        return reading("entry_versions", [&] { return read_uints(reply, "versions"); });
    }

    std::vector<EntryFacts> read_entries(const std::vector<std::string>& ids, bool with_storage) override {
        const Observing observing(*this);
        check_current();
        std::vector<std::string> missing;
        for (const std::string& id : ids) {
            const EntryKnown& known = entry(id);
            if (!known.digest || !known.owned || (with_storage && !known.storage)) missing.push_back(id);
        }
        if (!missing.empty()) fetch_entries(missing);
        std::vector<EntryFacts> facts;
        facts.reserve(ids.size());
        for (const std::string& id : ids) {
            EntryFacts fact;
            fact.digest = entry_fact(id, &EntryKnown::digest, "digest");
            fact.owned = entry_fact(id, &EntryKnown::owned, "owned");
            if (with_storage) fact.storage = entry_fact(id, &EntryKnown::storage, "storage");
            facts.push_back(std::move(fact));
        }
        return facts;
    }

    // ---- the paged family (docs/protocol.md, "Paged requests") ----
    // Every paged operation's reply carries the pool's state after it,
    // kept until the next operation (paged_state asks only without one).

    std::int64_t paged_alloc(std::int64_t seq, const PagedTokens& tokens, std::int64_t salt) override {
        const Json reply =
            paged_operation("paged_alloc", Request("paged_alloc").field("seq", seq).field("tokens", tokens).field("salt", salt));
        return reading("paged_alloc", [&] { return read_int(reply, "cached"); });
    }

    PagedTokens paged_append(std::int64_t seq, std::int64_t count) override {
        const Json reply = paged_operation("paged_append", Request("paged_append").field("seq", seq).field("count", count));
        return reading("paged_append", [&] { return read_ints(reply, "tokens"); });
    }

    void paged_fork(std::int64_t parent, std::int64_t child) override {
        paged_operation("paged_fork", Request("paged_fork").field("parent", parent).field("child", child));
    }

    void paged_free(std::int64_t seq) override { paged_operation("paged_free", Request("paged_free").field("seq", seq)); }

    std::int64_t paged_lookup(const PagedTokens& tokens, std::int64_t salt) override {
        const Json reply = paged_operation("paged_lookup", Request("paged_lookup").field("tokens", tokens).field("salt", salt));
        return reading("paged_lookup", [&] { return read_int(reply, "cached"); });
    }

    void paged_evict() override { paged_operation("paged_evict", Request("paged_evict")); }
    void paged_reset() override { paged_operation("paged_reset", Request("paged_reset")); }
    void paged_step() override { paged_operation("paged_step", Request("paged_step")); }

    void paged_import(std::int64_t seq, const CacheContent& content) override {
        paged_operation("paged_import", Request("paged_import").field("seq", seq).field("cache", content));
    }

    void paged_rewind(std::int64_t seq, std::int64_t count, std::int64_t token) override {
        paged_operation("paged_rewind", Request("paged_rewind").field("seq", seq).field("count", count).field("token", token));
    }

    PagedExported paged_export(std::int64_t seq) override {
        const Json reply = paged_operation("paged_export", Request("paged_export").field("seq", seq));
        return reading("paged_export", [&] {
            return PagedExported{read_view(member(reply, "view")), read_uints(reply, "storage")};
        });
    }

    PagedState paged_state() override {
        const Observing observing(*this);
        check_current();
        if (!paged_state_) {
            const Json reply = observation(Request("paged_state"));
            paged_state_ = reading("paged_state", [&] { return read_paged_state(member(reply, "state")); });
        }
        return *paged_state_;
    }

    CacheView paged_block_view(std::int64_t block, std::int64_t slots) override {
        const Json reply = observation(Request("paged_block_view").field("block", block).field("slots", slots));
        return reading("paged_block_view", [&] { return read_view(member(reply, "view")); });
    }

    CacheView paged_sequence_view(std::int64_t seq) override {
        const Json reply = observation(Request("paged_sequence_view").field("seq", seq));
        return reading("paged_sequence_view", [&] { return read_view(member(reply, "view")); });
    }

    CacheView paged_fresh_view(const PagedTokens& tokens, std::int64_t salt, std::int64_t first, std::int64_t count) override {
        const Json reply =
            observation(Request("paged_fresh_view").field("tokens", tokens).field("salt", salt).field("first", first).field("count", count));
        return reading("paged_fresh_view", [&] { return read_view(member(reply, "view")); });
    }

    std::vector<std::uint64_t> paged_pool_storage() override {
        const Json reply = observation(Request("paged_pool_storage"));
        return reading("paged_pool_storage", [&] { return read_uints(reply, "storage"); });
    }

  private:
    // A request that may change what the engine holds: everything known
    // is forgotten first, then what the reply reports is kept.
    // The request says what kvcheck reads after it (expect_reads), so that
    // the reply can report those facts.
    //
    // A thread-safe adapter's operations may overlap (several threads call
    // at once): the facts a reply reports are kept only from an operation
    // that ran alone, started and ended with no other in flight; what the
    // store holds after overlapping ones is asked again. The copies every
    // reply reports are kept.
    // A paged operation (`paged_op`, its name) keeps the pool's state its
    // reply carries.
    Json operation(const Request& request, const char* paged_op = nullptr) {
        std::unique_lock<std::recursive_mutex> lock = kvcheck::lock_yielding(state_mutex_);
        forget();
        const bool started_alone = operations_in_flight_ == 0;
        const std::uint64_t started_at = ++operations_started_;
        ++operations_in_flight_;
        std::string text = request.text();
        if (read_store_) {
            text.insert(text.size() - 1, R"(,"read_store":true)");
        } else if (!read_ids_.empty()) {
            std::string ids = R"(,"read_ids":)";
            append_strings(ids, read_ids_);
            text.insert(text.size() - 1, ids);
        }
        struct Ended {  // also when the call throws, its lock released
            ProcessEngine& engine;
            ~Ended() {
                const auto relock = kvcheck::lock_yielding(engine.state_mutex_);
                --engine.operations_in_flight_;
            }
        };
        Json reply;
        {
            const Ended ended{*this};
            if (hello_.capabilities.thread_safe) lock.unlock();
            reply = call(std::move(text));
            if (!lock.owns_lock()) lock = kvcheck::lock_yielding(state_mutex_);
        }
        const bool alone = started_alone && operations_started_ == started_at;
        reading("the reply's observed facts", [&] {
            absorb(reply, alone);
            return 0;
        });
        const Json* state = alone && paged_op != nullptr ? reply.find("state") : nullptr;
        if (state != nullptr) paged_state_ = reading(paged_op, [&] { return read_paged_state(*state); });
        return reply;
    }

    // Everything known of the handles, the entries and the pool.
    void forget() {
        handles_.clear();
        entries_.clear();
        stored_ids_.reset();
        paged_state_.reset();
    }

    // Held by every method that reads or keeps what is known: an
    // observation made while an operation is in flight (a thread-safe
    // adapter's) is returned, not kept.
    struct Observing {
        explicit Observing(ProcessEngine& engine) : engine(engine), lock(kvcheck::lock_yielding(engine.state_mutex_)) {}
        ~Observing() {
            if (engine.operations_in_flight_ > 0) engine.forget();
        }
        ProcessEngine& engine;
        std::unique_lock<std::recursive_mutex> lock;
    };

    Json observation(const Request& request) { return call(request.text()); }

    // A paged operation: an operation whose reply carries the pool's state.
    Json paged_operation(const char* op, const Request& request) { return operation(request, op); }

    // What this engine knows is of its own session: once the process was
    // reset for a newer engine, this one answers nothing, not even from
    // what it kept.
    void check_current() const {
        if (connection_->session != session_ || !connection_->process || !connection_->process->alive()) {
            throw std::logic_error("this engine's adapter process was reset for a newer engine (one engine per trace)");
        }
    }

    // The first request after a reset carries it (ProcessLauncher::make):
    // the adapter makes a fresh engine, then answers the request.
    //
    // A thread-safe adapter's requests go out side by side (several in
    // flight at once, from the calling threads), but for one carrying the
    // reset: it is answered before any other request is sent.
    Json call(std::string text) {
        std::unique_lock<std::recursive_mutex> lock = kvcheck::lock_yielding(state_mutex_);
        check_current();
        connection_->used = true;
        const bool resetting = connection_->reset_due;
        if (resetting) text.insert(1, R"("reset":true,)");
        AdapterProcess& process = *connection_->process;
        Json reply;
        if (hello_.capabilities.thread_safe && !resetting) {
            lock.unlock();
            reply = process.call_concurrent(text);
            lock = kvcheck::lock_yielding(state_mutex_);
        } else {
            reply = hello_.capabilities.thread_safe ? process.call_concurrent(text) : process.call(text);
        }
        connection_->reset_due = false;
        if (!reply.at("ok").as_bool()) {
            if (resetting && reply.find("reset_failed") != nullptr) reset_failed(*connection_->process, reply, on_fault_);
            if (refused_memory(reply)) memory_fault(*connection_->process, reply, on_fault_);
            throw std::runtime_error(engine_error_text(reply));
        }
        return reply;
    }

    // A reply's content that breaks the protocol is a process fault, not
    // an engine error: the adapter is broken, not the engine.
    template <typename Read>
    auto reading(const char* what, Read read) -> decltype(read()) {
        try {
            return read();
        } catch (const std::exception& error) {
            const ProcessFault fault{"protocol", std::string("the adapter's reply to ") + what +
                                                     " breaks the protocol: " + error.what()};
            connection_->process->shut_down();
            if (on_fault_) on_fault_(fault);
            throw ProcessError(fault);
        }
    }

    // The copies a reply reports, and (`facts`) what it observed.
    void absorb(const Json& reply, bool facts) {
        if (hello_.copies_in_replies) {
            if (const Json* copies = reply.find("copies")) {
                std::vector<CopyRecord> made = read_copies(*copies);
                copies_.insert(copies_.end(), made.begin(), made.end());
            }
        }
        const Json* observed = facts ? reply.find("observed") : nullptr;
        if (observed == nullptr) return;
        if (const Json* handles = observed->find("handles")) {
            for (const Json& facts : handles->as_array()) keep_handle(facts);
        }
        if (const Json* entries = observed->find("entries")) {
            for (const Json& facts : entries->as_array()) keep_entry(read_string(facts, "id"), facts);
        }
        if (observed->find("stored_ids") != nullptr) stored_ids_ = read_strings(*observed, "stored_ids");
    }

    void keep_handle(const Json& facts) {
        HandleKnown& known = handles_[read_int(facts, "handle")];
        known.facts = HandleFacts{read_bool(facts, "exists"), read_bool(facts, "owned")};
        if (const std::optional<std::uint64_t> digest = read_digest(facts)) known.digest = digest;
        if (facts.find("storage") != nullptr) known.storage = read_uints(facts, "storage");
        if (!known.facts->exists) known.storage = std::vector<std::uint64_t>{};
        if (const Json* metadata = facts.find("metadata")) known.metadata = read_metadata(*metadata);
    }

    void keep_entry(const std::string& id, const Json& facts) {
        EntryKnown& known = entries_[id];
        if (const std::optional<std::uint64_t> digest = read_digest(facts)) known.digest = digest;
        if (facts.find("owned") != nullptr) known.owned = read_bool(facts, "owned");
        if (facts.find("storage") != nullptr) known.storage = read_uints(facts, "storage");
        if (const Json* metadata = facts.find("metadata")) known.metadata = read_metadata(*metadata);
    }

    EntryKnown& entry(const std::string& id) { return entries_[id]; }

    template <typename T>
    T entry_fact(const std::string& id, std::optional<T> EntryKnown::*field, const char* name) {
        const std::optional<T>& value = entries_[id].*field;
        if (!value) {
            return reading("read_entries", [&]() -> T {
                throw ProtocolError("no '" + std::string(name) + "' for entry \"" + id + "\"");
            });
        }
        return *value;
    }

    // The facts of `id`, and of every other entry the listing names that
    // lacks some: the checks ask about one entry at a time, and then
    // about the next (every entry at a full read; those an operation
    // names before it runs): one request instead of one per entry.
    void fetch_entries_with(const std::string& id) {
        std::vector<std::string> ids{id};
        if (stored_ids_) {
            for (const std::string& other : *stored_ids_) {
                if (other == id) continue;
                const auto found = entries_.find(other);
                const bool complete = found != entries_.end() && found->second.digest && found->second.owned &&
                                      (found->second.storage || !hello_.capabilities.storage_identity);
                if (!complete) ids.push_back(other);
            }
        }
        fetch_entries(ids);
    }

    void fetch_entries(const std::vector<std::string>& ids) {
        const Json reply =
            observation(Request("read_entries").field("ids", ids).flag("with_storage", hello_.capabilities.storage_identity));
        reading("read_entries", [&] {
            const std::vector<Json>& entries = member(reply, "entries").as_array();
            if (entries.size() != ids.size()) {
                throw ProtocolError("'entries' holds " + std::to_string(entries.size()) + " facts for " +
                                    std::to_string(ids.size()) + " ids");
            }
            for (std::size_t i = 0; i < ids.size(); ++i) keep_entry(ids[i], entries[i]);
            return 0;
        });
    }

    void fetch_handle(Handle handle) {
        const Json reply = observation(Request("handle_facts").field("handle", handle));
        reading("handle_facts", [&] {
            HandleKnown& known = handles_[handle];
            known.facts = HandleFacts{read_bool(reply, "exists"), read_bool(reply, "owned")};
            if (const std::optional<std::uint64_t> digest = read_digest(reply)) known.digest = digest;
            if (reply.find("storage") != nullptr) known.storage = read_uints(reply, "storage");
            if (const Json* metadata = reply.find("metadata")) known.metadata = read_metadata(*metadata);
            return 0;
        });
    }

    std::shared_ptr<Connection> connection_;
    std::uint64_t session_;
    Hello hello_;
    FaultHandler on_fault_;
    std::unordered_map<Handle, HandleKnown> handles_;
    std::unordered_map<std::string, EntryKnown> entries_;
    std::optional<std::vector<std::string>> stored_ids_;
    std::optional<PagedState> paged_state_;  // the pool after the last paged operation
    std::vector<CopyRecord> copies_;  // reported with operations, not yet taken
    // What the harness reads after the operations of the current step.
    std::vector<std::string> read_ids_;
    bool read_store_ = false;
    // Guards everything above once a thread-safe adapter's operations
    // overlap (operation, Observing). Taken with kvcheck::lock_yielding:
    // under the thread level its holder may be a client waiting at a yield
    // point (a reply it waits for), and the thread that wants it lets that
    // client run instead of blocking the only one running.
    std::recursive_mutex state_mutex_;
    std::uint64_t operations_started_ = 0;
    int operations_in_flight_ = 0;
};

}  // namespace

ProcessLauncher::ProcessLauncher(ProcessCommand command, LaunchOptions options)
    : command_(std::move(command)), options_(std::move(options)), owner_(::getpid()),
      connection_(std::make_shared<Connection>()) {
    // Named after this process: a later kvcheck removes it if this one is
    // killed before its destructor runs (sandbox.cpp, remove_stale_job_dirs).
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kvcheck-adapter-" +
                          std::to_string(::getpid()) + "-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
        throw ProcessError({"start", "cannot make a directory for the adapter's output (" + pattern + "): " + std::strerror(errno)});
    }
    directory_ = pattern;
}

ProcessLauncher::~ProcessLauncher() {
    if (::getpid() != owner_) return;  // a forked child's copy: the parent cleans up
    connection_->process.reset();
    fork_server_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
}

std::string ProcessLauncher::output_path(const std::string& name) const { return directory_ + "/" + name + ".out"; }

Hello ProcessLauncher::probe() {
    const std::string path = output_path("handshake");
    struct Remove {
        const std::string& path;
        ~Remove() { std::remove(path.c_str()); }
    } remove{path};
    if (!options_.warm_starts || ::getpid() != owner_) {
        AdapterProcess process(command_, path, options_.handshake_seconds);
        return process.hello();
    }
    fork_server_.reset();
    auto server = std::make_unique<AdapterProcess>(AdapterProcess::OfferFork{}, command_, output_path("fork-server"),
                                                   options_.handshake_seconds);
    const Hello hello = server->hello();
    if (hello.fork) fork_server_ = std::move(server);
    return hello;
}

bool ProcessLauncher::warm() const { return fork_server_ && fork_server_->alive() && fork_server_->hello().fork; }

std::shared_ptr<Engine> ProcessLauncher::make() {
    Connection& connection = *connection_;
    const bool usable = connection.process && connection.process->owned_here() && connection.process->alive();
    if (!usable) {
        // An inherited process (a forked child's copy) only closes its
        // descriptors here; the parent still owns it.
        connection.process.reset();
        const std::string output = output_path(std::to_string(::getpid()));
        if (warm()) {
            try {
                // The copy is the job's from its start: its handshake's time
                // is the engine's (its memory, its stillness).
                connection.process = std::make_unique<AdapterProcess>(
                    AdapterProcess::ForkFrom{*fork_server_, directory_ + "/fork.lock", options_.on_warm_start}, output,
                    options_.handshake_seconds, options_.on_fault);
            } catch (const ProcessError& error) {
                if (error.fault().kind != "fork") throw;
                // The server is gone or refused: the command, started cold.
            }
        }
        if (!connection.process) {
            connection.process = std::make_unique<AdapterProcess>(command_, output, options_.handshake_seconds,
                                                                  options_.on_fault);
        }
        // A zygote's copy serves the pipes: its CPU and memory are the engine's.
        const int served = connection.process->hello().pid;
        if (served > 0 && options_.on_warm_start) options_.on_warm_start(served);
        connection.reset_due = false;
    } else if (connection.used) {
        // The reset goes with the new engine's first request: one round
        // trip less per trace.
        connection.process->clear_output();
        connection.reset_due = true;
    }
    connection.used = false;
    ++connection.session;
    return std::make_shared<ProcessEngine>(connection_, connection.session, options_.on_fault);
}

std::shared_ptr<Engine> ProcessLauncher::make_isolated() {
    // An inherited process (a forked child's copy) only closes its
    // descriptors here; one this process started is stopped.
    connection_->process.reset();
    // What the stopped process printed (its shutdown included) is not the
    // fresh one's.
    std::remove(output_path(std::to_string(::getpid())).c_str());
    return make();
}

int ProcessLauncher::process_id() const {
    const AdapterProcess* process = connection_->process.get();
    return process != nullptr && process->owned_here() && process->alive() ? process->pid() : -1;
}

std::string ProcessLauncher::take_output(int pid, std::size_t bytes_max) {
    const std::string path = output_path(std::to_string(pid > 0 ? pid : ::getpid()));
    const std::string tail = file_tail(path, bytes_max);
    // The process of the current one keeps writing there: only a finished
    // child's file goes.
    if (pid > 0 && pid != ::getpid()) std::remove(path.c_str());
    return tail;
}

}  // namespace kvcheck::process
