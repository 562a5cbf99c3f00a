// A store window (docs/semantics.md#store-windows): a model that attends
// over its last W tokens needs no K/V before them, and a windowed store
// keeps only those, as transformers' sliding-window layers and mlx-lm's
// RotatingKVCache do.
//
//   kv::keep_window(*cache, 4);   // every slot holding more than 4 tokens keeps its last 4
#pragma once

#include "kv/cache.h"

#include <cstdint>

namespace kv {

// Cuts every slot of every layer holding more than `window` tokens along seq
// to its last `window`, in place: the slot is rebound to a new tensor of
// them (no storage of the old tensor kept: dropped K/V are freed, not held
// by a view); the others, empty slots and flags stay as they are; the layer
// objects and lists are the same; Cache::dropped grows by what layer 0's
// keys lost, so a model numbers the next tokens as before the cut.
// Requires window >= 1.
void keep_window(Cache& cache, std::int64_t window);

}  // namespace kv
