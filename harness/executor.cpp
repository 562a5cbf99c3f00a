// The executor: one trace against one engine, with the auditor in step and
// the named checkers run around every operation.
//
// What is read when. The checks of an operation's own result (the cache it
// made, the copies it logged, the tokens it generated) run at its step,
// always. The stored entries are read on a schedule that follows what an
// operation can reach, so that a step costs what it touches, not what the
// store holds:
// - after a step: the entries it names, and the entries that share storage
//   with a handle it names (before or after it ran: that is how a model's
//   in-place write reaches the store); the ownership of the handles it
//   names; the listing, while the store is small (listing_every_step_max);
// - before a step that replaces or removes the entries it names (add,
//   delete), those entries, so that a change is not wiped before it is seen;
// - every entry, the listing and every handle ("a full read"): before and
//   after a step that reads or replaces the whole store (dump, load,
//   delete_all), every max(sweep_steps_min, entries) steps, and at the end
//   of the run, then without entry versions.
// A change no handle can reach (an engine writing into an entry it was not
// asked about) is therefore found at the next full read, at a later step than
// it happened; RunOptions::every_entry_every_step reads everything after
// every step instead and pins it to its step (kvcheck re-runs a shrunk trace
// that way before reporting it). Without storage identities no handle can
// be traced to the entries it reaches, and every step is a full read.
#include "kvcheck/executor.h"

#include "auditor.h"
#include "id_map.h"
#include "storage_index.h"

#include <boost/pfr.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <unordered_map>

namespace kvcheck {
namespace {

namespace fs = std::filesystem;

struct PropertyInfo {
    Property property;
    const char* id;
    const char* summary;
};

constexpr std::array<PropertyInfo, property_count> property_table{{
    {Property::stored_immutable, "stored-immutable",
     "stored entries never change, and nothing handed out of the store aliases them"},
    {Property::single_copy, "single-copy", "each generation copies the stored K/V once at most; two K/V sets alive"},
    {Property::layout_roundtrip, "layout-roundtrip", "conversions, clone and dump/load are identities"},
    {Property::merge_correct, "merge-correct", "merged caches: true length, request order, initialized, owned"},
    {Property::owned_marker, "owned-marker", "only caches sharing nothing with the store are marked owned"},
    {Property::clone_independent, "clone-independent", "a clone shares no tensor, layer or list with its source"},
    {Property::generation_equivalent, "generation-equivalent", "generating via the store equals generating from a fresh copy"},
    {Property::dump_safe, "dump-safe", "dumps round-trip; bad or interrupted dumps never lose data"},
    {Property::store_contract, "store-contract", "ids, order and missing ids of the store API"},
}};

// Generation needs a cache whose layers hold as many keys as values.
bool generation_compatible(const CacheContent& content) {
    for (std::size_t i = 0; i < content.layers.size(); ++i) {
        const SlotContent k = logical_slot(content, i, keys);
        const SlotContent v = logical_slot(content, i, values);
        if (k.tokens() != v.tokens()) return false;
    }
    return true;
}

std::string in_quotes(const std::string& id) { return "\"" + id + "\""; }
std::string handle_text(std::int64_t handle) { return "h" + std::to_string(handle); }

std::string tokens_text(const std::vector<std::int64_t>& tokens) {
    std::string text = "[";
    for (std::size_t i = 0; i < tokens.size(); ++i) text += (i ? "," : "") + std::to_string(tokens[i]);
    return text + "]";
}

// What an operation names: the schedule of reads around it follows from it.
struct StepScope {
    std::vector<std::string> ids;       // stored entries it names
    std::vector<std::int64_t> handles;  // handles it reads or binds (never h0)
    bool destroys_named = false;        // it replaces or removes the entries it names
    bool whole_store = false;           // it reads or replaces the whole store
    bool membership = false;            // it may change which ids the store holds
};

template <typename T>
void add_unique(std::vector<T>& list, const T& value) {
    if (std::find(list.begin(), list.end(), value) == list.end()) list.push_back(value);
}

StepScope scope_of(const Op& operation) {
    StepScope scope;
    std::visit(
        [&scope](const auto& o) {
            using T = std::decay_t<decltype(o)>;
            boost::pfr::for_each_field(o, [&scope](const auto& field) {
                using F = std::decay_t<decltype(field)>;
                if constexpr (std::is_same_v<F, std::string>) {
                    add_unique(scope.ids, field);
                } else if constexpr (std::is_same_v<F, Ids>) {
                    for (const std::string& id : field) add_unique(scope.ids, id);
                } else if constexpr (std::is_same_v<F, HandleName>) {
                    if (field.value != 0) add_unique(scope.handles, field.value);
                } else if constexpr (std::is_same_v<F, HandleNames>) {
                    for (const HandleName& handle : field) {
                        if (handle.value != 0) add_unique(scope.handles, handle.value);
                    }
                }
            });
            scope.destroys_named = T::reach == StoreReach::replaces_named;
            scope.whole_store = T::reach == StoreReach::whole_store;
            scope.membership = T::changes_ids;
        },
        operation);
    return scope;
}

// A full read at least this often (in steps), and once per entry in a big
// store: a change no handle reaches is found within that many steps.
constexpr std::size_t sweep_steps_min = 16;
// Up to this many entries the listing is compared after every step that may
// change it; beyond, at full reads (listing a thousand ids costs more than
// the operation).
constexpr std::size_t listing_every_step_max = 64;

class Run {
  public:
    Run(Engine& engine, const RunOptions& options)
        : engine_(engine), options_(options), capabilities_(engine.capabilities()) {
        properties_ = options.properties;
        const PropertySet possible = checkable(capabilities_);
        for (Property p : all_properties()) {
            if (!possible.has(p)) properties_.remove(p);
        }
        work_dir_ = options.work_dir;
        trust_versions_ = capabilities_.entry_versions;
        every_step_ = options.every_entry_every_step || !capabilities_.storage_identity;
        reads_store_ = properties_.has(Property::stored_immutable) || properties_.has(Property::owned_marker) ||
                       properties_.has(Property::store_contract);
    }

    ~Run() {
        if (own_work_dir_) {
            std::error_code ignored;
            fs::remove_all(work_dir_, ignored);
        }
    }

    RunResult run(const Trace& trace) {
        for (step_ = 0; step_ < trace.size() && !result_.failure; ++step_) {
            if (options_.on_step) options_.on_step(step_);
            try {
                run_step(trace[step_]);
            } catch (const std::exception& error) {
                fail_as(engine_error_id, std::string("the engine threw: ") + error.what());
            }
            note_.clear();
            result_.steps_run = step_ + 1;
            settle_step();
        }
        if (!result_.failure && !trace.empty() && reads_store_) recheck_everything(trace.size() - 1);
        return std::move(result_);
    }

  private:
    // ---- the schedule ----

    void run_step(const Op& operation) {
        if (!op_well_formed(operation) || !engine_supports(capabilities_, op_needs(operation.index()))) {
            ++result_.coverage.ops_skipped;
            return;
        }
        const StepScope scope = scope_of(operation);
        std::vector<std::string> reached;
        if (reads_store_ && !every_step_) {
            check_before(scope);
            if (!step_failures_.empty()) return;
            reached = entries_reached(scope.handles);
        }
        for (const std::int64_t handle : scope.handles) handle_readings_.erase(handle);
        const bool ran = std::visit([this](const auto& op) { return apply(op); }, operation);
        if (!ran) {
            ++result_.coverage.ops_skipped;
            return;
        }
        ++result_.coverage.ops_run[operation.index()];
        record_state(operation);
        if (scope.membership) listing_due_ = true;
        if (reads_store_) check_after(scope, reached);
    }

    // The evidence an operation is about to replace, read while it is there.
    void check_before(const StepScope& scope) {
        if (scope.whole_store) {
            check_everything(" (read before this operation read or replaced the whole store)");
            return;
        }
        if (!scope.destroys_named) return;
        begin_round();
        note_ = " (read before this operation replaced or removed it)";
        check_entries(scope.ids);
        note_.clear();
    }

    void check_after(const StepScope& scope, std::vector<std::string> reached) {
        ++steps_since_full_read_;
        if (every_step_ || scope.whole_store) {
            check_everything("");
            return;
        }
        if (steps_since_full_read_ >= std::max(sweep_steps_min, audit_.order().size())) {
            check_everything(" (found by the periodic read of every entry: it may have happened at an earlier step; "
                             "kvcheck replay pins it to its step)");
            return;
        }
        begin_round();
        for (const std::string& id : scope.ids) add_unique(reached, id);
        for (const std::string& id : entries_reached(scope.handles)) add_unique(reached, id);
        if (listing_due_ && audit_.order().size() <= listing_every_step_max) check_listing();
        const std::vector<std::string> renewed = check_entries(reached);
        check_ownership_of(scope.handles, renewed);
    }

    // The store's listing, its content and every handle's ownership.
    void check_everything(const std::string& note) {
        note_ = note;
        begin_round();
        handle_readings_.clear();
        steps_since_full_read_ = 0;
        check_listing();
        read_every_entry();
        note_.clear();
    }

    // ---- failures ----

    // Is `p` checked, and not already violated at this step?
    bool checking(Property p) const {
        if (!properties_.has(p)) return false;
        for (const Failure& failure : step_failures_) {
            if (failure.property == property_id(p)) return false;
        }
        return true;
    }

    void fail_as(const std::string& property, const std::string& message) {
        const char* late = rechecking_ ? " (found when every entry was read again at the end of the run)" : "";
        step_failures_.push_back(Failure{property, step_, message + note_ + late, {}});
    }

    // Every violation of a step is kept; the first in property order is the
    // one reported (an engine error first of all: it cut the step short).
    void settle_step() {
        if (step_failures_.empty()) return;
        auto rank = [](const Failure& f) {
            const auto p = parse_property(f.property);
            return p ? static_cast<int>(*p) : -1;
        };
        std::stable_sort(step_failures_.begin(), step_failures_.end(),
                         [&](const Failure& a, const Failure& b) { return rank(a) < rank(b); });
        Failure primary = step_failures_.front();
        for (std::size_t i = 1; i < step_failures_.size(); ++i) {
            primary.also.push_back(step_failures_[i].property + ": " + step_failures_[i].message);
        }
        result_.failure = std::move(primary);
        step_failures_.clear();
    }

    // Records a failure of `p` when `ok` is false. Returns ok.
    bool expect(Property p, bool ok, const std::string& message) {
        if (!ok && checking(p)) fail_as(property_id(p), message);
        return ok;
    }

    // The same, with the message made only for a failure: the checks that
    // run on every operation pass nearly always, and their texts cost more
    // than their comparisons.
    template <typename MakeMessage, typename = std::enable_if_t<std::is_invocable_r_v<std::string, MakeMessage>>>
    bool expect(Property p, bool ok, MakeMessage&& message) {
        if (!ok && checking(p)) fail_as(property_id(p), message());
        return ok;
    }

    // ---- shared checks ----

    // The view of handle `out` must be the expected one.
    void check_view(Property p, std::int64_t out, ObjectId expected, const std::string& what) {
        if (!checking(p)) return;
        if (engine_.handle_digest(out) == audit_.digest_of(expected)) return;
        const std::string difference = view_difference(engine_.view_handle(out), audit_.view_of(expected));
        if (difference.empty()) {
            fail_as(engine_error_id, "the adapter's handle_digest of " + handle_text(out) + " disagrees with its view_handle");
            return;
        }
        expect(p, false, what + " " + handle_text(out) + ": " + difference);
    }

    void check_owned(std::int64_t out, bool expected, const std::string& what) {
        if (!checking(Property::owned_marker)) return;
        const HandleReading& facts = handle_reading(out);
        expect(Property::owned_marker, facts.owned == expected, [&] {
            return what + " " + handle_text(out) + (expected ? " is not marked owned" : " is marked owned");
        });
    }

    void check_exists(std::int64_t out, bool expected, Property p, const std::string& what) {
        if (!checking(p)) return;
        const HandleReading& facts = handle_reading(out);
        expect(p, facts.exists == expected, [&] {
            return what + " " + handle_text(out) + (expected ? " holds no cache, expected one" : " holds a cache, expected none");
        });
    }

    // How many copies the engine logged since the last call (only
    // single-copy counts them: without it the log is not read).
    std::size_t copies_now() {
        return capabilities_.copy_log && properties_.has(Property::single_copy) ? engine_.take_copies().size() : 0;
    }

    void check_disjoint(Property p, std::int64_t out, const std::vector<std::int64_t>& sources, const std::string& what) {
        if (!checking(p) || !capabilities_.storage_identity) return;
        std::vector<std::uint64_t> own = handle_reading(out).storage;
        std::sort(own.begin(), own.end());
        for (std::int64_t source : sources) {
            for (std::uint64_t id : handle_reading(source).storage) {
                if (std::binary_search(own.begin(), own.end(), id)) {
                    fail_as(property_id(p), what + " " + handle_text(out) + " shares storage with its source " + handle_text(source));
                    return;
                }
            }
        }
    }

    // A live handle whose object is known, or nullopt (skip the operation).
    std::optional<ObjectId> known_source(std::int64_t handle, bool* holds_none) {
        *holds_none = false;
        if (handle == 0) {
            *holds_none = true;
            return std::nullopt;
        }
        if (!audit_.handle_created(handle)) return std::nullopt;
        const std::optional<ObjectId> object = audit_.handle(handle);
        if (!object) {
            *holds_none = true;
            return std::nullopt;
        }
        if (!audit_.object(*object).known) return std::nullopt;
        return object;
    }

    bool supported(Layout layout, const CacheSpec& spec) const {
        if (layout == Layout::legacy && !capabilities_.legacy_layout) return false;
        if (spec.dtype != Dtype::f32 && !capabilities_.half_dtypes) return false;
        for (const LayerSpec& layer : spec.layers) {
            const bool one_sided = (layer.slots & 0b11) == 0b01 || (layer.slots & 0b11) == 0b10;
            if (one_sided && !capabilities_.one_sided_layers) return false;
            if ((layer.slots & 0b1100) != 0 && !capabilities_.legacy_slot_names) return false;
            if (!layer.initialized && !capabilities_.uninitialized_layers) return false;
        }
        return true;
    }

    void count_layout(Layout layout) {
        (layout == Layout::modern ? result_.coverage.modern_caches : result_.coverage.legacy_caches) += 1;
    }

    // ---- the operations ----

    bool apply(const op::Add& op) {
        if (!supported(op.cache.layout, op.cache)) return false;
        CacheContent content = expand(op.cache);
        count_layout(content.layout);
        engine_.add(op.id, content);
        audit_.store(op.id, audit_.new_object(std::move(content), Origin::stored_item, false));
        return true;
    }

    bool apply(const op::AddHandle& op) {
        bool none = false;
        const std::optional<ObjectId> object = known_source(op.handle.value, &none);
        // Storing a conversion's view of another cache is outside the contract.
        if (!object || audit_.object(*object).alias_parent != 0) return false;
        engine_.add_handle(op.id, op.handle.value);
        audit_.store(op.id, *object);
        audit_.object(*object).origin = Origin::stored_item;
        check_owned(op.handle.value, false, "a cache stored back as " + in_quotes(op.id) + ",");
        return true;
    }

    bool apply(const op::Get& op) {
        engine_.get(op.id, op.out.value);
        const std::optional<ObjectId> entry = audit_.entry(op.id);
        audit_.bind(op.out.value, entry);
        check_exists(op.out.value, entry.has_value(), Property::store_contract, "get " + in_quotes(op.id) + ":");
        if (entry) check_owned(op.out.value, false, "the stored item handed out by get as");
        return true;
    }

    bool apply(const op::GetByIds& op) {
        const auto found = engine_.get_by_ids(op.ids);
        if (!checking(Property::store_contract)) return true;
        if (!expect(Property::store_contract, found.size() == op.ids.size(), [&] {
                return "get_by_ids returned " + std::to_string(found.size()) + " items for " +
                       std::to_string(op.ids.size()) + " ids";
            })) {
            return true;
        }
        for (std::size_t i = 0; i < op.ids.size(); ++i) {
            const bool exists = audit_.entry(op.ids[i]).has_value();
            const bool ok = exists ? found[i] == op.ids[i] : !found[i].has_value();
            if (!expect(Property::store_contract, ok, [&] {
                    return "get_by_ids position " + std::to_string(i) + " (" + in_quotes(op.ids[i]) + ") returned " +
                           (found[i] ? in_quotes(*found[i]) : std::string("none"));
                })) {
                break;
            }
        }
        return true;
    }

    bool apply(const op::GetAll&) {
        const auto ids = engine_.get_all_ids();
        // The message only on a failure: listing a thousand ids costs more
        // than comparing them.
        if (checking(Property::store_contract) && ids != audit_.order()) {
            expect(Property::store_contract, false,
                   "get_all returned " + id_list(ids) + ", expected " + id_list(audit_.order()) + " (insertion order)");
        }
        return true;
    }

    bool apply(const op::GetCache& op) {
        std::vector<ObjectId> parts;  // the entries that hold tokens
        for (const std::string& id : op.ids) {
            const std::optional<ObjectId> entry = audit_.entry(id);
            if (entry && content_holds_tokens(audit_.object(*entry).content)) parts.push_back(*entry);
        }
        copies_now();
        engine_.get_cache(op.ids, op.out.value);
        const std::size_t copies = copies_now();
        const std::string what = "get_cache " + std::to_string(op.ids.size()) + " ids ->";
        if (parts.empty()) {
            audit_.bind(op.out.value, std::nullopt);
            check_exists(op.out.value, false, Property::store_contract, what);
            return true;
        }
        const bool merged = parts.size() > 1;
        if (merged) ++result_.coverage.merges;
        ObjectId object = 0;
        if (merged) {
            std::vector<CacheContent> contents;
            for (const ObjectId part : parts) contents.push_back(audit_.object(part).content);
            object = audit_.new_object(expected_concat(contents), Origin::get_cache, true, 0, 2);
        } else {
            object = audit_.copy_object(parts.front(), Origin::get_cache, true, 2);
        }
        audit_.bind(op.out.value, object);
        const Property content_property = merged ? Property::merge_correct : Property::layout_roundtrip;
        check_exists(op.out.value, true, Property::store_contract, what);
        check_view(content_property, op.out.value, object, merged ? "the merged cache" : "the copy");
        expect(Property::single_copy, !capabilities_.copy_log || copies == 1, [&] {
            return what + " " + handle_text(op.out.value) + " made " + std::to_string(copies) + " copies, expected 1";
        });
        check_owned(op.out.value, true, merged ? "the merged cache" : "the copy");
        return true;
    }

    bool apply_generate(const HandleName& source, const Tokens& prompt, std::int64_t max, bool stream) {
        bool none = false;
        const std::optional<ObjectId> object = known_source(source.value, &none);
        if (!object && !none) return false;
        const CacheContent fresh = object ? audit_.object(*object).content : CacheContent{};
        if (!generation_compatible(fresh) || prompt.empty()) return false;
        const bool owned = object && audit_.object(*object).expect_owned;
        if (owned) ++result_.coverage.generations_owned;
        copies_now();
        const GenerateResult result = engine_.generate(none ? 0 : source.value, prompt, max, stream);
        const std::size_t copies = copies_now();
        if (owned) audit_.consumed(*object);
        const auto what = [&] {
            return std::string(stream ? "generate_stream" : "generate") + " from " +
                   (none ? std::string("no cache") : handle_text(source.value));
        };
        const std::size_t expected_copies = (object && !owned) ? 1 : 0;
        // The sets alive while the model runs: the input's copy chain, plus
        // the boundary's copy when it must make one.
        const std::int64_t sets_max = (object ? audit_.object(*object).chain_sets : 0) + 1 - (owned ? 1 : 0);
        if (capabilities_.copy_log) {
            expect(Property::single_copy, copies == expected_copies, [&] {
                return what() + " made " + std::to_string(copies) + " copies of the K/V, expected " +
                       std::to_string(expected_copies);
            });
            expect(Property::single_copy, result.peak_live_sets <= sets_max, [&] {
                return what() + " held " + std::to_string(result.peak_live_sets) + " K/V sets alive, at most " +
                       std::to_string(sets_max) + " allowed";
            });
        }
        if (checking(Property::generation_equivalent)) {
            const auto reference = engine_.generate_fresh(fresh, prompt, max);
            expect(Property::generation_equivalent, result.tokens == reference, [&] {
                return what() + " gave tokens " + tokens_text(result.tokens) + ", a fresh copy gives " + tokens_text(reference);
            });
        }
        return true;
    }

    bool apply(const op::Generate& op) { return apply_generate(op.source, op.prompt, op.max, false); }

    bool apply(const op::GenerateStream& op) {
        return apply_generate(op.source, op.prompt, op.max, true);
    }

    bool apply(const op::Delete& op) {
        engine_.remove(op.ids);
        for (const std::string& id : op.ids) {
            audit_.remove(id);
            drop_reading(id);
        }
        return true;
    }

    bool apply(const op::DeleteAll&) {
        engine_.remove_all();
        audit_.remove_all();
        drop_readings();
        return true;
    }

    // Dumps live in a temporary directory made on the first dump of a run,
    // and removed with the run.
    std::string slot_dir(std::int64_t slot) {
        if (work_dir_.empty()) {
            std::string pattern = (fs::temp_directory_path() / "kvcheck-run-XXXXXX").string();
            if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temporary directory");
            work_dir_ = pattern;
            own_work_dir_ = true;
        }
        return work_dir_ + "/slot-" + std::to_string(slot);
    }

    bool apply(const op::Dump& op) {
        engine_.dump(slot_dir(op.slot));
        audit_.slots()[op.slot] = DumpSlot{{audit_.snapshot()}, false, false};
        return true;
    }

    bool apply(const op::DumpCrash& op) {
        engine_.dump_interrupted(slot_dir(op.slot), op.bytes);
        DumpSlot& slot = audit_.slots()[op.slot];
        if (slot.candidates.empty()) slot.may_be_absent = true;
        slot.candidates.push_back(audit_.snapshot());
        return true;
    }

    bool apply(const op::Corrupt& op) {
        std::vector<fs::path> files;
        std::error_code error;
        for (const auto& entry : fs::directory_iterator(slot_dir(op.slot), error)) {
            if (entry.is_regular_file()) files.push_back(entry.path());
        }
        std::sort(files.begin(), files.end());
        std::uintmax_t total = 0;
        for (const fs::path& file : files) total += fs::file_size(file);
        if (total == 0) return false;
        std::uintmax_t at = static_cast<std::uintmax_t>(op.offset < 0 ? -op.offset : op.offset) % total;
        for (const fs::path& file : files) {
            const std::uintmax_t size = fs::file_size(file);
            if (at >= size) {
                at -= size;
                continue;
            }
            if (op.truncate != 0) {
                fs::resize_file(file, at);
            } else {
                std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
                stream.seekg(static_cast<std::streamoff>(at));
                const char byte = static_cast<char>(stream.get() ^ 0x5A);
                stream.seekp(static_cast<std::streamoff>(at));
                stream.put(byte);
            }
            break;
        }
        audit_.slots()[op.slot].corrupted = true;
        return true;
    }

    bool apply(const op::Load& op) {
        const Snapshot before = audit_.snapshot();
        const LoadResult loaded = engine_.load(slot_dir(op.slot));
        drop_readings();  // the store may hold other entries now
        begin_round();
        const auto found = audit_.slots().find(op.slot);
        const DumpSlot slot = found == audit_.slots().end() ? DumpSlot{} : found->second;
        if (!loaded.ok) {
            const bool may_fail = slot.candidates.empty() || slot.corrupted || slot.may_be_absent;
            expect(Property::dump_safe, may_fail,
                   "load of dump slot " + std::to_string(op.slot) + " failed although a complete dump was written: " + loaded.error);
            // Nothing in memory may be lost: the store must be as it was.
            check_store_content(Property::dump_safe, "after a failed load,");
            return true;
        }
        if (!expect(Property::dump_safe, !slot.candidates.empty(),
                    "load of dump slot " + std::to_string(op.slot) + " succeeded, but nothing was dumped there")) {
            return true;
        }
        // The loaded store must be one of the dumps the slot may hold.
        std::string difference;
        for (const Snapshot& candidate : slot.candidates) {
            audit_.restore(candidate);
            difference = store_difference(false);  // the order is store-contract's to check
            if (difference.empty()) {
                audit_.slots()[op.slot] = DumpSlot{{candidate}, slot.corrupted, false};
                return true;
            }
        }
        expect(Property::dump_safe, false, "load of dump slot " + std::to_string(op.slot) + " gave a store unlike any dump: " + difference);
        audit_.restore(before);
        return true;
    }

    bool apply(const op::Make& op) {
        if (!supported(op.cache.layout, op.cache)) return false;
        CacheContent content = expand(op.cache);
        count_layout(content.layout);
        engine_.make(content, op.out.value);
        const ObjectId object = audit_.new_object(std::move(content), Origin::make, false);
        audit_.bind(op.out.value, object);
        check_view(Property::layout_roundtrip, op.out.value, object, "the cache made as");
        return true;
    }

    bool apply(const op::Clone& op) {
        bool none = false;
        const std::optional<ObjectId> source = known_source(op.source.value, &none);
        if (!source) return false;  // cloning nothing is not an operation of the API
        engine_.clone(op.source.value, op.out.value);
        copies_now();
        const ObjectId object = audit_.copy_object(*source, Origin::clone, true, audit_.object(*source).chain_sets + 1);
        audit_.bind(op.out.value, object);
        check_view(Property::layout_roundtrip, op.out.value, object, "the clone");
        check_disjoint(Property::clone_independent, op.out.value, {op.source.value}, "the clone");
        check_owned(op.out.value, true, "the clone");
        return true;
    }

    bool apply(const op::Concat& op) {
        std::vector<CacheContent> parts;
        std::vector<std::int64_t> sources;
        std::int64_t deepest = 0;
        for (const HandleName& part : op.parts) {
            bool none = false;
            const std::optional<ObjectId> object = known_source(part.value, &none);
            if (!object && !none) return false;
            if (!object) continue;
            parts.push_back(audit_.object(*object).content);
            sources.push_back(part.value);
            deepest = std::max(deepest, audit_.object(*object).chain_sets);
        }
        if (parts.empty()) return false;
        std::vector<Handle> handles;
        for (const HandleName& part : op.parts) handles.push_back(part.value);
        engine_.concat(handles, op.out.value);
        copies_now();
        if (parts.size() > 1) ++result_.coverage.merges;
        const ObjectId object = audit_.new_object(expected_concat(parts), Origin::concat, true, 0, deepest + 1);
        audit_.bind(op.out.value, object);
        check_view(Property::merge_correct, op.out.value, object, "the merged cache");
        check_disjoint(Property::merge_correct, op.out.value, sources, "the merged cache");
        check_owned(op.out.value, true, "the merged cache");
        return true;
    }

    bool apply_conversion(std::int64_t source_handle, std::int64_t out, Layout from) {
        bool none = false;
        const std::optional<ObjectId> source = known_source(source_handle, &none);
        if (!source || audit_.object(*source).content.layout != from) return false;
        const CacheContent& content = audit_.object(*source).content;
        const bool to_legacy = from == Layout::modern;
        if (to_legacy) {
            engine_.to_legacy(source_handle, out);
        } else {
            engine_.from_legacy(source_handle, out);
        }
        // to_legacy may alias its source (transformers does); from_legacy copies.
        const ObjectId object = to_legacy
            ? audit_.new_object(expected_to_legacy(content), Origin::to_legacy, false, *source,
                                audit_.object(*source).chain_sets)
            : audit_.new_object(expected_from_legacy(content), Origin::from_legacy, false, 0,
                                audit_.object(*source).chain_sets + 1);
        audit_.bind(out, object);
        check_view(Property::layout_roundtrip, out, object, to_legacy ? "to_legacy gave" : "from_legacy gave");
        check_owned(out, false, to_legacy ? "to_legacy gave" : "from_legacy gave");
        return true;
    }

    bool apply(const op::ToLegacy& op) { return apply_conversion(op.source.value, op.out.value, Layout::modern); }
    bool apply(const op::FromLegacy& op) { return apply_conversion(op.source.value, op.out.value, Layout::legacy); }

    // ---- reading the stored entries ----
    //
    // Reading a stored entry (its view, which hashes its content; its owned
    // marker; its storage identities) is what a check costs. An engine with
    // entry_versions says which entries may have changed: what was read of an
    // entry is kept while its version stays, and read again when the version
    // moves. Without versions what was read is not trusted from one round of
    // reading to the next. A round starts whenever the engine may have
    // changed: at the checks before and after each step, and after a load.
    // The storage index (holders_) keeps each entry's identities from its
    // last reading: it is what traces a handle to the entries it reaches.

    struct EntryReading {
        std::uint64_t round = 0;  // the round its version was last asked in
        std::optional<std::uint64_t> version;
        std::optional<ObjectId> matched;  // its view equalled this object's
        std::optional<std::uint64_t> digest;
        std::optional<bool> owned;
        bool storage_read = false;  // storage holds its storage identities
        bool indexed = false;       // they are in holders_
        bool batched = false;       // digest, owned and storage came from read_entries
        std::vector<std::uint64_t> storage;
        const std::string* id = nullptr;  // the key of its node in readings_ (stable until erased)
    };

    void begin_round() {
        ++round_;
        listed_.reset();
    }

    // What is known of entry `id` in this round. `known_version`: its
    // version, already asked (entry_versions) when versions are trusted.
    EntryReading& reading(const std::string& id, const std::uint64_t* known_version = nullptr) {
        const auto [node, inserted] = readings_.try_emplace(id);
        EntryReading& entry = node->value;
        if (inserted) entry.id = &node->key;
        if (entry.round == round_) return entry;
        entry.round = round_;
        std::optional<std::uint64_t> version;
        if (trust_versions_) version = known_version ? *known_version : engine_.entry_version(id);
        if (version && version == entry.version) return entry;
        unindex(entry);
        entry = EntryReading{};
        entry.round = round_;
        entry.version = version;
        entry.id = &node->key;
        return entry;
    }

    // The readings of every entry the auditor holds, in insertion order,
    // with the objects they must match: what the checks of a full read will
    // ask of them is asked of the engine in two calls for all of them (the
    // versions, then the facts the versions do not vouch for), not a few
    // calls per entry. None when the engine answers for other entries than
    // it was asked about (an engine error).
    struct ReadEntry {
        EntryReading* reading;
        ObjectId expected;
    };

    std::vector<ReadEntry> read_all(bool content, bool marker, bool index) {
        const std::vector<std::string>& ids = audit_.order();
        std::vector<std::uint64_t> versions;
        if (trust_versions_) {
            versions = engine_.entry_versions(ids);
            if (!answered_all("entry_versions", versions.size(), ids.size())) return {};
        }
        std::vector<ReadEntry> entries;
        entries.reserve(ids.size());
        std::vector<std::string> unread;
        std::vector<EntryReading*> unread_entries;
        for (std::size_t i = 0; i < ids.size(); ++i) {
            EntryReading& entry = reading(ids[i], trust_versions_ ? &versions[i] : nullptr);
            const ObjectId expected = *audit_.entry(ids[i]);
            entries.push_back({&entry, expected});
            if ((content && !entry.digest && entry.matched != expected) || (marker && !entry.owned) ||
                (index && !entry.indexed && !entry.storage_read)) {
                unread.push_back(ids[i]);
                unread_entries.push_back(&entry);
            }
        }
        if (unread.empty()) return entries;
        const bool with_storage = capabilities_.storage_identity;
        std::vector<EntryFacts> facts = engine_.read_entries(unread, with_storage);
        if (!answered_all("read_entries", facts.size(), unread.size())) return {};
        for (std::size_t i = 0; i < unread.size(); ++i) {
            EntryReading& entry = *unread_entries[i];
            entry.batched = true;
            entry.digest = facts[i].digest;
            entry.owned = facts[i].owned;
            if (!with_storage) continue;
            entry.storage = std::move(facts[i].storage);
            entry.storage_read = true;
        }
        return entries;
    }

    bool answered_all(const char* method, std::size_t answers, std::size_t ids) {
        if (answers == ids) return true;
        fail_as(engine_error_id, std::string("the adapter's ") + method + " returned " + std::to_string(answers) +
                                     " results for " + std::to_string(ids) + " ids");
        return false;
    }

    // A fact read_entries gave that a check is about to report is asked
    // again of its one-entry method: an adapter whose two disagree has an
    // engine error, not a violation. True when they agree.
    bool batch_agrees(const EntryReading& entry, const char* method, bool agree) {
        if (!entry.batched || agree) return true;
        fail_as(engine_error_id, std::string("the adapter's read_entries and ") + method + " disagree on entry " + in_quotes(*entry.id));
        return false;
    }

    void unindex(EntryReading& entry) {
        if (!entry.indexed) return;
        for (const std::uint64_t identity : entry.storage) holders_.remove(identity, entry.id);
        entry.indexed = false;
    }

    void drop_reading(const std::string& id) {
        EntryReading* found = readings_.find(id);
        if (found == nullptr) return;
        unindex(*found);
        readings_.erase(id);
    }

    void drop_readings() {
        readings_.clear();
        holders_.clear();
    }

    // Every reading made stale, kept for reuse: the next reading of each
    // entry reads it anew (and, without versions, all of it).
    void forget_readings() {
        holders_.clear();
        readings_.for_each([](const std::string&, EntryReading& entry) {
            entry.indexed = false;
            entry.round = 0;
            entry.version.reset();
        });
    }

    // The ids the engine lists, asked once a round.
    const std::vector<std::string>& listed() {
        if (!listed_) listed_ = engine_.stored_ids();
        return *listed_;
    }

    // The helpers below take the entry's reading of this round
    // (reading(id)), asked once per entry and check.

    // The difference of entry `id` from the object the auditor expects.
    std::string entry_difference(const std::string& id, EntryReading& entry, ObjectId expected) {
        if (entry.matched == expected) return {};
        if (!entry.digest) entry.digest = engine_.entry_digest(id);
        if (*entry.digest == audit_.digest_of(expected)) {
            entry.matched = expected;
            return {};
        }
        if (!batch_agrees(entry, "entry_digest", engine_.entry_digest(id) == *entry.digest)) return {};
        // The view only to name the difference.
        const std::string difference = view_difference(engine_.view_entry(id), audit_.view_of(expected));
        if (difference.empty()) {
            fail_as(engine_error_id, "the adapter's entry_digest of entry " + in_quotes(id) + " disagrees with its view_entry");
        }
        return difference;
    }

    bool entry_owned(const std::string& id, EntryReading& entry) {
        if (!entry.owned) entry.owned = engine_.entry_owned(id);
        if (*entry.owned && !batch_agrees(entry, "entry_owned", engine_.entry_owned(id))) entry.owned = false;
        return *entry.owned;
    }

    // Reads the entry's storage identities into the index; with `only` (a
    // sorted list), just those among them (see read_every_entry).
    void index_storage(EntryReading& entry, const std::vector<std::uint64_t>* only = nullptr) {
        if (entry.indexed) return;
        if (!entry.storage_read) {
            entry.storage = engine_.storage_of_entry(*entry.id);
            entry.storage_read = true;
        }
        for (const std::uint64_t identity : entry.storage) {
            if (only == nullptr || std::binary_search(only->begin(), only->end(), identity)) {
                holders_.add(identity, entry.id);
            }
        }
        entry.indexed = true;
    }

    // The stored entries that hold one of `identities`, in no set order.
    std::vector<std::string> holders_of(const std::vector<std::uint64_t>& identities) const {
        std::vector<std::string> entries;
        for (const std::uint64_t identity : identities) {
            holders_.for_each_holder(identity, [&entries](const std::string& id) { add_unique(entries, id); });
        }
        return entries;
    }

    // Does the cache of `object`, made of `identities`, share one with a
    // stored entry it may not alias? The entry named is the first such, in
    // insertion order.
    bool shared_with_entry(ObjectId object, const std::vector<std::uint64_t>& identities, std::string* entry) {
        std::vector<std::string> offending;
        for (const std::string& id : holders_of(identities)) {
            const std::optional<ObjectId> stored = audit_.entry(id);
            if (stored && !audit_.may_alias(object, *stored)) offending.push_back(id);
        }
        if (offending.empty()) return false;
        for (const std::string& id : audit_.order()) {
            if (std::find(offending.begin(), offending.end(), id) != offending.end()) {
                *entry = id;
                return true;
            }
        }
        *entry = offending.front();
        return true;
    }

    // ---- reading the handles ----
    //
    // What a handle is made of and whether it is marked owned, kept from the
    // step that last named it (or the last full read): a handle changes only
    // through the operations that name it. The readings of the handles a
    // step names are dropped before it runs; its own checks and those after
    // it then share one reading of each.

    struct HandleReading {
        bool exists = false;
        bool owned = false;  // the marker as the engine reports it
        std::vector<std::uint64_t> storage;
    };

    const HandleReading& handle_reading(std::int64_t handle) {
        const auto found = handle_readings_.find(handle);
        if (found != handle_readings_.end()) return found->second;
        HandleReading reading;
        const HandleFacts facts = engine_.handle_facts(handle);
        reading.exists = facts.exists;
        reading.owned = facts.owned;
        if (facts.exists && capabilities_.storage_identity) reading.storage = engine_.storage_of_handle(handle);
        return handle_readings_.emplace(handle, std::move(reading)).first->second;
    }

    // The stored entries that share storage with one of `handles`, as the
    // index knows them.
    std::vector<std::string> entries_reached(const std::vector<std::int64_t>& handles) {
        std::vector<std::string> entries;
        if (!capabilities_.storage_identity) return entries;
        for (const std::int64_t handle : handles) {
            if (!audit_.handle(handle)) continue;
            for (const std::string& id : holders_of(handle_reading(handle).storage)) add_unique(entries, id);
        }
        return entries;
    }

    // Every entry and handle read again, versions or not, after the last
    // step: an engine whose versions miss a change, or whose change no
    // handle reached, is caught all the same.
    void recheck_everything(std::size_t last_step) {
        trust_versions_ = false;
        rechecking_ = true;
        step_ = last_step;
        forget_readings();
        try {
            check_everything("");
        } catch (const std::exception& error) {
            fail_as(engine_error_id, std::string("the engine threw: ") + error.what());
        }
        settle_step();
    }

    // ---- checks after every step ----

    static std::string id_list(const std::vector<std::string>& ids) {
        std::string text = "[";
        for (std::size_t i = 0; i < ids.size(); ++i) text += (i ? " " : "") + ids[i];
        return text + "]";
    }

    // The first difference between the engine's store and the expected one,
    // as text: the ids held (in insertion order when `ordered`), then each
    // entry's content. Empty when they agree.
    std::string store_difference(bool ordered) {
        const std::string ids = ids_difference(ordered);
        if (!ids.empty()) return ids;
        for (const std::string& id : audit_.order()) {
            const std::string difference = entry_difference(id, reading(id), *audit_.entry(id));
            if (!difference.empty()) return "entry " + in_quotes(id) + " " + difference;
        }
        return {};
    }

    // The difference between the ids the store holds and the expected ones
    // (in insertion order when `ordered`), as text; empty when they agree.
    std::string ids_difference(bool ordered) {
        const std::vector<std::string>& ids = listed();
        const std::vector<std::string>& expected = audit_.order();
        if (ids == expected) return {};
        auto ids_sorted = ids;
        auto expected_sorted = expected;
        if (!ordered) {
            std::sort(ids_sorted.begin(), ids_sorted.end());
            std::sort(expected_sorted.begin(), expected_sorted.end());
        }
        if (ids_sorted == expected_sorted) return {};
        return "the store holds ids " + id_list(ids_sorted) + ", expected " + id_list(expected_sorted);
    }

    void check_store_content(Property p, const std::string& when) {
        if (!checking(p)) return;
        const std::string difference = store_difference(false);
        expect(p, difference.empty(), when + (when.empty() ? "" : " ") + difference);
    }

    void check_listing() {
        listing_due_ = false;
        // Messages are built only for a failure: listing a thousand ids
        // costs more than comparing them.
        if (checking(Property::store_contract) && listed() != audit_.order()) {
            expect(Property::store_contract, false,
                   "the store lists " + id_list(listed()) + ", expected " + id_list(audit_.order()) + " (insertion order)");
        }
    }

    // Entries `ids` (those the auditor holds): content, owned marker and
    // storage index. Returns the entries indexed anew (new, or whose version
    // moved): their storage identities may have changed.
    std::vector<std::string> check_entries(const std::vector<std::string>& ids) {
        std::vector<std::string> renewed;
        for (const std::string& id : ids) {
            const std::optional<ObjectId> expected = audit_.entry(id);
            if (!expected) continue;
            EntryReading& entry = reading(id);
            // Messages are built only for a failure: this runs every step.
            if (checking(Property::stored_immutable)) {
                const std::string difference = entry_difference(id, entry, *expected);
                if (!difference.empty()) expect(Property::stored_immutable, false, "entry " + in_quotes(id) + " " + difference);
            }
            if (checking(Property::owned_marker) && entry_owned(id, entry)) {
                expect(Property::owned_marker, false, "stored entry " + in_quotes(id) + " is marked owned");
            }
            if (!capabilities_.storage_identity) continue;
            // Not indexed in this round's reading: new, or its version moved.
            const bool renewing = !entry.indexed;
            index_storage(entry);
            if (renewing) renewed.push_back(id);
        }
        return renewed;
    }

    // Every entry, in one pass (one reading each): its content, its owned
    // marker and its storage identities; then every handle's ownership.
    // Entries are never owned; owned handles and get_cache results share
    // nothing with any entry they are not derived from. Reported as
    // separate passes would: the ids the store holds, or else the first
    // entry whose content differs; the first entry marked owned; then the
    // handles (stored-immutable sorts before owned-marker).
    void read_every_entry() {
        bool content = checking(Property::stored_immutable);
        bool marker = checking(Property::owned_marker);
        const bool index = capabilities_.storage_identity && (content || marker);
        if (content) {
            const std::string ids = ids_difference(false);  // the order is store-contract's to check
            if (!ids.empty()) {
                expect(Property::stored_immutable, false, ids);
                content = false;
            }
        }
        // The end-of-run read indexes, of every entry's storage identities,
        // only those a live handle holds: the handles' checks need no more,
        // and no step runs after it. (Indexing all of them was a third of
        // that read at 1,000 entries.) unindex skips the identities an entry
        // so indexed did not index.
        std::vector<std::uint64_t> held;
        if (index && rechecking_) {
            for (const auto& [handle, object] : audit_.handles()) {
                if (!object) continue;
                const std::vector<std::uint64_t>& storage = handle_reading(handle).storage;
                held.insert(held.end(), storage.begin(), storage.end());
            }
            std::sort(held.begin(), held.end());
        }
        for (const ReadEntry& read : read_all(content, marker, index)) {
            if (!content && !marker && !index) break;
            EntryReading& entry = *read.reading;
            const std::string& id = *entry.id;
            // Messages are built only for a failure.
            if (content) {
                const std::string difference = entry_difference(id, entry, read.expected);
                if (!difference.empty()) {
                    expect(Property::stored_immutable, false, "entry " + in_quotes(id) + " " + difference);
                    content = false;
                }
            }
            if (marker && entry_owned(id, entry)) {
                expect(Property::owned_marker, false, "stored entry " + in_quotes(id) + " is marked owned");
                marker = false;
            }
            if (index) index_storage(entry, rechecking_ ? &held : nullptr);
        }
        if (!index) return;
        for (const auto& [handle, object] : audit_.handles()) {
            if (object && check_handle_ownership(handle)) return;
        }
    }

    // The same for the handles a step named, and for any handle that shares
    // storage with an entry whose storage changed at this step.
    void check_ownership_of(const std::vector<std::int64_t>& handles, const std::vector<std::string>& renewed) {
        if (!capabilities_.storage_identity) return;
        if (!checking(Property::stored_immutable) && !checking(Property::owned_marker)) return;
        std::vector<std::int64_t> to_check;
        for (const std::int64_t handle : handles) {
            if (audit_.handle(handle)) to_check.push_back(handle);
        }
        if (!renewed.empty()) {
            std::vector<std::uint64_t> identities;
            for (const std::string& id : renewed) {
                const EntryReading& entry = reading(id);
                identities.insert(identities.end(), entry.storage.begin(), entry.storage.end());
            }
            std::sort(identities.begin(), identities.end());
            for (const auto& [handle, object] : audit_.handles()) {
                if (!object) continue;
                for (const std::uint64_t identity : handle_reading(handle).storage) {
                    if (std::binary_search(identities.begin(), identities.end(), identity)) {
                        add_unique(to_check, handle);
                        break;
                    }
                }
            }
        }
        std::sort(to_check.begin(), to_check.end());
        for (const std::int64_t handle : to_check) {
            if (check_handle_ownership(handle)) return;
        }
    }

    // Records the violation of one handle, if any; true when one was found.
    bool check_handle_ownership(std::int64_t handle) {
        const std::optional<ObjectId> object = audit_.handle(handle);
        if (!object) return false;
        const bool immutable = checking(Property::stored_immutable) && capabilities_.storage_identity;
        const bool marker = checking(Property::owned_marker);
        const bool handed_out = audit_.object(*object).origin == Origin::get_cache;
        const HandleReading& facts = handle_reading(handle);
        const bool owned = marker && facts.exists && facts.owned;
        if (!(immutable && handed_out) && !owned) return false;
        std::string entry;
        if (!shared_with_entry(*object, facts.storage, &entry)) return false;
        const EntryReading* found = readings_.find(entry);
        if (found != nullptr && found->batched) {
            std::vector<std::uint64_t> batch = found->storage;
            std::vector<std::uint64_t> one = engine_.storage_of_entry(entry);
            std::sort(batch.begin(), batch.end());
            std::sort(one.begin(), one.end());
            if (!batch_agrees(*found, "storage_of_entry", batch == one)) return true;
        }
        if (immutable && handed_out) {
            fail_as(property_id(Property::stored_immutable),
                    "the cache get_cache handed out as " + handle_text(handle) + " shares storage with stored entry " + in_quotes(entry));
        } else {
            fail_as(property_id(Property::owned_marker),
                    handle_text(handle) + " is marked owned but shares storage with stored entry " + in_quotes(entry));
        }
        return true;
    }

    // ---- coverage ----

    void record_state(const Op& op) {
        Coverage& coverage = result_.coverage;
        const auto size = static_cast<std::uint32_t>(audit_.order().size());
        coverage.store_size_max = std::max(coverage.store_size_max, size);
        if (!options_.record_states) return;
        const std::uint32_t bucket = size == 0 ? 0 : size == 1 ? 1 : size <= 3 ? 2 : 3;
        const std::int64_t out = created_handle(op);
        std::uint32_t layout = 2;  // no cache made by this step
        std::uint32_t owned = 0;
        if (out != 0) {
            if (const auto object = audit_.handle(out)) {
                layout = audit_.object(*object).content.layout == Layout::modern ? 0 : 1;
                owned = audit_.object(*object).expect_owned ? 1 : 0;
            }
        }
        const auto state = static_cast<std::uint16_t>(((op.index() * 3 + layout) * 4 + bucket) * 2 + owned);
        coverage.states.push_back(state);
    }

    Engine& engine_;
    const RunOptions& options_;
    Capabilities capabilities_;
    PropertySet properties_ = PropertySet::all();
    std::string work_dir_;
    bool own_work_dir_ = false;
    Auditor audit_;
    bool trust_versions_ = false;  // the engine reports entry versions, and they are used
    bool rechecking_ = false;      // the final read, without versions, is running
    bool every_step_ = false;      // a full read after every step (RunOptions, or no storage identities)
    // A property checked on the store's entries and listing: without one, no
    // step reads them (and no run ends reading them all).
    bool reads_store_ = false;
    bool listing_due_ = false;     // the store's membership changed since its listing was compared
    std::size_t steps_since_full_read_ = 0;
    std::string note_;             // appended to the failures found by the read running now
    std::uint64_t round_ = 0;
    std::optional<std::vector<std::string>> listed_;
    IdMap<EntryReading> readings_;
    StorageIndex holders_;  // storage identity -> entries holding it
    std::unordered_map<std::int64_t, HandleReading> handle_readings_;
    std::size_t step_ = 0;
    std::vector<Failure> step_failures_;
    RunResult result_;
};

}  // namespace

const char* property_id(Property property) { return property_table[static_cast<std::size_t>(property)].id; }

const char* property_summary(Property property) { return property_table[static_cast<std::size_t>(property)].summary; }

std::optional<Property> parse_property(const std::string& id) {
    for (const PropertyInfo& info : property_table) {
        if (id == info.id) return info.property;
    }
    return std::nullopt;
}

const std::array<Property, property_count>& all_properties() {
    static const std::array<Property, property_count> properties = [] {
        std::array<Property, property_count> list{};
        for (std::size_t i = 0; i < property_count; ++i) list[i] = property_table[i].property;
        return list;
    }();
    return properties;
}

PropertySet checkable(const Capabilities& capabilities) {
    PropertySet set = PropertySet::all();
    if (!capabilities.copy_log) set.remove(Property::single_copy);
    if (!capabilities.storage_identity) set.remove(Property::clone_independent);
    if (!capabilities.dump) set.remove(Property::dump_safe);
    return set;
}

RunResult execute(const Trace& trace, Engine& engine, const RunOptions& options) {
    Run run(engine, options);
    return run.run(trace);
}

std::string format_failure(const Failure& failure, const Trace& trace, const std::string& reproduce) {
    std::ostringstream out;
    const std::string op = failure.step < trace.size() ? op_name(trace[failure.step]) : "?";
    out << "ERROR: " << failure.property << ": " << failure.message << " at step " << failure.step + 1 << " (" << op << ")\n";
    for (const std::string& other : failure.also) out << "also: " << other << "\n";
    for (std::size_t i = 0; i < trace.size(); ++i) {
        out << format_op(trace[i]) << (i == failure.step ? "  # <- " + failure.property : std::string()) << "\n";
    }
    out << "SUMMARY: kvcheck: " << failure.property << " violated after " << failure.step + 1 << " operation"
        << (failure.step == 0 ? "" : "s") << "\n";
    out << "reproduce: " << reproduce << "\n";
    return out.str();
}

}  // namespace kvcheck
