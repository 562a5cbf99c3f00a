// The reference adapter: kvcheck's Engine interface over the reference
// implementation in src/ (kv::Store, the generation boundary) driving the
// attention decoder of models/.
//
// It owns one store, one decoder, one Copier (whose log it reports) and the
// handle table: a handle holds a cache pointer (const: what the store hands
// out is read-only) until released. The mutants (adapters/mutants.cpp)
// derive from it and override one seam each.
//
//   kvcheck::adapters::ReferenceEngine engine;
//   engine.add("a", kvcheck::expand(spec));
//   engine.get_cache({"a"}, 1);   // handle 1: an owned copy
#pragma once

#include "kv/store.h"
#include "kv/generation.h"
#include "kv/models.h"
#include "id_map.h"
#include "kvcheck/engine.h"

#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace kvcheck::adapters {

// A cache holding exactly `content` (tensors built from kvcheck::fill_slot).
kv::CachePtr materialize(const CacheContent& content);
// What kvcheck sees of a cache: layout, flags, and per slot dtype, shape
// and content hash.
CacheView view_of(const kv::Cache& cache);
// view_digest(view_of(cache)), without building the view.
std::uint64_t digest_of(const kv::Cache& cache);

// A file system that "loses power" once `bytes_budget` bytes are written:
// the file being written keeps only the bytes that fit, and every later
// write or rename throws PowerCut.
class CrashingFileSystem final : public kv::FileSystem {
  public:
    struct PowerCut {};
    explicit CrashingFileSystem(std::int64_t bytes_budget) : budget_(bytes_budget) {}
    void write_file(const std::string& path, const std::vector<char>& bytes) override;
    void rename(const std::string& from, const std::string& to) override;
    std::vector<char> read_file(const std::string& path, std::int64_t bytes_max) override;
    void remove(const std::string& path) override;
    void make_dirs(const std::string& path) override;
    std::vector<std::string> list(const std::string& dir) override;

  private:
    std::int64_t budget_;
};

// What a stored cache was made of, for entry_version (reference_engine.cpp).
struct EntrySnapshot;

class ReferenceEngine : public Engine {
  public:
    explicit ReferenceEngine(std::shared_ptr<kv::Copier> copier = std::make_shared<kv::Copier>());
    ~ReferenceEngine() override;

    std::string name() const override { return "reference"; }
    Capabilities capabilities() const override;

    void add(const std::string& id, const CacheContent& content) override;
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

    void make(const CacheContent& content, Handle out) override;
    void clone(Handle source, Handle out) override;
    void concat(const std::vector<Handle>& parts, Handle out) override;
    void to_legacy(Handle source, Handle out) override;
    void from_legacy(Handle source, Handle out) override;
    void release(Handle handle) override;

    std::vector<std::string> stored_ids() override;
    CacheView view_entry(const std::string& id) override;
    std::uint64_t entry_digest(const std::string& id) override;
    bool entry_owned(const std::string& id) override;
    CacheView view_handle(Handle handle) override;
    std::uint64_t handle_digest(Handle handle) override;
    HandleFacts handle_facts(Handle handle) override;
    std::vector<std::uint64_t> storage_of_entry(const std::string& id) override;
    std::vector<std::uint64_t> storage_of_handle(Handle handle) override;
    std::vector<CopyRecord> take_copies() override;
    std::uint64_t entry_version(const std::string& id) override;
    std::vector<std::uint64_t> entry_versions(const std::vector<std::string>& ids) override;
    std::vector<EntryFacts> read_entries(const std::vector<std::string>& ids, bool with_storage) override;

  protected:
    // The seams the mutants override; the reference behaviour is here.
    virtual kv::CachePtr store_get_cache(const std::vector<std::string>& ids);
    virtual void store_add(const std::string& id, const kv::CachePtr& cache);
    virtual void store_dump(const std::string& dir, kv::FileSystem& fs);
    virtual std::vector<std::int64_t> run_generation(const kv::ConstCachePtr& past,
                                                     const std::vector<std::int64_t>& prompt,
                                                     std::int64_t max_new_tokens, bool stream,
                                                     kv::GenerationStats& stats);

    kv::ConstCachePtr handle(Handle h) const;  // null for unknown or empty handles
    kv::ConstCachePtr stored(const std::string& id) const;  // throws for a missing id
    // The same, without taking a reference: for the observations, which
    // read the cache and let go before the store can change.
    const kv::Cache& stored_cache(const std::string& id) const;

    std::shared_ptr<kv::Copier> copier_;
    kv::Store store_;
    kv::models::Decoder model_;

  private:
    std::map<Handle, kv::ConstCachePtr> handles_;
    std::size_t copies_reported_ = 0;
    // The item stored_cache found last, held: while its `stored` flag stays
    // set the store maps its id to it. The checks ask for one entry's
    // version, view, marker and storage in turn.
    mutable kv::ItemPtr found_item_;
    // Per stored id: what its cache was made of when its version was last
    // handed out (entry_version), and that version.
    IdMap<std::unique_ptr<EntrySnapshot>> snapshots_;
    static constexpr std::size_t spare_snapshots_max = 64;
    std::vector<std::unique_ptr<EntrySnapshot>> spare_snapshots_;  // emptied, kept for reuse
    std::uint64_t versions_issued_ = 0;

    void forget_snapshot(const std::string& id);
    void chunk_items(const std::vector<std::string>& ids, std::size_t begin, std::size_t end,
                     std::vector<kv::ItemPtr>& items, std::vector<const kv::Cache*>& caches);
    // `values`: warm the values the facts hash; else the version counters.
    void each_warmed(const std::vector<std::string>& ids, bool values,
                     const std::function<void(const std::string&)>& take);
    std::vector<const EntrySnapshot*> chunk_snapshots_;  // chunk_items' scratch
};

}  // namespace kvcheck::adapters
