// Shared fixtures for the unit tests: seeded caches with exact values and a
// deep comparison of caches.
#pragma once

#include "kv/cache.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace kvtest {

// A [1, heads, seq, head_dim] tensor of small multiples of 1/8, exact in
// every float dtype, determined by `seed`.
at::Tensor kv_tensor(std::int64_t seq, std::uint64_t seed, at::ScalarType dtype = at::kFloat,
                     std::int64_t heads = 2, std::int64_t head_dim = 4);

// A cache of `layers` layers of `seq` tokens, every layer initialized.
kv::CachePtr make_cache(kv::Layout layout, std::int64_t layers, std::int64_t seq,
                        std::uint64_t seed, at::ScalarType dtype = at::kFloat);

// Equal layout, layer count, slot presence, flags, dtypes, shapes and bytes.
// On a difference, `why` says where.
bool same_cache(const kv::Cache& a, const kv::Cache& b, std::string* why = nullptr);

// A fresh empty directory under the system temp dir, removed (with what
// it holds) when the test binary exits.
std::string fresh_dir(const std::string& tag);

}  // namespace kvtest
