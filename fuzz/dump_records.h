// The record form of a dump, for the deep dump-loader target: a dump file is
// a zip of records ("data.pkl", the pickle, and "data/0", "data/1", ...,
// the tensor storages), each with a CRC-32 and sizes that kv::decode_dump
// checks before torch sees a byte. A fuzzer mutating the zip itself almost
// never gets past those checks; mutating the records and re-packing them
// with torch's own writer (valid sizes, offsets and CRCs every time) reaches
// the unpickler and the loader's field checks.
//
// Record form: the records' bytes, in order (data.pkl first, then data/0,
// data/1, ...), separated by record_separator. Any byte string is a valid
// record form (no separator: just a pickle).
//
//   std::vector<char> dump = pack_records(split_records(input));
//   std::string text = join_records(unpack_records(dump));  // the inverse, for seeds
#pragma once

#include <string>
#include <vector>

namespace kvcheck::fuzz {

inline constexpr const char* record_separator = "\n--kvcheck-record--\n";

std::vector<std::string> split_records(const std::string& input);
std::string join_records(const std::vector<std::string>& records);

// A torch pickle archive (as torch::jit::pickle_save writes it) holding the
// records: the first as data.pkl, the others as data/0, data/1, ...
std::vector<char> pack_records(const std::vector<std::string>& records);

// The records of an archive pack_records or pickle_save wrote, in the same
// order. Throws std::exception on an unreadable archive.
std::vector<std::string> unpack_records(const std::vector<char>& archive);

}  // namespace kvcheck::fuzz
