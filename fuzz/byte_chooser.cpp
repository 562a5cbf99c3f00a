#include "byte_chooser.h"

#include <cassert>

namespace kvcheck::fuzz {

std::size_t bytes_for(std::uint64_t n) {
    std::size_t bytes = 0;
    for (std::uint64_t range = n <= 1 ? 0 : n - 1; range != 0; range >>= 8) ++bytes;
    return bytes;
}

std::uint64_t ByteChooser::below(std::uint64_t n) {
    assert(n >= 1);
    std::uint64_t value = 0;
    for (std::size_t i = bytes_for(n); i > 0 && offset_ < size_; --i) value = (value << 8) | data_[offset_++];
    return n <= 1 ? 0 : value % n;
}

std::uint64_t ChoiceRecorder::below(std::uint64_t n) {
    const std::uint64_t value = source_.below(n);
    assert(value < n || n <= 1);
    const std::size_t count = bytes_for(n);
    for (std::size_t i = count; i > 0; --i) bytes_.push_back(static_cast<std::uint8_t>(value >> (8 * (i - 1))));
    return value;
}

}  // namespace kvcheck::fuzz
