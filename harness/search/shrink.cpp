#include "kvcheck/shrink.h"

#include "kvcheck/domain.h"
#include "search/shrink_lanes.h"

#include <boost/pfr.hpp>

#include <algorithm>
#include <functional>
#include <string_view>
#include <type_traits>

namespace kvcheck {
namespace {

// Simpler token counts of one layer, or of every layer at once, most
// drastic first: toward a size threshold, the power of two at or below,
// an eighth less, then one less. A count never goes below `floor`.
std::vector<std::function<std::int64_t(std::int64_t)>> simpler_token_counts(std::int64_t floor) {
    return {
        [floor](std::int64_t t) { return std::min<std::int64_t>(t, std::max<std::int64_t>(floor, 1)); },
        [floor](std::int64_t) { return floor; },
        [floor](std::int64_t t) { return std::max(t / 2, floor); },
        [floor](std::int64_t t) {
            std::int64_t power = 1;
            while (power * 2 <= t) power *= 2;
            return t > 0 ? std::max(power, floor) : t;
        },
        [floor](std::int64_t t) { return std::max(t - t / 8, floor); },
        [floor](std::int64_t t) { return std::max(t - 1, floor); },
    };
}

// Simpler versions of a cache spec, most drastic first. A cache of a
// declared model stays one (kvcheck/domain.h): it keeps its layers, their
// tokens change together and never reach 0, and its dtype, layout and
// layer shapes change only to ones the model has.
std::vector<CacheSpec> simpler_specs(const CacheSpec& spec, const ModelDomain& model) {
    std::vector<CacheSpec> simpler;
    const bool in_model = model.declared && spec_fault(model, spec).empty();
    const auto keep = [&](const CacheSpec& changed) {
        if (changed == spec) return;
        if (in_model && !spec_fault(model, changed).empty()) return;
        simpler.push_back(changed);
    };
    for (std::size_t i = 0; i < spec.layers.size() && !in_model; ++i) {
        CacheSpec fewer = spec;
        fewer.layers.erase(fewer.layers.begin() + static_cast<std::ptrdiff_t>(i));
        keep(fewer);
    }
    if (in_model) {
        for (const auto& count : simpler_token_counts(1)) {
            CacheSpec changed = spec;
            for (LayerSpec& layer : changed.layers) layer.tokens = count(layer.tokens);
            keep(changed);
        }
    }
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        const LayerSpec& layer = spec.layers[i];
        auto with = [&](auto change) {
            CacheSpec changed = spec;
            change(changed.layers[i]);
            keep(changed);
        };
        if (!in_model) {
            for (const auto& count : simpler_token_counts(0)) with([&count](LayerSpec& l) { l.tokens = count(l.tokens); });
        }
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
        keep(changed);
    };
    const Dtype plainest = in_model ? model.dtypes.front() : Dtype::f32;
    whole([plainest](CacheSpec& s) { s.dtype = plainest; });
    whole([](CacheSpec& s) { s.layout = Layout::modern; });
    whole([](CacheSpec& s) { s.seed = 0; });
    return simpler;
}

// `trace` with `change` applied to every cache spec in it; false when
// nothing changed.
bool change_every_spec(Trace& trace, const std::function<void(CacheSpec&)>& change) {
    bool changed = false;
    for (Op& operation : trace) {
        std::visit(
            [&](auto& o) {
                boost::pfr::for_each_field(o, [&](auto& field) {
                    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, CacheSpec>) {
                        const CacheSpec before = field;
                        change(field);
                        changed = changed || !(field == before);
                    }
                });
            },
            operation);
    }
    return changed;
}

// Simpler geometries for a whole trace, most drastic first: a trace has one
// geometry (merges need it), so every spec changes together. The default
// geometry is the simplest; a larger one halves toward it (never past it,
// so that no two candidates undo each other).
std::vector<Trace> simpler_geometries(const Trace& trace, const ModelDomain& model) {
    std::vector<Trace> simpler;
    if (model.declared) return simpler;  // the model's geometry is the only one
    const auto whole = [&](const std::function<void(CacheSpec&)>& change) {
        Trace changed = trace;
        if (change_every_spec(changed, change)) simpler.push_back(std::move(changed));
    };
    whole([](CacheSpec& s) {
        s.heads = cache_heads;
        s.head_dim = cache_head_dim;
    });
    whole([](CacheSpec& s) {
        if (s.heads > cache_heads) s.heads = std::max(s.heads / 2, cache_heads);
    });
    whole([](CacheSpec& s) {
        if (s.head_dim > cache_head_dim) s.head_dim = std::max(s.head_dim / 2, cache_head_dim);
    });
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

// 1, value / 2 and value - 1, each once, smallest first.
std::vector<std::int64_t> smaller_counts(std::int64_t value) {
    std::vector<std::int64_t> counts{1};
    for (const std::int64_t count : {value / 2, value - 1}) {
        if (count > counts.back()) counts.push_back(count);
    }
    return counts;
}

// Simpler values of an integer field, by its name: a size shrinks toward
// its smallest meaningful value; a dump slot is a name and `truncate` a
// switch, and neither is a size. A field not listed is left as it is.
std::vector<std::int64_t> simpler_integers(std::string_view field, std::int64_t value) {
    if (field == "max" && value > 1) return {1};
    if (field == "bytes" && value > 0) return {value / 2, 0};
    if (field == "offset" && value > 0) return {0};
    // paged_append's and paged_rewind's count, trim's keep: 1 first, then
    // halfway and one less, so a failure that needs a count above 1 still
    // comes down step by step.
    if ((field == "count" || field == "keep") && value > 1) return smaller_counts(value);
    return {};
}

// Simpler prompts: one token, then the plainest token.
std::vector<Tokens> simpler_prompts(const Tokens& prompt) {
    if (prompt.size() > 1) return {Tokens{prompt.front()}};
    if (prompt.size() == 1 && prompt[0] != 1) return {Tokens{1}};
    return {};
}

// Simpler versions of one operation, field by field, whatever the
// operation: smaller caches, shorter prompts and lists (down to the
// operation's list_min), smaller sizes.
std::vector<Op> simpler_ops(const Op& operation, const ModelDomain& model) {
    std::vector<Op> simpler;
    std::visit(
        [&simpler, &model](const auto& o) {
            using T = std::decay_t<decltype(o)>;
            boost::pfr::for_each_field(o, [&](const auto& field, std::size_t index) {
                using F = std::decay_t<decltype(field)>;
                const auto emit = [&](const F& value) {
                    T changed = o;
                    boost::pfr::for_each_field(changed, [&](auto& target, std::size_t at) {
                        if constexpr (std::is_same_v<std::decay_t<decltype(target)>, F>) {
                            if (at == index) target = value;
                        }
                    });
                    simpler.push_back(changed);
                };
                if constexpr (std::is_same_v<F, CacheSpec>) {
                    for (const CacheSpec& spec : simpler_specs(field, model)) emit(spec);
                } else if constexpr (std::is_same_v<F, Tokens>) {
                    for (const Tokens& prompt : simpler_prompts(field)) emit(prompt);
                } else if constexpr (std::is_same_v<F, Ids> || std::is_same_v<F, HandleNames>) {
                    drop_each<typename F::value_type>(field, T::list_min, emit);
                } else if constexpr (std::is_same_v<F, MetaSeed>) {
                    if (field.value != 0) emit(MetaSeed{0});
                } else if constexpr (std::is_same_v<F, HandleName>) {
                    // A source handle made by a chain of operations (a turn
                    // from a turn) may be no cache instead: the chain then
                    // drops. The handle an operation makes stays.
                    const bool made_here = index == 0 && std::string_view(T::fields[0]) == "out";
                    if (!made_here && field.value != 0) emit(HandleName{0});
                } else if constexpr (std::is_same_v<F, std::int64_t>) {
                    for (const std::int64_t value : simpler_integers(T::fields[index], field)) emit(value);
                }
            });
        },
        operation);
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
            progress = drop_lanes();
            progress = drop_chunks() || progress;
            progress = fewer_switches() || progress;
            progress = simplify_geometry() || progress;
            progress = simplify_ops() || progress;
            progress = join_appends() || progress;
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
        if (!failure || !same_failure(*failure)) return false;
        best_ = candidate;
        failure_ = *failure;
        cut_after_failure();
        return true;
    }

    bool same_failure(const Failure& failure) const {
        return options_.keeps ? options_.keeps(failure) : failure.property == failure_.property;
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
                if (shrink_lanes::relabels(best_, start, end)) {  // a call would move to another lane
                    start += chunk;
                    continue;
                }
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

    // A concurrent trace (kvcheck/lanes.h): fewer lanes, then fewer
    // context switches (the same calls per lane, interleaved otherwise).
    bool drop_lanes() { return first_failing(shrink_lanes::fewer_lanes); }
    bool fewer_switches() { return first_failing(shrink_lanes::fewer_switches); }

    // Tries the candidates `simpler` gives of the best trace, again after
    // each that fails the same way, until none does.
    bool first_failing(const std::function<std::vector<Trace>(const Trace&)>& simpler) {
        bool progress = false;
        bool changed = true;
        while (changed && budget_left()) {
            changed = false;
            for (const Trace& candidate : simpler(best_)) {
                if (try_candidate(candidate)) {
                    changed = progress = true;
                    break;
                }
            }
        }
        return progress;
    }

    bool simplify_geometry() {
        return first_failing([this](const Trace& trace) { return simpler_geometries(trace, options_.model); });
    }

    bool simplify_ops() {
        bool progress = false;
        for (std::size_t i = 0; i < best_.size() && budget_left(); ++i) {
            bool changed = true;
            while (changed && i < best_.size() && budget_left()) {
                changed = false;
                if (std::holds_alternative<op::SwitchLane>(best_[i])) break;  // its lane is the calls' after it
                for (const Op& simpler : simpler_ops(best_[i], options_.model)) {
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

    // Two appends to one sequence, one right after the other, as one
    // append of both counts: a failure that needs N tokens appended keeps
    // one operation for them.
    bool join_appends() {
        bool progress = false;
        for (std::size_t i = 0; i + 1 < best_.size() && budget_left();) {
            const auto* first = std::get_if<op::PagedAppend>(&best_[i]);
            const auto* second = std::get_if<op::PagedAppend>(&best_[i + 1]);
            if (first == nullptr || second == nullptr || first->seq != second->seq) {
                ++i;
                continue;
            }
            Trace candidate = best_;
            std::get<op::PagedAppend>(candidate[i]).count += second->count;
            candidate.erase(candidate.begin() + static_cast<std::ptrdiff_t>(i + 1));
            if (try_candidate(candidate)) {
                progress = true;  // the joined append may join the next one too
            } else {
                ++i;
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
