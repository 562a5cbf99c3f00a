// The model domain (kvcheck/engine.h, ModelDomain): the caches one model
// makes, and what the harness does with it. One home for its rules: what
// is in it (spec_fault), whether an engine's declaration holds together
// (capabilities_fault), its text on the command line and in reports
// (parse_model_domain, domain_text), and the layout a fresh cache of the
// engine has (fresh_layout). The workload draws inside it
// (kvcheck/workload.h) and the shrinker keeps to it (kvcheck/shrink.h).
//
//   ModelDomain model = parse_model_domain("layers=2,heads=2,head_dim=8,dtype=f32,layout=modern");
//   domain_text(model) == "layers=2 heads=2 head_dim=8 dtype=f32 layout=modern"
//   spec_fault(model, parse_cache_spec("modern/f32/1/2x8:[kv3 kv3]")).empty()
#pragma once

#include "kvcheck/content.h"
#include "kvcheck/engine.h"

#include <string>

namespace kvcheck {

// Why these capabilities cannot be searched ("" when they can): neither
// layout, or a declared model that is malformed (layers < 1, heads or
// head_dim out of range, no dtype or layout, a repeat) or that holds what
// the other capabilities refuse (a half dtype without half_dtypes, a
// layout the engine does not take, another geometry than 2x4 without
// any_geometry). Each names the field.
std::string capabilities_fault(const Capabilities& capabilities);

// Why `spec` is not a cache of `model` ("" when it is, and always when the
// model is undeclared): its layer count, a layer's token count (all equal,
// at least 1), its geometry, dtype, layout, or an odd layer (bare,
// one-sided, uninitialized or legacy-named) when the model has none.
std::string spec_fault(const ModelDomain& model, const CacheSpec& spec);

// The layout of a cache the engine starts itself (generation with no
// cache): modern when it takes modern caches (and its model holds them),
// else legacy.
Layout fresh_layout(const Capabilities& capabilities);

// "layers=2 heads=2 head_dim=8 dtype=f32+bf16 layout=modern" (then
// " odd_layers=yes" when odd layers occur), or "any (undeclared)".
std::string domain_text(const ModelDomain& model);

// kvcheck run --model: "key=value" pairs joined by ',' (or blanks), every
// key once: layers, heads, head_dim, dtype (f32, f16, bf16, several joined
// by '+'), layout (modern, legacy, or modern+legacy), odd_layers (yes or
// no; default no). heads and head_dim default to 2 and 4; layers, dtype
// and layout are required. The result is declared. Throws
// std::invalid_argument naming the bad key or value.
ModelDomain parse_model_domain(const std::string& text);

}  // namespace kvcheck
