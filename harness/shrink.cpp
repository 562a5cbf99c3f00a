#include "kvcheck/shrink.h"

#include <algorithm>

namespace kvcheck {
namespace {

// Simpler versions of a cache spec, most drastic first.
std::vector<CacheSpec> simpler_specs(const CacheSpec& spec) {
    std::vector<CacheSpec> simpler;
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        CacheSpec fewer = spec;
        fewer.layers.erase(fewer.layers.begin() + static_cast<std::ptrdiff_t>(i));
        simpler.push_back(fewer);
    }
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        const LayerSpec& layer = spec.layers[i];
        auto with = [&](auto change) {
            CacheSpec changed = spec;
            change(changed.layers[i]);
            if (!(changed == spec)) simpler.push_back(changed);
        };
        with([](LayerSpec& l) { l.tokens = std::min<std::int64_t>(l.tokens, 1); });
        with([](LayerSpec& l) { l.tokens = 0; });
        with([](LayerSpec& l) { l.tokens /= 2; });
        with([](LayerSpec& l) { l.initialized = true; });
        with([](LayerSpec& l) { l.slots = 0b0011; });
        if (layer.slots == 0b1111) {
            with([](LayerSpec& l) { l.slots = 0b0101; });
            with([](LayerSpec& l) { l.slots = 0b1010; });
        }
    }
    auto whole = [&](auto change) {
        CacheSpec changed = spec;
        change(changed);
        if (!(changed == spec)) simpler.push_back(changed);
    };
    whole([](CacheSpec& s) { s.dtype = Dtype::f32; });
    whole([](CacheSpec& s) { s.layout = Layout::modern; });
    whole([](CacheSpec& s) { s.seed = 0; });
    return simpler;
}

template <typename T>
void drop_each(const std::vector<T>& list, std::size_t keep_min, const std::function<void(std::vector<T>)>& emit) {
    if (list.size() <= keep_min) return;
    for (std::size_t i = 0; i < list.size(); ++i) {
        std::vector<T> fewer = list;
        fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(i));
        emit(fewer);
    }
}

// Simpler versions of one operation.
std::vector<Op> simpler_ops(const Op& op) {
    std::vector<Op> simpler;
    auto spec_variants = [&simpler](auto op_copy, CacheSpec& (*field)(decltype(op_copy)&)) {
        for (const CacheSpec& spec : simpler_specs(field(op_copy))) {
            auto changed = op_copy;
            field(changed) = spec;
            simpler.push_back(changed);
        }
    };
    auto generate_variants = [&simpler](auto g) {
        if (g.prompt.size() > 1) {
            auto shorter = g;
            shorter.prompt.resize(1);
            simpler.push_back(shorter);
        }
        if (g.prompt.size() == 1 && g.prompt[0] != 1) {
            auto plain = g;
            plain.prompt[0] = 1;
            simpler.push_back(plain);
        }
        if (g.max > 1) {
            auto fewer = g;
            fewer.max = 1;
            simpler.push_back(fewer);
        }
    };
    std::visit(
        [&](const auto& o) {
            using T = std::decay_t<decltype(o)>;
            if constexpr (std::is_same_v<T, op::Add>) {
                spec_variants(o, +[](op::Add& a) -> CacheSpec& { return a.cache; });
            } else if constexpr (std::is_same_v<T, op::Make>) {
                spec_variants(o, +[](op::Make& m) -> CacheSpec& { return m.cache; });
            } else if constexpr (std::is_same_v<T, op::Generate> || std::is_same_v<T, op::GenerateStream>) {
                generate_variants(o);
            } else if constexpr (std::is_same_v<T, op::GetCache>) {
                drop_each<std::string>(o.ids, 1, [&](Ids ids) { simpler.push_back(op::GetCache{o.out, ids}); });
            } else if constexpr (std::is_same_v<T, op::GetByIds> || std::is_same_v<T, op::Delete>) {
                drop_each<std::string>(o.ids, 0, [&](Ids ids) { simpler.push_back(T{ids}); });
            } else if constexpr (std::is_same_v<T, op::Concat>) {
                drop_each<HandleName>(o.parts, 1, [&](HandleNames parts) { simpler.push_back(op::Concat{o.out, parts}); });
            } else if constexpr (std::is_same_v<T, op::DumpCrash>) {
                if (o.bytes > 0) simpler.push_back(op::DumpCrash{o.slot, o.bytes / 2});
                if (o.bytes > 0) simpler.push_back(op::DumpCrash{o.slot, 0});
            } else if constexpr (std::is_same_v<T, op::Corrupt>) {
                if (o.offset > 0) simpler.push_back(op::Corrupt{o.slot, 0, o.truncate});
            }
        },
        op);
    return simpler;
}

class Shrinker {
  public:
    Shrinker(const Oracle& oracle, const ShrinkOptions& options, Trace trace, Failure failure)
        : oracle_(oracle), options_(options), best_(std::move(trace)), failure_(std::move(failure)) {
        cut_after_failure();
    }

    ShrinkResult run() {
        bool progress = true;
        while (progress && budget_left()) {
            progress = drop_chunks();
            progress = simplify_ops() || progress;
        }
        return {best_, failure_, runs_};
    }

  private:
    bool budget_left() const { return runs_ < options_.runs_max; }

    // Keeps `candidate` when it fails with the same property.
    bool try_candidate(const Trace& candidate) {
        if (!budget_left() || candidate.empty()) return false;
        ++runs_;
        std::optional<Failure> failure = oracle_(candidate);
        if (!failure || failure->property != failure_.property) return false;
        best_ = candidate;
        failure_ = *failure;
        cut_after_failure();
        return true;
    }

    void cut_after_failure() {
        if (failure_.step + 1 < best_.size()) best_.resize(failure_.step + 1);
    }

    bool drop_chunks() {
        bool progress = false;
        for (std::size_t chunk = std::max<std::size_t>(best_.size() / 2, 1); chunk >= 1; chunk /= 2) {
            for (std::size_t start = 0; start < best_.size() && budget_left();) {
                Trace candidate = best_;
                const std::size_t end = std::min(start + chunk, candidate.size());
                candidate.erase(candidate.begin() + static_cast<std::ptrdiff_t>(start),
                                candidate.begin() + static_cast<std::ptrdiff_t>(end));
                if (try_candidate(candidate)) {
                    progress = true;  // the same start now names the next chunk
                } else {
                    start += chunk;
                }
            }
            if (chunk == 1) break;
        }
        return progress;
    }

    bool simplify_ops() {
        bool progress = false;
        for (std::size_t i = 0; i < best_.size() && budget_left(); ++i) {
            bool changed = true;
            while (changed && i < best_.size() && budget_left()) {
                changed = false;
                for (const Op& simpler : simpler_ops(best_[i])) {
                    Trace candidate = best_;
                    candidate[i] = simpler;
                    if (try_candidate(candidate)) {
                        changed = progress = true;
                        break;
                    }
                }
            }
        }
        return progress;
    }

    const Oracle& oracle_;
    ShrinkOptions options_;
    Trace best_;
    Failure failure_;
    std::size_t runs_ = 0;
};

}  // namespace

ShrinkResult shrink(const Trace& trace, const Failure& failure, const Oracle& oracle, const ShrinkOptions& options) {
    return Shrinker(oracle, options, trace, failure).run();
}

}  // namespace kvcheck
