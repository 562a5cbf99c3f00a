// The mutants: each is the reference with one known bug planted
// (docs/semantics.md#known-bugs), one style for all: a ReferenceEngine
// subclass that overrides one of its seams, or hands it a Copier whose
// clone or concat strategy is the bug. Kept small on purpose: the diff from
// the reference is the bug. Their names, descriptions and the properties
// each breaks are in one table, adapters/bundled.cpp.
#include "mutants/mutants.h"

#include "reference/reference_engine.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <unistd.h>

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
  protected:
    void store_add(const std::string& id, const CachePtr& cache) override {
        const bool owned = cache->owned();
        ReferenceEngine::store_add(id, cache);
        cache->set_owned(owned);
    }
};

// M10: dump writes the final file in place (no temporary, no rename).
class M10 final : public ReferenceEngine {
  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        fs.make_dirs(dir);
        fs.write_file(dir + "/" + kv::dump_file_name, kv::encode_dump(store_.get_all()));
    }
};

// The dump's file system with one of its two flushes skipped.
class UnflushedFiles final : public kv::PosixFileSystem {
  protected:
    void flush_file(int, const std::string&) override {}
};

class UnflushedDirectory final : public kv::PosixFileSystem {
  protected:
    void flush_directory(const std::string&) override {}
};

// M25 (ours): the dump never fsyncs its file: the rename can reach the
// disk before the bytes it names, and a power cut leaves an empty dump.
class M25 final : public ReferenceEngine {
  protected:
    kv::FileSystem& file_system() override { return files_; }

  private:
    UnflushedFiles files_;
};

// M26 (ours): the dump never fsyncs the directory after its rename: dump
// returns, and a power cut can still undo the rename.
class M26 final : public ReferenceEngine {
  protected:
    kv::FileSystem& file_system() override { return files_; }

  private:
    UnflushedDirectory files_;
};

// M27 (ours): the dump's temporary has a name the clean-up of crashed
// dumps does not look for (".partial-<pid>" where it looks for ".tmp-"):
// each killed dump leaves its temporary for ever.
class M27 final : public ReferenceEngine {
  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        fs.make_dirs(dir);
        const std::string target = dir + "/" + kv::dump_file_name;
        const std::string temporary = target + ".partial-" + std::to_string(::getpid());
        fs.write_file(temporary, kv::encode_dump(store_.get_all()));
        fs.rename(temporary, target);
    }
};

// M11 (ours): the generation boundary's copy drops the last token of every
// layer, an off-by-one of a sliding-window trim. Only the generated tokens
// show it: the store, the copy count and the layouts are all correct.
class M11 final : public ReferenceEngine {
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
    std::vector<std::string> get_all_ids() override {
        std::vector<std::string> ids = ReferenceEngine::get_all_ids();
        std::sort(ids.begin(), ids.end());
        return ids;
    }
};

// A Copier whose clone (and concat) strategy is the bug.
std::shared_ptr<kv::Copier> copier_with(MutantCopier::CloneFn clone, MutantCopier::ConcatFn concat = nullptr) {
    return std::make_shared<MutantCopier>(std::move(clone), std::move(concat));
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

class M4 final : public ReferenceEngine {
  public:
    M4() : ReferenceEngine(copier_with(clone_m4)) {}
};

class M5 final : public ReferenceEngine {
  public:
    M5() : ReferenceEngine(copier_with(clone_m5)) {}
};

class M6 final : public ReferenceEngine {
  public:
    M6() : ReferenceEngine(copier_with(clone_m6)) {}
};

class M7 final : public ReferenceEngine {
  public:
    M7() : ReferenceEngine(copier_with(nullptr, concat_m7)) {}
};

class M9 final : public ReferenceEngine {
  public:
    M9() : ReferenceEngine(copier_with(clone_m9)) {}
};

// A bundled adapter of mutant M under `name`.
template <typename M>
Adapter mutant(const std::string& name, std::string description, std::vector<Property> breaks) {
    return {name, std::move(description), "bundled", std::move(breaks), [name] {
                auto engine = std::make_shared<M>();
                engine->rename(name);
                return std::shared_ptr<Engine>(std::move(engine));
            }};
}

using P = Property;

}  // namespace

std::vector<Adapter> mutant_adapters() {
    return {
        mutant<M1>("M1", "generate hands the incoming cache to the model without cloning", {P::stored_immutable, P::single_copy}),
        mutant<M2>("M2", "get_cache with one id returns the stored object",
                   {P::stored_immutable, P::owned_marker, P::single_copy}),
        mutant<M3>("M3", "generate clones even an owned copy (double copy)", {P::single_copy}),
        mutant<M4>("M4", "clone of an empty modern cache shares the layer list",
                   {P::clone_independent, P::stored_immutable, P::generation_equivalent}),
        mutant<M5>("M5", "clone prefers the legacy slots when the modern ones exist",
                   {P::layout_roundtrip, P::clone_independent, P::generation_equivalent, P::stored_immutable}),
        mutant<M6>("M6", "clone copies K and V as a pair and drops a one-sided layer",
                   {P::clone_independent, P::layout_roundtrip, P::generation_equivalent, P::stored_immutable, P::owned_marker}),
        mutant<M7>("M7", "merged layers are not marked initialized", {P::merge_correct, P::generation_equivalent}),
        mutant<M8>("M8", "storing an owned copy keeps its marker", {P::owned_marker, P::stored_immutable}),
        mutant<M9>("M9", "clone copies layer objects but shares their tensors",
                   {P::clone_independent, P::stored_immutable, P::owned_marker}),
        mutant<M10>("M10", "dump writes in place (no temporary file and rename)", {P::dump_safe}),
        mutant<M11>("M11", "the boundary copy drops the last cached token", {P::generation_equivalent}),
        mutant<M12>("M12", "get_all lists ids sorted instead of in insertion order", {P::store_contract}),
        mutant<M25>("M25", "dump never fsyncs its file before the rename", {P::dump_safe}),
        mutant<M26>("M26", "dump never fsyncs the directory after the rename", {P::dump_safe}),
        mutant<M27>("M27", "a killed dump's temporary file is never removed", {P::dump_safe}),
    };
}

}  // namespace kvcheck::adapters
