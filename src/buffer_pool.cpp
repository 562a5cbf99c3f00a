#include "kv/buffer_pool.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <cassert>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>

#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVCHECK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVCHECK_ASAN 1
#endif
#endif

#if defined(KVCHECK_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace kv {
namespace {

constexpr std::size_t page_bytes = 4096;
// What libtorch's CPU allocator aligns to (c10::alloc_cpu).
constexpr std::size_t cpu_alignment_bytes = 64;

#if defined(KVCHECK_ASAN)
// Retention hides a use after free from ASan's quarantine once the block is
// handed out again: off unless a test asks for it.
constexpr std::int64_t limit_bytes_initial = 0;
#else
constexpr std::int64_t limit_bytes_initial = buffer_pool_limit_bytes_default;
#endif

// Under ASan, bytes no tensor may touch (a retained block, the tail of a
// block past the bytes asked for) are poisoned. No-ops otherwise.
void poison(void* data, std::size_t bytes) {
#if defined(KVCHECK_ASAN)
    ASAN_POISON_MEMORY_REGION(data, bytes);
#else
    (void)data;
    (void)bytes;
#endif
}

void unpoison(void* data, std::size_t bytes) {
#if defined(KVCHECK_ASAN)
    ASAN_UNPOISON_MEMORY_REGION(data, bytes);
#else
    (void)data;
    (void)bytes;
#endif
}

// A block is a whole number of pages, so that slightly different requests
// can share blocks.
std::size_t block_bytes_for(std::size_t bytes) { return (bytes + page_bytes - 1) / page_bytes * page_bytes; }

// A retained block serves a request of `want` bytes when at most an eighth
// of the block goes unused.
bool fits(std::size_t block_bytes, std::size_t want) {
    return block_bytes >= want && block_bytes - want <= block_bytes / 8;
}

// A block of memory from the system, with the links it has while the pool
// retains it. It lives from system_allocate to system_release, through any
// number of tensors (it is their DataPtr's context): handing a block out or
// taking it back allocates nothing.
struct Block {
    void* data = nullptr;
    std::size_t bytes = 0;
    // The list of retained blocks by age: oldest first, for eviction.
    Block* older = nullptr;
    Block* newer = nullptr;
    // The list of retained blocks of this size: newest first, so that the
    // block freed last, the likeliest still to be in cache, is taken first.
    Block* newer_of_size = nullptr;
    Block* older_of_size = nullptr;
};

// Fresh memory from glibc (which maps large blocks anew), aligned as
// libtorch's CPU allocator aligns. A large block is asked to be backed by
// transparent huge pages before its first touch: 512 times fewer page
// faults. Only advice: it changes no byte, and is ignored where huge pages
// are off. The 4 KiB pages at the ends of the mapping stay small: aligning
// the block to 2 MiB, so that all of it is huge, makes a fresh copy slower
// (a 2 MiB page is zeroed in full before the copy reaches it, a 4 KiB one
// just before; BENCHMARKS.md has the figures).
Block* system_allocate(std::size_t bytes) {
    auto block = std::make_unique<Block>();
    if (::posix_memalign(&block->data, cpu_alignment_bytes, bytes) != 0) throw std::bad_alloc();
    block->bytes = bytes;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (bytes >= huge_page_block_bytes_min) {
        const auto begin = (reinterpret_cast<std::uintptr_t>(block->data) + page_bytes - 1) & ~(page_bytes - 1);
        const auto end = (reinterpret_cast<std::uintptr_t>(block->data) + bytes) & ~(page_bytes - 1);
        if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    }
#endif
    return block.release();
}

void system_release(Block* block) noexcept {
    unpoison(block->data, block->bytes);
    std::free(block->data);
    delete block;
}

class Pool {
  public:
    // A block of at least `bytes` (block_bytes_for), retained if one fits,
    // else fresh. Only the first `bytes` are addressable under ASan.
    Block* take(std::size_t bytes);
    // The block of a freed storage: retained (the oldest retained blocks
    // make room for it) or, beyond the limit, given back to the system.
    void give_back(Block* block) noexcept;
    void set_limit(std::int64_t limit_bytes);
    BufferPoolStats stats();

  private:
    Block* take_retained_locked(std::size_t want);
    bool retain_locked(Block* block) noexcept;
    void unlink_locked(Block* block) noexcept;
    void release_beyond_limit() noexcept;

    std::mutex mutex_;
    std::int64_t limit_bytes_ = limit_bytes_initial;
    std::int64_t retained_bytes_ = 0;
    std::int64_t retained_blocks_ = 0;
    Block* oldest_ = nullptr;
    Block* newest_ = nullptr;
    // The newest retained block of each size that has one.
    std::map<std::size_t, Block*> newest_of_size_;
    std::int64_t reused_blocks_ = 0;
    std::int64_t fresh_blocks_ = 0;
    std::int64_t kept_blocks_ = 0;
    std::int64_t released_blocks_ = 0;
};

void Pool::unlink_locked(Block* block) noexcept {
    (block->older ? block->older->newer : oldest_) = block->newer;
    (block->newer ? block->newer->older : newest_) = block->older;
    if (block->newer_of_size) {
        block->newer_of_size->older_of_size = block->older_of_size;
    } else {
        const auto head = newest_of_size_.find(block->bytes);
        assert(head != newest_of_size_.end());
        assert(head->second == block);
        if (block->older_of_size) {
            head->second = block->older_of_size;
        } else {
            newest_of_size_.erase(head);
        }
    }
    if (block->older_of_size) block->older_of_size->newer_of_size = block->newer_of_size;
    block->older = block->newer = block->newer_of_size = block->older_of_size = nullptr;
    retained_bytes_ -= static_cast<std::int64_t>(block->bytes);
    retained_blocks_ -= 1;
    assert(retained_bytes_ >= 0);
    assert(retained_blocks_ >= 0);
}

Block* Pool::take_retained_locked(std::size_t want) {
    const auto found = newest_of_size_.lower_bound(want);
    if (found == newest_of_size_.end() || !fits(found->first, want)) return nullptr;
    Block* block = found->second;
    unlink_locked(block);
    return block;
}

Block* Pool::take(std::size_t bytes) {
    assert(bytes >= buffer_pool_block_bytes_min);
    const std::size_t want = block_bytes_for(bytes);
    Block* block = nullptr;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        block = take_retained_locked(want);
        ++(block ? reused_blocks_ : fresh_blocks_);
    }
    if (!block) block = system_allocate(want);
    unpoison(block->data, bytes);
    poison(static_cast<char*>(block->data) + bytes, block->bytes - bytes);
    return block;
}

bool Pool::retain_locked(Block* block) noexcept {
    if (static_cast<std::int64_t>(block->bytes) > limit_bytes_) return false;
    std::map<std::size_t, Block*>::iterator head;
    try {
        head = newest_of_size_.try_emplace(block->bytes, nullptr).first;
    } catch (const std::bad_alloc&) {
        return false;
    }
    block->older_of_size = head->second;
    if (head->second) head->second->newer_of_size = block;
    head->second = block;
    block->older = newest_;
    (newest_ ? newest_->newer : oldest_) = block;
    newest_ = block;
    retained_bytes_ += static_cast<std::int64_t>(block->bytes);
    retained_blocks_ += 1;
    kept_blocks_ += 1;
    return true;
}

// One block at a time, each freed outside the lock (giving 32 MiB back to
// the kernel takes a while), with no allocation: this runs in deleters.
void Pool::release_beyond_limit() noexcept {
    for (;;) {
        Block* oldest = nullptr;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (retained_bytes_ <= limit_bytes_ || !oldest_) return;
            oldest = oldest_;
            unlink_locked(oldest);
            released_blocks_ += 1;
        }
        system_release(oldest);
    }
}

void Pool::give_back(Block* block) noexcept {
    // Poisoned before another thread can take it (taking unpoisons).
    poison(block->data, block->bytes);
    bool kept = false;
    bool over_limit = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        kept = retain_locked(block);
        if (!kept) released_blocks_ += 1;
        over_limit = retained_bytes_ > limit_bytes_;
    }
    if (!kept) system_release(block);
    // The lock is taken again only when there is something to release (a
    // clone frees a block per slot). Whoever takes the pool over its limit,
    // a give_back or set_limit, sees it so under the lock and releases.
    if (over_limit) release_beyond_limit();
}

void Pool::set_limit(std::int64_t limit_bytes) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        limit_bytes_ = limit_bytes < 0 ? 0 : limit_bytes;
    }
    release_beyond_limit();
}

BufferPoolStats Pool::stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    BufferPoolStats stats;
    stats.limit_bytes = limit_bytes_;
    stats.retained_bytes = retained_bytes_;
    stats.retained_blocks = retained_blocks_;
    stats.reused_blocks = reused_blocks_;
    stats.fresh_blocks = fresh_blocks_;
    stats.kept_blocks = kept_blocks_;
    stats.released_blocks = released_blocks_;
    return stats;
}

// Never destroyed: storages freed during static destruction still give
// their blocks back to it.
Pool& pool() {
    static Pool* const instance = new Pool;
    return *instance;
}

// The deleter of a pooled DataPtr; its context is the Block.
void give_back_block(void* context) { pool().give_back(static_cast<Block*>(context)); }

// c10::Allocator changed in torch 2: allocate is no longer const, and
// copy_data (what Allocator::clone uses) is pure. The same pool serves both:
// the wheel's kvcheck builds against the torch 2 that the pip package ships.
#if TORCH_VERSION_MAJOR >= 2
#define KV_ALLOCATE_CONST
#else
#define KV_ALLOCATE_CONST const
#endif

class PoolAllocator final : public c10::Allocator {
  public:
    c10::DataPtr allocate(std::size_t bytes) KV_ALLOCATE_CONST override {
        if (bytes < buffer_pool_block_bytes_min) return c10::GetCPUAllocator()->allocate(bytes);
        Block* block = pool().take(bytes);
        return {block->data, block, &give_back_block, c10::Device(c10::DeviceType::CPU)};
    }
#if TORCH_VERSION_MAJOR >= 2
    void copy_data(void* dest, const void* source, std::size_t count) const override {
        default_copy_data(dest, source, count);
    }
#endif
};

#undef KV_ALLOCATE_CONST

}  // namespace

void set_buffer_pool_limit(std::int64_t limit_bytes) { pool().set_limit(limit_bytes); }

BufferPoolStats buffer_pool_stats() { return pool().stats(); }

c10::Allocator* buffer_pool_allocator() {
    static PoolAllocator* const allocator = new PoolAllocator;
    return allocator;
}

}  // namespace kv
