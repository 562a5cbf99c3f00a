// The reference adapter: kvcheck's Engine interface over the reference
// implementation in src/ (kv::Store, the generation boundary) driving the
// attention decoder of models/.
//
// It owns one store, one decoder, one Copier (whose log it reports) and the
// handle table: a handle holds a cache pointer (const: what the store hands
// out is read-only) until released. The mutants (adapters/mutants/) derive
// from it and override one seam each, or give it a Copier of their own.
// What a cache looks like to kvcheck is reference/cache_views.h; how entry
// versions and batch reads are made fast, reference/entry_versions.h.
//
//   kvcheck::adapters::ReferenceEngine engine;
//   engine.add("a", kvcheck::expand(spec));
//   engine.get_cache({"a"}, 1);   // handle 1: an owned copy
#pragma once

#include "kv/generation.h"
#include "kv/leases.h"
#include "kv/models.h"
#include "kv/store.h"
#include "kvcheck/engine.h"
#include "kvcheck/yield.h"
#include "reference/entry_versions.h"

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace kvcheck::adapters {

// The window of the bundled reference-window (adapters/bundled.cpp) and its
// mutant M40: small enough that most traces' caches pass it.
inline constexpr std::int64_t reference_window = 4;

class ReferenceEngine : public Engine {
  public:
    explicit ReferenceEngine(std::shared_ptr<kv::Copier> copier = std::make_shared<kv::Copier>());
    ~ReferenceEngine() override;

    std::string name() const override { return name_; }
    // The name a bundled adapter gives it (adapters/bundled.cpp).
    void rename(std::string name) { name_ = std::move(name); }
    Capabilities capabilities() const override;
    // Makes it an engine without an owned marker, as real stores are: it
    // reports none (entry_owned and handle_facts' owned say false, its
    // capabilities owned_marker false), and kvcheck derives ownership from
    // its storage identities (docs/semantics.md#ownership). Its behaviour
    // is unchanged: the boundary still reads its own marker.
    void drop_owned_marker() { owned_marker_ = false; }
    // Makes it claim no returned caches (Capabilities::returned_caches):
    // kvcheck then never draws turn or extract for it.
    void drop_returned_caches() { returned_caches_ = false; }
    // Bounds its store at `items` entries, evicting the least recently used
    // (kv::Store::set_capacity), and declares so (Capabilities::policy:
    // lru, listed in insertion order). 0: no bound, the default. With
    // Eviction::lrs a hand-out is no use (the store is not touched by get,
    // get_by_ids, get_cache): it evicts the least recently stored, and
    // declares lrs.
    void set_capacity(std::size_t items, Eviction eviction = Eviction::lru);
    // Gives it read leases that live `ttl_ms` of kvcheck's virtual clock
    // (kv::Leases; docs/semantics.md#leases), and declares them
    // (Capabilities::lease_ttl_ms): while an entry holds a live lease, add,
    // add_handle, extract, remove, remove_all and load refuse whole (throw).
    // A bounded store (set_capacity) never evicts an entry under a live
    // lease: it evicts the least recently used one not leased, and a full
    // store whose every entry is leased refuses an add of a new id.
    void enable_leases(std::int64_t ttl_ms);
    // The bundled reference-leases and its mutants: leases of
    // bundled_lease_ttl_ms in a store of bundled_lease_capacity_items (lru).
    void enable_bundled_leases();
    // The TTL of the bundled reference-leases and its mutants: short, so
    // that traces of a few ticks reach every expiry.
    static constexpr std::int64_t bundled_lease_ttl_ms = 4;
    // Their capacity: small, so that an add meets a full store whose
    // entries are leased (docs/semantics.md#leases).
    static constexpr std::size_t bundled_lease_capacity_items = 3;
    // docs/semantics.md#store-windows: a model attending over its last
    // `window` tokens (DecoderConfig::window), and every cache the engine
    // stores, hands out or makes cut to them (kv::keep_window); declared
    // (Capabilities::window); no dump (a dump loses Cache::dropped, the
    // positions a cut moved on).
    void set_window(std::int64_t window);
    std::int64_t window() const { return window_; }
    // docs/semantics.md#content-tolerance: a quantized store, as the bundled
    // reference-quantized. Every cache it builds from kvcheck's content
    // (add, make, generate_fresh, fed_view) holds each value rounded to
    // `mantissa_bits` mantissa bits (quantized_mantissa_bits: the bfloat16
    // grid), and it declares the content tolerance that rounding implies
    // (quantized_tolerance). Its views carry their values.
    void quantize(int mantissa_bits = quantized_mantissa_bits);
    static constexpr int quantized_mantissa_bits = 7;
    // Half a unit in the last place of 7 mantissa bits is at most 2^-8 of a
    // value; a float16 slot rounds the rounded value once more, by at most
    // half its smallest subnormal step (2^-25) below 2^-14: 2^-24 absolute
    // covers it.
    static ContentTolerance quantized_tolerance() { return {1.0 / (1 << 24), 1.0 / (1 << 8)}; }

    void add(const std::string& id, const CacheContent& content, const Metadata& metadata) override;
    void add_handle(const std::string& id, Handle handle) override;
    void get(const std::string& id, Handle out) override;
    std::vector<std::optional<std::string>> get_by_ids(const std::vector<std::string>& ids) override;
    std::vector<std::string> get_all_ids() override;
    void get_cache(const std::vector<std::string>& ids, Handle out) override;
    void remove(const std::vector<std::string>& ids) override;
    void remove_all() override;
    void dump(const std::string& dir) override;
    void dump_interrupted(const std::string& dir, std::int64_t bytes_budget) override;
    LoadResult load(const std::string& dir) override;

    GenerateResult generate(Handle handle, const std::vector<std::int64_t>& prompt,
                            std::int64_t max_new_tokens, bool stream) override;
    std::vector<std::int64_t> generate_fresh(const CacheContent& content,
                                             const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens) override;

    GenerateResult generate_returning(Handle handle, const std::vector<std::int64_t>& prompt,
                                      std::int64_t max_new_tokens, Handle out) override;
    void extract(const std::string& id, const std::vector<std::int64_t>& prompt) override;
    CacheView fed_view(const CacheContent& content, const std::vector<std::int64_t>& tokens) override;

    void make(const CacheContent& content, Handle out) override;
    void clone(Handle source, Handle out) override;
    void concat(const std::vector<Handle>& parts, Handle out) override;
    void to_legacy(Handle source, Handle out) override;
    void from_legacy(Handle source, Handle out) override;
    void release(Handle handle) override;
    void trim(Handle handle, std::int64_t keep) override;
    void advance_clock(std::int64_t ms) override;
    void lease(const std::string& id) override;
    void unlease(const std::string& id) override;
    void batch_row(const std::vector<Handle>& rows, std::int64_t repeat, const std::vector<std::int64_t>& reorder,
                   std::int64_t select, Handle out) override;

    std::vector<std::string> stored_ids() override;
    CacheView view_entry(const std::string& id) override;
    std::uint64_t entry_digest(const std::string& id) override;
    bool entry_owned(const std::string& id) override;
    CacheView view_handle(Handle handle) override;
    std::uint64_t handle_digest(Handle handle) override;
    HandleFacts handle_facts(Handle handle) override;
    Metadata entry_metadata(const std::string& id) override;
    Metadata handle_metadata(Handle handle) override;
    std::vector<std::uint64_t> storage_of_entry(const std::string& id) override;
    std::vector<std::uint64_t> storage_of_handle(Handle handle) override;
    std::vector<CopyRecord> take_copies() override;
    std::uint64_t entry_version(const std::string& id) override;
    std::vector<std::uint64_t> entry_versions(const std::vector<std::string>& ids) override;
    std::vector<EntryFacts> read_entries(const std::vector<std::string>& ids, bool with_storage) override;

  protected:
    // The seams the mutants override; the reference behaviour is here.
    virtual kv::CachePtr store_get_cache(const std::vector<std::string>& ids);
    virtual void store_add(const std::string& id, const kv::CachePtr& cache, const Metadata& metadata);
    virtual void store_dump(const std::string& dir, kv::FileSystem& fs);
    virtual kv::CachePtr convert_from_legacy(const kv::Cache& cache);
    // Whether `id` holds a live lease, asked before a call removes it
    // (remove, remove_all, load), replaces it (add, add_handle, extract),
    // gives a lease on it back (unlease), or before the store evicts it.
    enum class LeaseUse : std::uint8_t { remove, replace, give_back, evict };
    virtual bool lease_live(const std::string& id, LeaseUse use) const;
    // The file system dumps and loads go through.
    virtual kv::FileSystem& file_system() { return kv::posix_file_system(); }
    virtual std::vector<std::int64_t> run_generation(const kv::ConstCachePtr& past,
                                                     const std::vector<std::int64_t>& prompt,
                                                     std::int64_t max_new_tokens, bool stream,
                                                     kv::GenerationStats& stats);

    // The cache the model writes into for a generation from `past` (the
    // boundary's), and the model's run on it; generate_returning hands the
    // cache out, extract stores it.
    virtual kv::CachePtr working_cache(const kv::ConstCachePtr& past);
    virtual void run_on(kv::Cache& working, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                        std::vector<std::int64_t>& tokens, kv::GenerationStats& stats);
    // The memory extract stores: the model's prefill over `prompt`.
    virtual kv::CachePtr extracted(const std::vector<std::int64_t>& prompt);
    // With a window, `cache` cut to it (kv::keep_window); `cache` itself.
    kv::CachePtr windowed(kv::CachePtr cache) const;
    // Binds a handle (for generate_returning's result).
    void bind(Handle h, kv::ConstCachePtr cache) { handles_[h] = std::move(cache); }

    kv::ConstCachePtr handle(Handle h) const;  // null for unknown or empty handles
    kv::ConstCachePtr stored(const std::string& id) const;  // throws for a missing id
    // The same, without taking a reference: for the observations, which
    // read the cache and let go before the store can change.
    const kv::Cache& stored_cache(const std::string& id) const;

    // The lock every engine call holds (kvcheck::lock_yielding): the store,
    // the handles and the model are shared by all callers. A thread mutant
    // (adapters/mutants/thread_mutants.cpp) takes none.
    std::unique_lock<std::recursive_mutex> hold() const;
    bool locked_ = true;
    // A thread mutant's planted window (adapters/mutants/lane_mutants.cpp):
    // inside a call that holds the lock once, lets it go, yields at `point`
    // (other clients' calls run whole there), and takes it back. The rest of
    // the call stays locked: the window is the mutant's only race.
    void unlocked_window(const char* point) const;

    std::shared_ptr<kv::Copier> copier_;
    kv::Store store_;
    kv::Leases leases_;  // ttl 0: no leases (enable_leases)
    kv::models::Decoder model_;

  private:
    void handed_out(const std::string& id);  // a use of `id` under lru eviction
    // Throws, naming the lease, when one of `ids` holds a live lease.
    void refuse_leased(const std::vector<std::string>& ids, LeaseUse use, const char* what) const;
    std::string name_ = "reference";
    bool owned_marker_ = true;  // reported (drop_owned_marker)
    bool returned_caches_ = true;  // claimed (drop_returned_caches)
    Eviction eviction_ = Eviction::lru;  // declared with a capacity (set_capacity)
    std::int64_t window_ = 0;  // set_window; 0: none
    int mantissa_bits_ = 23;   // quantize; 23: exact
    kv::CachePtr built(const CacheContent& content) const;  // materialize, quantized as declared
    bool quantized() const { return mantissa_bits_ < 23; }
    std::map<Handle, kv::ConstCachePtr> handles_;
    std::map<Handle, Metadata> handle_metadata_;  // of the items get handed out
    std::size_t copies_reported_ = 0;
    // The item stored_cache found last, held: while its `stored` flag stays
    // set the store maps its id to it. The checks ask for one entry's
    // version, view, marker and storage in turn.
    mutable kv::ItemPtr found_item_;
    EntryVersions versions_;
    mutable std::recursive_mutex mutex_;

    // Runs `take` on each of `ids` (each_warmed), with found_item_ set to
    // the entry's item before `take` reads it with the one-entry methods (a
    // subclass's overrides included).
    void each_warmed(const std::vector<std::string>& ids, Warm what, const std::function<void(const std::string&)>& take);
};

}  // namespace kvcheck::adapters
