// SHA-1 of a byte string, as hex: libFuzzer names an artifact after the
// SHA-1 of the input (crash-<sha1>), so the shrunk trace a target writes
// can sit right next to it (crash-<sha1>.trace). Not for security.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvcheck::fuzz {

std::string sha1_hex(const std::uint8_t* data, std::size_t size);

}  // namespace kvcheck::fuzz
