// The operation-sequence target: any input is a trace of the harness's own
// operations (choice bytes through the workload generator, or a text trace),
// run through the executor and every checker on the chosen adapter.
// See trace_target.h for the input forms, the environment and what a
// violation produces; the canary is this target run on a mutant.
#include "generators.h"
#include "trace_target.h"

// The adapter checked when KVCHECK_ADAPTER is not set: a build-time canary
// (fuzz_ops_canary) is this target built with a mutant here.
#ifndef KVCHECK_FUZZ_ADAPTER
#define KVCHECK_FUZZ_ADAPTER "reference"
#endif

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    kvcheck::fuzz::TraceTarget target;
    target.name = "ops";
    target.default_adapter = KVCHECK_FUZZ_ADAPTER;
    target.workload = kvcheck::fuzz::ops_workload();
    target.generate = kvcheck::fuzz::ops_trace;
    target.check = kvcheck::fuzz::execute_fresh;
    kvcheck::fuzz::init_target(argc, argv, std::move(target));
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return kvcheck::fuzz::run_input(data, size);
}
