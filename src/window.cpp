#include "kv/window.h"

#include <ATen/ops/clone.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kv {

namespace {

void window_slot(at::Tensor& slot, std::int64_t window) {
    if (!slot.defined() || slot.dim() != 4 || slot.size(2) <= window) return;
    slot = slot.narrow(2, slot.size(2) - window, window).clone();
}

}  // namespace

void keep_window(Cache& cache, std::int64_t window) {
    if (window < 1) throw std::invalid_argument("keep_window: the window must be at least 1, got " + std::to_string(window));
    // Positions are numbered by layer 0's keys (get_seq_length): what the
    // cut takes from them moves the first held token's position.
    cache.set_dropped(cache.dropped() + std::max<std::int64_t>(0, cache.get_seq_length(0) - window));
    if (cache.layout() == Layout::modern) {
        for (const LayerPtr& layer : *cache.layers()) {
            for (at::Tensor* slot : {&layer->keys, &layer->values, &layer->key_cache, &layer->value_cache}) {
                window_slot(*slot, window);
            }
        }
        return;
    }
    for (at::Tensor& slot : *cache.key_cache()) window_slot(slot, window);
    for (at::Tensor& slot : *cache.value_cache()) window_slot(slot, window);
}

}  // namespace kv
