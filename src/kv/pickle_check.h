// A structural check of a dump's pickle stream before torch's unpickler
// sees it. torch 1.13's unpickler trusts its input: an opcode that pops
// more than the stack holds crashes it, a string length makes it allocate
// that many bytes before reading them, and a storage is made of the size
// its persistent id claims over a record that may be shorter (a heap
// overflow on the next read). The fuzzers found all three (see
// corpus/regressions/dump_load/); the zip CRCs do not stop a crafted file.
//
// The check walks the opcodes kv::encode_dump's pickles use (protocol 2:
// strings, small ints, tuples, None/bools, the tensor-rebuild globals,
// persistent ids, memo puts and gets) with a stack of small items: every
// operand must lie inside the stream, every pop must find its items above
// the last mark, every memo get must name a put, tuples may nest at most 32
// deep (torch frees a value recursively: deeper nesting overflows the stack
// when a rejected value is dropped), only the globals a dump needs may be
// named, every persistent id must be ('storage', type, key,
// location, numel) with a record data/<key> of exactly numel elements, and
// the stream must end with STOP leaving one item.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kv {

// Empty when `pickle` passes; else what is wrong, with the byte offset.
// `storage_bytes`: the size of each storage record, by key ("0" for
// data/0, ...).
std::string pickle_problem(const std::string& pickle, const std::map<std::string, std::uint64_t>& storage_bytes);

}  // namespace kv
