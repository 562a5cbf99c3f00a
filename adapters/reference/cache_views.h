// The reference's caches as kvcheck sees them: a cache built from kvcheck's
// content (CacheContent, with tensors of fill_slot's values), and a cache's
// view, digest and storage identities, which is all an observation of the
// reference adapter reports.
//
//   kv::CachePtr cache = kvcheck::adapters::materialize(kvcheck::expand(spec));
//   assert(kvcheck::adapters::view_of(*cache) == ...);   // expected_view of the same content
#pragma once

#include "kv/cache.h"
#include "kvcheck/content.h"

#include <cstdint>
#include <vector>

namespace kvcheck::adapters {

// A cache holding exactly `content`; with `mantissa_bits` < 23, each value
// first rounded to that many mantissa bits (a quantized store: 7 is the
// bfloat16 grid; docs/semantics.md#content-tolerance).
kv::CachePtr materialize(const CacheContent& content, int mantissa_bits = 23);
// What kvcheck sees of a cache: layout, flags, and per slot dtype, shape
// and content hash; with `values`, each slot's values too (SlotView::values).
CacheView view_of(const kv::Cache& cache, bool with_values = false);
// view_digest(view_of(cache)), without building the view.
std::uint64_t digest_of(const kv::Cache& cache);
// The identities of everything the cache is made of, as opaque numbers.
std::vector<std::uint64_t> storage_numbers(const kv::Cache& cache);

}  // namespace kvcheck::adapters
