// stored-immutable: every stored entry stays as it was stored (content,
// shapes, dtypes, layer count, initialized flags, layout; its metadata,
// read at full reads), whatever runs,
// and no cache get_cache hands out shares storage with a stored entry.
//
// Checked: each entry the run reads (the entries a step names or reaches
// through a handle's storage, and all of them at full reads) against the
// auditor's expected content, and, when the engine reports storage
// identities, against the other entries read so far (two entries holding
// different caches share nothing); at full reads, the set of ids the store
// holds (its order is store-contract's); each get_cache result (the empty
// one of ids that hold no tokens too) against the stored entries' storage
// identities.
// Not checked here: the owned marker (owned-marker), the order of ids
// (store-contract), what a load restores (dump-safe).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class StoredImmutable final : public Checker {
  public:
    StoredImmutable() : Checker(Property::stored_immutable) {}

    Reads reads() const override {
        Reads reads;
        reads.entry_content = true;
        reads.handle_aliasing = true;
        return reads;
    }

    // A load that gave a store unlike any dump (dump-safe's to report)
    // leaves the store unlike what is expected: reading it at that step
    // would only say so again.
    void loaded(const Loaded& load, Probe& probe) override {
        if (load.result.ok && !load.expected.candidates.empty() && !load.matched) unlike_load_step_ = probe.step();
    }

    void entry(const EntryFact& entry, Probe& probe) override {
        if (!checking(probe) || unlike_load_step_ == probe.step()) return;
        const std::string difference = probe.entry_difference(entry);
        if (!difference.empty()) {
            fail(probe, "entry " + in_quotes(entry.id) + " " + difference);
            return;
        }
        if (entry.full_read && probe.capabilities().metadata) {
            const Metadata found = probe.engine().entry_metadata(entry.id);
            const Metadata& expected = probe.auditor().metadata(entry.id);
            if (found != expected) {
                fail(probe, "entry " + in_quotes(entry.id) + " has metadata " + metadata_text(found) + ", expected " +
                                metadata_text(expected));
                return;
            }
        }
        // Two stored entries are two caches: a write through one must not
        // reach the other.
        if (const std::optional<std::string> other = probe.entry_sharing(entry)) {
            fail(probe, "stored entries " + in_quotes(*other) + " and " + in_quotes(entry.id) + " share one storage");
        }
    }

    void listing(bool full_read, Probe& probe) override {
        if (!full_read || !checking(probe) || unlike_load_step_ == probe.step()) return;
        const std::string difference = ids_difference(probe.listed(), probe.auditor().order(), false);
        if (!difference.empty()) fail(probe, difference);
    }

    void handle(const HandleFact& handle, Probe& probe) override {
        if (!checking(probe) || !probe.capabilities().storage_identity) return;
        if (probe.auditor().object(handle.object).origin != Origin::get_cache) return;
        const std::optional<std::string> entry = probe.aliased_entry(handle);
        if (!entry) return;
        fail(probe, "the cache get_cache handed out as " + handle_text(handle.handle) +
                        " shares one storage with stored entry " + in_quotes(*entry));
    }

  private:
    std::optional<std::size_t> unlike_load_step_;
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::stored_immutable>() {
    return std::make_unique<StoredImmutable>();
}

}  // namespace kvcheck::checkers
