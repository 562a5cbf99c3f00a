// A PROPOSED fix, not yet in src/: a structural check of a dump's pickle
// stream (data.pkl) before torch::jit::pickle_load sees it. The fuzzers
// found that torch 1.13's unpickler trusts the stream: an opcode that pops
// more than the stack holds crashes it (SEGV; corpus/regressions/dump_load/
// unpickler-tuple3-empty-stack.pt), and a string length field makes it
// allocate that many bytes before reading them (2 GiB from an 8-byte
// pickle; unpickler-string-length-2gib.pt). kv::decode_dump checks the zip
// and CRCs, which a crafted file passes.
//
// The check walks the opcodes kv::encode_dump's pickles use (protocol 2:
// strings, small ints, tuples, None/bools, the tensor-rebuild globals,
// persistent ids, memo puts and gets) with a stack of item counts: every
// operand must lie inside the stream, every pop must find its items above
// the last mark, every memo get must name a put, only the globals a dump
// needs may be named, and the stream must end with STOP leaving one item.
// Anything else is rejected with a message, before torch allocates.
//
// fuzz_dump_load_deep runs it first when KVCHECK_FUZZ_PICKLE_PRECHECK=1,
// which both tests the check (does anything it accepts still crash torch?)
// and lets the fuzzer get past the two known crashes.
#pragma once

#include <string>

namespace kvcheck::fuzz {

// Empty when `pickle` passes; else what is wrong, with the byte offset.
std::string pickle_problem(const std::string& pickle);

}  // namespace kvcheck::fuzz
