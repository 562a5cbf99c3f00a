// A bounded recycling pool for the K/V buffers kv::clone and kv::concat (a
// merge) allocate, in the spirit of PyTorch's caching allocators.
//
// Why: a clone of a large cache otherwise gets fresh pages from the kernel
// every time (glibc maps big allocations anew and unmaps them on free, or
// trims its heap), and zeroing and mapping those pages costs more than the
// copy itself (BENCHMARKS.md). The pool keeps the blocks of freed copies
// resident, so the next clone of the same size copies into memory that is
// already mapped (and often still in cache).
//
// What it owns: only the idle blocks it retains, at most `limit_bytes` of
// them (default 1 GiB; 0 turns retention off). A block in use belongs to the
// tensor storage holding it, an ordinary CPU storage (resizable, the pool's
// allocator as its allocator); freeing the storage hands the block back, and
// the pool keeps it or, beyond the limit, gives its oldest blocks back to the
// system. Only blocks of `buffer_pool_block_bytes_min` and more are pooled;
// smaller ones come from libtorch's CPU allocator, whose heap reuses them
// anyway. Fresh blocks of `huge_page_block_bytes_min` and more are advised
// MADV_HUGEPAGE before their first touch. Thread-safe.
//
// Under AddressSanitizer retention is off by default, so that every free
// reaches ASan's quarantine; when a test turns it on, retained blocks and
// the unused tail of a block are poisoned, so a use after free of a pooled
// tensor is still reported (until the block is handed out again).
//
//   kv::set_buffer_pool_limit(std::int64_t{256} << 20);  // retain up to 256 MiB
//   auto copy = kv::clone(*cache);                        // slots come from the pool
//   copy.reset();                                         // their blocks go back to it
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>

namespace kv {

// Blocks this large and larger are pooled: a pooled allocation costs a lock
// and two tree look-ups, small beside a memcpy of this size.
constexpr std::size_t buffer_pool_block_bytes_min = std::size_t{64} << 10;
// Fresh blocks this large and larger are asked to be backed by transparent
// huge pages (512 times fewer page faults).
constexpr std::size_t huge_page_block_bytes_min = std::size_t{4} << 20;
// Default retention: the pool keeps at most this many idle bytes.
constexpr std::int64_t buffer_pool_limit_bytes_default = std::int64_t{1} << 30;

struct BufferPoolStats {
    std::int64_t limit_bytes = 0;      // current limit on retained bytes (0: retention off)
    std::int64_t retained_bytes = 0;   // idle bytes held now
    std::int64_t retained_blocks = 0;  // idle blocks held now
    std::int64_t reused_blocks = 0;    // allocations served from retained blocks, so far
    std::int64_t fresh_blocks = 0;     // pooled-size allocations that went to the system, so far
    std::int64_t kept_blocks = 0;      // freed blocks the pool retained, so far
    std::int64_t released_blocks = 0;  // blocks given back to the system (freed or evicted), so far
};

// Sets the retention limit in bytes (0 turns retention off; negative values
// count as 0). Retained blocks beyond the new limit are released at once,
// oldest first. The default is buffer_pool_limit_bytes_default, or 0 when
// built with AddressSanitizer.
void set_buffer_pool_limit(std::int64_t limit_bytes);

// A snapshot of the pool's counters (the "so far" ones never go down).
BufferPoolStats buffer_pool_stats();

// The allocator of pooled CPU buffers (kv::clone and kv::concat build their
// storages with it).
// It lives as long as the process; storages made with it stay ordinary CPU
// storages (a resize allocates the new buffer from the pool too).
c10::Allocator* buffer_pool_allocator();

}  // namespace kv
