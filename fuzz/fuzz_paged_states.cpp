// The paged-state target: the paged checkers on pool states that an engine
// may report but no sound pool holds (issue 43, item 2). The engine is the
// paged reference whose paged_state() is bent, at each call, one way the
// input chooses: the pool cut short or grown, emptied, a table or a
// pending copy naming a block past the pool or below 1, block_tokens
// changed. A paged trace drawn from the rest of the input runs through the
// executor and every paged checker. Verdicts are not the point (the bent
// states fail properties, as they should); what must never happen is a
// read outside a state, which ASan and UBSan stop: each checker reads a
// state within that state's own bounds (checkers::block_in), never by the
// size of another.
//
// An input: its first plan_bytes bytes are the plan (one byte a call, used
// in turn; bent_pool.h), the rest the choices of the trace (ByteChooser).
#include "bent_pool.h"
#include "byte_chooser.h"
#include "kvcheck/executor.h"
#include "kvcheck/workload.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

constexpr std::size_t plan_bytes = 8;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    at::set_num_threads(1);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::size_t plan_size = std::min(size, plan_bytes);
    std::vector<std::uint8_t> plan(data, data + plan_size);
    using namespace kvcheck;
    auto engine = std::make_shared<fuzz::BentPool>(plan);
    WorkloadOptions options;
    options.capabilities = engine->capabilities();
    options.dump_kill = false;
    fuzz::ByteChooser choose(data + plan_size, size - plan_size);
    const Swarm swarm = random_swarm(choose, options);
    const Trace trace = generate_trace(choose, swarm, options);
    RunOptions run;
    run.fresh_engine = [plan] { return std::make_shared<fuzz::BentPool>(plan); };
    (void)execute(trace, *engine, run);
    return 0;
}
