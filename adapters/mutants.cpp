// The mutants: each is the reference with one known bug planted (SPEC
// section 5), through one of the reference adapter's seams or the Copier's
// copy strategy. Kept small on purpose: the diff from the reference is the bug.
#include "bundled.h"
#include "reference_engine.h"

#include <ATen/ops/empty.h>

#include <algorithm>

namespace kvcheck::adapters {
namespace {

using kv::Cache;
using kv::CachePtr;
using kv::ConstCachePtr;

// A Copier whose clone strategy is given per mutant.
class MutantCopier final : public kv::Copier {
  public:
    using CloneFn = std::function<CachePtr(const Cache&)>;
    using ConcatFn = std::function<CachePtr(const std::vector<ConstCachePtr>&)>;
    MutantCopier(CloneFn clone, ConcatFn concat) : clone_(std::move(clone)), concat_(std::move(concat)) {}

  protected:
    CachePtr clone_strategy(const Cache& source) override { return clone_ ? clone_(source) : kv::clone(source); }
    CachePtr concat_strategy(const std::vector<ConstCachePtr>& parts) override {
        return concat_ ? concat_(parts) : kv::concat(parts);
    }

  private:
    CloneFn clone_;
    ConcatFn concat_;
};

// A modern clone built layer by layer with `copy_layer`.
CachePtr clone_layers(const Cache& source, const std::function<kv::Layer(const kv::Layer&)>& copy_layer) {
    if (source.layout() == kv::Layout::legacy) return kv::clone(source);
    auto layers = std::make_shared<kv::LayerList>();
    for (const kv::LayerPtr& layer : *source.layers()) layers->push_back(std::make_shared<kv::Layer>(copy_layer(*layer)));
    return Cache::from_layers(std::move(layers));
}

at::Tensor copy_of(const at::Tensor& t) { return t.defined() ? t.clone() : at::Tensor(); }

// A layer with every slot copied, as the reference clone makes it.
kv::Layer copied(const kv::Layer& layer) {
    kv::Layer twin;
    twin.keys = copy_of(layer.keys);
    twin.values = copy_of(layer.values);
    twin.key_cache = copy_of(layer.key_cache);
    twin.value_cache = copy_of(layer.value_cache);
    twin.is_initialized = layer.is_initialized;
    return twin;
}

// M1: generate hands the incoming cache to the model without cloning.
class M1 final : public ReferenceEngine {
  public:
    std::string name() const override { return "M1"; }

  protected:
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream,
                                             kv::GenerationStats& stats) override {
        const CachePtr working = past ? std::const_pointer_cast<Cache>(past) : Cache::make(kv::Layout::modern);
        std::vector<std::int64_t> tokens;
        kv::run_model(model_, prompt, *working, max_new_tokens,
                      [&tokens](std::int64_t token) { tokens.push_back(token); }, &stats);
        return tokens;
    }
};

// M2: get_cache with one id returns the stored object (marked owned, as the
// copy path marks whatever it returns).
class M2 final : public ReferenceEngine {
  public:
    std::string name() const override { return "M2"; }

  protected:
    CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        std::vector<ConstCachePtr> kept;
        for (const std::string& id : ids) {
            const kv::ItemPtr item = store_.get(id);
            if (item && kv::holds_tokens(*item->cache)) kept.push_back(item->cache);
        }
        if (kept.size() != 1) return ReferenceEngine::store_get_cache(ids);
        CachePtr same = std::const_pointer_cast<Cache>(kept.front());
        same->set_owned(true);
        return same;
    }
};

// M3: generate clones even an owned copy (the double copy).
class M3 final : public ReferenceEngine {
  public:
    std::string name() const override { return "M3"; }

  protected:
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream,
                                             kv::GenerationStats& stats) override {
        ConstCachePtr again = past && past->owned() ? copier_->clone(*past, kv::CopyReason::generate) : past;
        return ReferenceEngine::run_generation(again, prompt, max_new_tokens, stream, stats);
    }
};

// M8: storing an owned copy keeps its marker.
class M8 final : public ReferenceEngine {
  public:
    std::string name() const override { return "M8"; }

  protected:
    void store_add(const std::string& id, const CachePtr& cache) override {
        const bool owned = cache->owned();
        ReferenceEngine::store_add(id, cache);
        cache->set_owned(owned);
    }
};

// M10: dump writes the final file in place (no temporary, no rename).
class M10 final : public ReferenceEngine {
  public:
    std::string name() const override { return "M10"; }

  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        fs.make_dirs(dir);
        fs.write_file(dir + "/" + kv::dump_file_name, kv::encode_dump(store_.get_all()));
    }
};

// M11 (ours): the generation boundary's copy drops the last token of every
// layer, an off-by-one of a sliding-window trim. Only the generated tokens
// show it: the store, the copy count and the layouts are all correct.
class M11 final : public ReferenceEngine {
  public:
    std::string name() const override { return "M11"; }

  protected:
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream,
                                             kv::GenerationStats& stats) override {
        const CachePtr working = kv::own_for_generation(past, *copier_);
        trim_last_token(*working);
        std::vector<std::int64_t> tokens;
        kv::run_model(model_, prompt, *working, max_new_tokens,
                      [&tokens](std::int64_t token) { tokens.push_back(token); }, &stats);
        return tokens;
    }

  private:
    static at::Tensor trimmed(const at::Tensor& t) {
        if (!t.defined() || t.dim() != 4 || t.size(2) == 0) return t;
        return t.narrow(2, 0, t.size(2) - 1);
    }
    static void trim_last_token(Cache& cache) {
        if (cache.layout() == kv::Layout::legacy) {
            for (at::Tensor& t : *cache.key_cache()) t = trimmed(t);
            for (at::Tensor& t : *cache.value_cache()) t = trimmed(t);
            return;
        }
        for (const kv::LayerPtr& layer : *cache.layers()) {
            layer->keys = trimmed(layer->keys);
            layer->values = trimmed(layer->values);
        }
    }
};

// M12 (ours): get_all lists the ids sorted, not in insertion order (a store
// kept in an ordered map). Breaks only the plain store contract.
class M12 final : public ReferenceEngine {
  public:
    std::string name() const override { return "M12"; }
    std::vector<std::string> get_all_ids() override {
        std::vector<std::string> ids = ReferenceEngine::get_all_ids();
        std::sort(ids.begin(), ids.end());
        return ids;
    }
};

template <typename Mutant>
std::unique_ptr<Engine> make_engine() {
    return std::make_unique<Mutant>();
}

// A reference engine with a mutant copy strategy, under a mutant's name.
class CopierMutant final : public ReferenceEngine {
  public:
    CopierMutant(std::string name, std::shared_ptr<kv::Copier> copier)
        : ReferenceEngine(std::move(copier)), name_(std::move(name)) {}
    std::string name() const override { return name_; }

  private:
    std::string name_;
};

std::function<std::unique_ptr<Engine>()> with_copier(const std::string& name, MutantCopier::CloneFn clone,
                                                     MutantCopier::ConcatFn concat = nullptr) {
    return [name, clone, concat] {
        return std::make_unique<CopierMutant>(name, std::make_shared<MutantCopier>(clone, concat));
    };
}

// M4: clone of an empty modern cache shares the layer list.
CachePtr clone_m4(const Cache& source) {
    if (source.layout() == kv::Layout::modern && source.layers()->empty()) return Cache::from_layers(source.layers());
    return kv::clone(source);
}

// M5: clone prefers the legacy slots when the modern ones exist: it builds
// the copy's keys/values from key_cache/value_cache, and carries the legacy
// slots over as they are (uncopied).
CachePtr clone_m5(const Cache& source) {
    return clone_layers(source, [](const kv::Layer& layer) {
        if (!layer.keys.defined() || !layer.key_cache.defined()) return copied(layer);
        kv::Layer twin = layer;  // the legacy slots come along uncopied
        twin.keys = copy_of(layer.key_cache);
        twin.values = copy_of(layer.value_cache.defined() ? layer.value_cache : layer.values);
        return twin;
    });
}

// M6: clone copies each layer's (key(), value()) as a pair: a one-sided
// layer cannot be copied so and is kept as it is (the source's own layer
// object), and a paired layer's legacy-named slots are dropped.
CachePtr clone_m6(const Cache& source) {
    if (source.layout() == kv::Layout::legacy) return kv::clone(source);
    auto layers = std::make_shared<kv::LayerList>();
    for (const kv::LayerPtr& layer : *source.layers()) {
        if (!layer->key().defined() || !layer->value().defined()) {
            layers->push_back(layer);
            continue;
        }
        auto twin = std::make_shared<kv::Layer>();
        twin->keys = copy_of(layer->key());
        twin->values = copy_of(layer->value());
        twin->is_initialized = layer->is_initialized;
        layers->push_back(std::move(twin));
    }
    return Cache::from_layers(std::move(layers));
}

// M7: merged layers are not marked initialized (their length reads 0).
CachePtr concat_m7(const std::vector<ConstCachePtr>& parts) {
    CachePtr merged = kv::concat(parts);
    if (merged->layout() == kv::Layout::modern) {
        for (const kv::LayerPtr& layer : *merged->layers()) layer->is_initialized = false;
    }
    return merged;
}

// M9: clone copies the layer objects but shares their tensors.
CachePtr clone_m9(const Cache& source) {
    if (source.layout() == kv::Layout::legacy) {
        return Cache::from_slots(std::make_shared<kv::TensorList>(*source.key_cache()),
                                 std::make_shared<kv::TensorList>(*source.value_cache()));
    }
    return clone_layers(source, [](const kv::Layer& layer) { return layer; });
}

}  // namespace

const std::vector<BundledAdapter>& bundled() {
    static const std::vector<BundledAdapter> adapters = {
        {"reference", "the reference implementation", {}, make_engine<ReferenceEngine>},
        {"M1", "generate hands the incoming cache to the model without cloning", {"stored-immutable", "single-copy"}, make_engine<M1>},
        {"M2", "get_cache with one id returns the stored object", {"stored-immutable", "owned-marker", "single-copy"}, make_engine<M2>},
        {"M3", "generate clones even an owned copy (double copy)", {"single-copy"}, make_engine<M3>},
        {"M4", "clone of an empty modern cache shares the layer list", {"clone-independent", "stored-immutable"},
         with_copier("M4", clone_m4)},
        {"M5", "clone prefers the legacy slots when the modern ones exist", {"layout-roundtrip", "clone-independent", "generation-equivalent"},
         with_copier("M5", clone_m5)},
        {"M6", "clone copies K and V as a pair and drops a one-sided layer", {"clone-independent", "layout-roundtrip"},
         with_copier("M6", clone_m6)},
        {"M7", "merged layers are not marked initialized", {"merge-correct", "generation-equivalent"},
         with_copier("M7", nullptr, concat_m7)},
        {"M8", "storing an owned copy keeps its marker", {"owned-marker", "stored-immutable"}, make_engine<M8>},
        {"M9", "clone copies layer objects but shares their tensors", {"clone-independent", "stored-immutable", "owned-marker"},
         with_copier("M9", clone_m9)},
        {"M10", "dump writes in place (no temporary file and rename)", {"dump-safe"}, make_engine<M10>},
        {"M11", "the boundary copy drops the last cached token", {"generation-equivalent"}, make_engine<M11>},
        {"M12", "get_all lists ids sorted instead of in insertion order", {"store-contract"}, make_engine<M12>},
    };
    return adapters;
}

const BundledAdapter* find_bundled(const std::string& name) {
    for (const BundledAdapter& adapter : bundled()) {
        if (adapter.name == name) return &adapter;
    }
    return nullptr;
}

}  // namespace kvcheck::adapters
