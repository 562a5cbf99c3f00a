// A PROPOSED fix, not yet in src/: a structural check of a dump's pickle
// stream (data.pkl) before torch::jit::pickle_load sees it. The fuzzers
// found that torch 1.13's unpickler trusts the stream: an opcode that pops
// more than the stack holds crashes it (SEGV; corpus/regressions/dump_load/
// unpickler-tuple3-empty-stack.pt), a string length field makes it
// allocate that many bytes before reading them (2 GiB from an 8-byte
// pickle; unpickler-string-length-2gib.pt) or, for a memo index, that many
// memo slots (30 GiB; unpickler-memo-index-30gib.pt), and a storage is made of the
// size its persistent id claims over a record that may be shorter (a heap
// overflow on the next read; storage-record-shorter-than-tensor.pt).
// kv::decode_dump checks the zip and CRCs, which a crafted file passes.
//
// The check walks the opcodes kv::encode_dump's pickles use (protocol 2:
// strings, small ints, tuples, None/bools, the tensor-rebuild globals,
// persistent ids, memo puts and gets) with a small model of the stack:
// every operand must lie inside the stream, every pop must find its items
// above the last mark, every memo index must be below the stream's size and
// every memo get must name a put, only the globals a dump
// needs may be named, every persistent id must be ('storage', type, key,
// location, numel) with a record data/<key> of exactly numel elements, and
// the stream must end with STOP leaving one item. Anything else is rejected
// with a message, before torch allocates. In decode_dump, check_archive
// already walks the records and knows their sizes.
//
// fuzz_dump_load_deep runs it first when KVCHECK_FUZZ_PICKLE_PRECHECK=1,
// which both tests the check (does anything it accepts still crash torch?)
// and lets the fuzzer get past the two known crashes.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kvcheck::fuzz {

// Empty when `pickle` passes; else what is wrong, with the byte offset.
// `storage_bytes`: the size of each storage record, by key ("0" for
// data/0, ...).
std::string pickle_problem(const std::string& pickle, const std::map<std::string, std::uint64_t>& storage_bytes);

}  // namespace kvcheck::fuzz
