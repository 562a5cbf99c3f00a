#include "test_util.h"

#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>

#include <filesystem>
#include <unistd.h>
#include <random>
#include <vector>

namespace kvtest {

at::Tensor kv_tensor(std::int64_t seq, std::uint64_t seed, at::ScalarType dtype,
                     std::int64_t heads, std::int64_t head_dim) {
    std::mt19937_64 random(seed);
    std::vector<float> values(static_cast<std::size_t>(heads * seq * head_dim));
    for (float& v : values) v = static_cast<float>(static_cast<int>(random() % 64) - 32) / 8.0f;
    return at::tensor(values).reshape({1, heads, seq, head_dim}).to(dtype);
}

kv::CachePtr make_cache(kv::Layout layout, std::int64_t layers, std::int64_t seq,
                        std::uint64_t seed, at::ScalarType dtype) {
    auto cache = kv::Cache::make(layout);
    for (std::int64_t i = 0; i < layers; ++i) {
        const std::uint64_t layer_seed = seed * 1000 + static_cast<std::uint64_t>(i) * 2;
        cache->update(kv_tensor(seq, layer_seed, dtype), kv_tensor(seq, layer_seed + 1, dtype), i);
    }
    return cache;
}

namespace {

bool same_tensor(const at::Tensor& a, const at::Tensor& b, const std::string& where,
                 std::string* why) {
    auto differ = [&](const std::string& what) {
        if (why) *why = where + ": " + what;
        return false;
    };
    if (a.defined() != b.defined()) return differ("present in one cache only");
    if (!a.defined()) return true;
    if (a.scalar_type() != b.scalar_type()) return differ("dtype differs");
    if (a.sizes() != b.sizes()) return differ("shape differs");
    if (!at::equal(a, b)) return differ("content differs");
    return true;
}

}  // namespace

bool same_cache(const kv::Cache& a, const kv::Cache& b, std::string* why) {
    auto differ = [why](const std::string& what) {
        if (why) *why = what;
        return false;
    };
    if (a.layout() != b.layout()) return differ("layout differs");
    if (a.layer_count() != b.layer_count()) return differ("layer count differs");
    for (std::int64_t i = 0; i < a.layer_count(); ++i) {
        const std::string at_layer = "layer " + std::to_string(i);
        if (a.layout() == kv::Layout::legacy) {
            if (!same_tensor((*a.key_cache())[i], (*b.key_cache())[i], at_layer + " key_cache", why) ||
                !same_tensor((*a.value_cache())[i], (*b.value_cache())[i], at_layer + " value_cache", why)) {
                return false;
            }
            continue;
        }
        const kv::Layer& x = *(*a.layers())[i];
        const kv::Layer& y = *(*b.layers())[i];
        if (x.is_initialized != y.is_initialized) return differ(at_layer + " is_initialized differs");
        if (!same_tensor(x.keys, y.keys, at_layer + " keys", why) ||
            !same_tensor(x.values, y.values, at_layer + " values", why) ||
            !same_tensor(x.key_cache, y.key_cache, at_layer + " key_cache", why) ||
            !same_tensor(x.value_cache, y.value_cache, at_layer + " value_cache", why)) {
            return false;
        }
    }
    return true;
}

namespace {

// The directories fresh_dir made, removed when the test binary exits
// normally (forked children leave with _exit and remove nothing): a test
// run leaves nothing in the temp dir.
class MadeDirs {
  public:
    ~MadeDirs() {
        if (::getpid() != owner_) return;
        std::error_code ignored;
        for (const auto& dir : dirs_) std::filesystem::remove_all(dir, ignored);
    }
    void add(const std::filesystem::path& dir) { dirs_.push_back(dir); }

  private:
    pid_t owner_ = ::getpid();
    std::vector<std::filesystem::path> dirs_;
};

}  // namespace

std::string fresh_dir(const std::string& tag) {
    static int counter = 0;
    static MadeDirs made;
    const auto dir = std::filesystem::temp_directory_path() /
                     ("kvcheck-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    made.add(dir);
    return dir.string();
}

}  // namespace kvtest
