#include "byte_chooser.h"

#include <cassert>

namespace kvcheck::fuzz {
namespace {

// FNV-1a over the whole input: the seed of the tail stream (SeededChooser
// mixes it further).
std::uint64_t seed_of(const std::uint8_t* data, std::size_t size) {
    std::uint64_t hash = 0xCBF29CE484222325ull;
    for (std::size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 0x100000001B3ull;
    return hash;
}

}  // namespace

std::size_t bytes_for(std::uint64_t n) {
    std::size_t bytes = 0;
    for (std::uint64_t range = n <= 1 ? 0 : n - 1; range != 0; range >>= 8) ++bytes;
    return bytes;
}

ByteChooser::ByteChooser(const std::uint8_t* data, std::size_t size)
    : data_(data), size_(size), tail_(seed_of(data, size)) {}

std::uint64_t ByteChooser::below(std::uint64_t n) {
    assert(n >= 1);
    if (n <= 1) return 0;
    const std::size_t count = bytes_for(n);
    if (size_ - offset_ < count) {
        offset_ = size_;
        ++tail_choices_;
        return tail_.below(n);
    }
    std::uint64_t value = 0;
    for (std::size_t i = count; i > 0; --i) value = (value << 8) | data_[offset_++];
    return value % n;
}

std::uint64_t ChoiceRecorder::below(std::uint64_t n) {
    const std::uint64_t value = source_.below(n);
    assert(value < n || n <= 1);
    const std::size_t count = bytes_for(n);
    for (std::size_t i = count; i > 0; --i) bytes_.push_back(static_cast<std::uint8_t>(value >> (8 * (i - 1))));
    return value;
}

}  // namespace kvcheck::fuzz
