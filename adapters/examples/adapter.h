// The kvcheck adapter of the vector engine: the one file an engine author
// writes. It implements kvcheck::Engine over the engine's own API (store.h,
// cache.h, model.h) and translates at the edge: CacheContent in
// (materialize), CacheView out (view_of), storage identities and the copy
// log as the engine reports them. It adds no ownership logic of its own:
// whatever it reports is what the engine did.
//
// Handles: the adapter keeps one cache pointer per handle (null for "no
// cache") until release or the end of the run. What `get` hands out is the
// stored object itself, as the engine's store does.
//
//   vector_engine::VectorEngine engine;                 // Depth::deep: the correct engine
//   engine.add("a", kvcheck::expand(kvcheck::parse_cache_spec("modern/f32/1:[kv3]")));
//   engine.get_cache({"a"}, 1);                         // handle 1: an owned copy
#pragma once

#include "store.h"

#include <kvcheck/engine.h>

#include <map>

namespace vector_engine {

// A cache holding exactly `content`, and what kvcheck sees of a cache.
CachePtr materialize(const kvcheck::CacheContent& content);
kvcheck::CacheView view_of(const Cache& cache);

class VectorEngine : public kvcheck::Engine {
  public:
    // Depth::shallow builds vector-engine-shallow: copies share their
    // source's tensor storages (see cache.h).
    explicit VectorEngine(Depth copies = Depth::deep);

    std::string name() const override;
    // Everything, item metadata included. (An engine of one geometry would
    // clear any_geometry: kvcheck then gives it caches of 2 heads of 4 only.)
    kvcheck::Capabilities capabilities() const override {
        kvcheck::Capabilities capabilities;
        capabilities.metadata = true;
        return capabilities;
    }

    void add(const std::string& id, const kvcheck::CacheContent& content, const kvcheck::Metadata& metadata) override;
    void add_handle(const std::string& id, kvcheck::Handle handle) override;
    void get(const std::string& id, kvcheck::Handle out) override;
    std::vector<std::optional<std::string>> get_by_ids(const std::vector<std::string>& ids) override;
    std::vector<std::string> get_all_ids() override;
    void get_cache(const std::vector<std::string>& ids, kvcheck::Handle out) override;
    void remove(const std::vector<std::string>& ids) override;
    void remove_all() override;
    void dump(const std::string& dir) override;
    void dump_interrupted(const std::string& dir, std::int64_t bytes_budget) override;
    kvcheck::LoadResult load(const std::string& dir) override;

    kvcheck::GenerateResult generate(kvcheck::Handle handle, const std::vector<std::int64_t>& prompt,
                                     std::int64_t max_new_tokens, bool stream) override;
    std::vector<std::int64_t> generate_fresh(const kvcheck::CacheContent& content,
                                             const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens) override;

    void make(const kvcheck::CacheContent& content, kvcheck::Handle out) override;
    void clone(kvcheck::Handle source, kvcheck::Handle out) override;
    void concat(const std::vector<kvcheck::Handle>& parts, kvcheck::Handle out) override;
    void to_legacy(kvcheck::Handle source, kvcheck::Handle out) override;
    void from_legacy(kvcheck::Handle source, kvcheck::Handle out) override;
    void release(kvcheck::Handle handle) override;
    kvcheck::Metadata entry_metadata(const std::string& id) override;
    kvcheck::Metadata handle_metadata(kvcheck::Handle handle) override;

    std::vector<std::string> stored_ids() override;
    kvcheck::CacheView view_entry(const std::string& id) override;
    bool entry_owned(const std::string& id) override;
    kvcheck::CacheView view_handle(kvcheck::Handle handle) override;
    kvcheck::HandleFacts handle_facts(kvcheck::Handle handle) override;
    std::vector<std::uint64_t> storage_of_entry(const std::string& id) override;
    std::vector<std::uint64_t> storage_of_handle(kvcheck::Handle handle) override;
    std::vector<kvcheck::CopyRecord> take_copies() override;

  private:
    CachePtr handle(kvcheck::Handle h) const;       // null for unknown or empty handles
    CachePtr stored(const std::string& id) const;   // throws std::out_of_range for a missing id

    Depth depth_;
    Copier copier_;
    Store store_;
    Model model_;
    Disk disk_;
    std::map<kvcheck::Handle, CachePtr> handles_;
    std::map<kvcheck::Handle, kvcheck::Metadata> handle_metadata_;  // of the items get handed out
    std::size_t copies_reported_ = 0;
};

}  // namespace vector_engine
