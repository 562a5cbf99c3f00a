// The paged reference adapter: the reference (a full contiguous engine,
// reference_engine.h) that is also a paged block manager (kvcheck/paged.h)
// over kv::paged::Pool (src/kv/paged_pool.h) and the attention decoder of
// models/: 8 blocks (the null block included) of 2 tokens, 2 layers, 2
// heads of 4, so that short traces fill the pool, evict and reuse.
//
// Sequences are named "s<N>" in the pool; a salt of N > 0 is the extra key
// "salt-N", which the decoder mixes into the sequence's K/V. The paged mutants (adapters/mutants/) hand it a Pool subclass
// with one bug planted.
//
//   kvcheck::adapters::PagedReference engine;
//   engine.paged_alloc(1, {1, 2, 3}, 0);
#pragma once

#include "kv/paged_pool.h"
#include "kvcheck/paged.h"
#include "reference/reference_engine.h"

#include <functional>
#include <memory>

namespace kvcheck::adapters {

class PagedReference : public ReferenceEngine, public PagedEngine {
  public:
    using PoolFactory = std::function<std::unique_ptr<kv::paged::Pool>(kv::paged::PoolConfig, kv::Model&)>;
    static kv::paged::PoolConfig default_config() { return {8, 2, 2, 2, 4}; }
    // The default pool over a model of attention window 3 (2 blocks of 2
    // tokens: a sequence of 4 tokens or more gives blocks back at each step):
    // the bundled paged-reference-window.
    static kv::paged::PoolConfig window_config() {
        kv::paged::PoolConfig config = default_config();
        config.window = 3;
        return config;
    }

    explicit PagedReference(PoolFactory make_pool = nullptr, kv::paged::PoolConfig config = default_config());
    ~PagedReference() override;

    Capabilities capabilities() const override;
    PagedEngine* paged() override { return this; }

    std::int64_t paged_alloc(std::int64_t seq, const PagedTokens& tokens, std::int64_t salt) override;
    PagedTokens paged_append(std::int64_t seq, std::int64_t count) override;
    void paged_fork(std::int64_t parent, std::int64_t child) override;
    void paged_free(std::int64_t seq) override;
    std::int64_t paged_lookup(const PagedTokens& tokens, std::int64_t salt) override;
    void paged_evict() override;
    void paged_reset() override;
    void paged_step() override;
    void paged_import(std::int64_t seq, const CacheContent& content) override;
    PagedExported paged_export(std::int64_t seq) override;
    void paged_rewind(std::int64_t seq, std::int64_t count, std::int64_t token) override;

    PagedState paged_state() override;
    CacheView paged_block_view(std::int64_t block, std::int64_t slots) override;
    CacheView paged_sequence_view(std::int64_t seq) override;
    CacheView paged_fresh_view(const PagedTokens& tokens, std::int64_t salt, std::int64_t first, std::int64_t count) override;
    std::vector<std::uint64_t> paged_pool_storage() override;
    std::optional<PagedTokens> paged_decode_exported(std::int64_t seq, std::int64_t count) override;

    // Whether paged_state reads blocks' K/V from the pool's rows (the
    // default, for kv::paged::Pool itself) or through a tensor per block
    // (block_kv, as a subclass is always read): the slow reading is kept to
    // test the fast one against (tests/paged_readings_test.cpp).
    void read_rows(bool rows) { read_rows_ = rows; }

  protected:
    kv::paged::Pool& pool() { return *pool_; }

  private:
    kv::models::Decoder paged_model_;
    std::unique_ptr<kv::paged::Pool> pool_;
    class RowDigests;  // the blocks' digests read from the pool's rows, remembered
    std::unique_ptr<RowDigests> row_digests_;
    bool read_rows_ = true;
};

}  // namespace kvcheck::adapters
