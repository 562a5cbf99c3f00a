// The fuzz targets' byte decoder (fuzz/byte_chooser.h): recorded choice
// bytes decode to the trace they were recorded from, the bytes of an input
// fix its first choices, and an input too short for its trace goes on with
// a stream seeded by the input (the same input always gives the same trace,
// different short inputs give different full traces, not a run of zeros).
#include "byte_chooser.h"

#include "kvcheck/trace.h"
#include "kvcheck/workload.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace {

using kvcheck::Trace;
using kvcheck::fuzz::ByteChooser;
using kvcheck::fuzz::ChoiceRecorder;

Trace decode(const std::vector<std::uint8_t>& bytes, std::size_t* tail_choices = nullptr) {
    const kvcheck::WorkloadOptions options;
    ByteChooser choose(bytes.data(), bytes.size());
    const kvcheck::Swarm swarm = kvcheck::random_swarm(choose, options);
    Trace trace = kvcheck::generate_trace(choose, swarm, options);
    if (tail_choices != nullptr) *tail_choices = choose.tail_choices();
    return trace;
}

TEST(ByteChooser, RecordedBytesDecodeToTheRecordedTraceWithoutTheTail) {
    const kvcheck::WorkloadOptions options;
    for (std::uint64_t seed = 1; seed <= 50; ++seed) {
        kvcheck::SeededChooser seeded(seed);
        ChoiceRecorder recorder(seeded);
        const kvcheck::Swarm swarm = kvcheck::random_swarm(recorder, options);
        const Trace recorded = kvcheck::generate_trace(recorder, swarm, options);
        std::size_t tail_choices = 99;
        EXPECT_EQ(decode(recorder.bytes(), &tail_choices), recorded) << "seed " << seed;
        EXPECT_EQ(tail_choices, 0u) << "seed " << seed;
    }
}

TEST(ByteChooser, ReadsJustEnoughBytesBigEndianModuloN) {
    const std::vector<std::uint8_t> bytes{7, 0x01, 0x02, 200};
    ByteChooser choose(bytes.data(), bytes.size());
    EXPECT_EQ(choose.below(1), 0u);  // one value: no byte read
    EXPECT_EQ(choose.bytes_used(), 0u);
    EXPECT_EQ(choose.below(5), 2u);  // 7 % 5
    EXPECT_EQ(choose.below(1000), 258u % 1000u);  // 0x0102, two bytes
    EXPECT_EQ(choose.bytes_used(), 3u);
    EXPECT_EQ(choose.below(256), 200u);
    EXPECT_EQ(choose.tail_choices(), 0u);
}

TEST(ByteChooser, AChoiceThatNeedsMoreBytesThanAreLeftComesFromTheTail) {
    const std::vector<std::uint8_t> bytes{9, 1};
    ByteChooser choose(bytes.data(), bytes.size());
    EXPECT_EQ(choose.below(10), 9u);
    const std::uint64_t value = choose.below(70000);  // needs three bytes, one is left
    EXPECT_LT(value, 70000u);
    EXPECT_EQ(choose.bytes_used(), bytes.size());
    EXPECT_EQ(choose.tail_choices(), 1u);
    // The same input gives the same tail.
    ByteChooser again(bytes.data(), bytes.size());
    again.below(10);
    EXPECT_EQ(again.below(70000), value);
}

TEST(ByteChooser, ShortInputsStandForFullRandomTracesSeededByTheirBytes) {
    std::set<std::string> traces;
    std::set<std::size_t> lengths;
    for (int byte = 0; byte < 256; ++byte) {
        const std::vector<std::uint8_t> input{static_cast<std::uint8_t>(byte)};
        std::size_t tail_choices = 0;
        const Trace trace = decode(input, &tail_choices);
        EXPECT_GT(tail_choices, 0u);
        EXPECT_EQ(decode(input), trace) << "byte " << byte << " decodes to two traces";
        traces.insert(kvcheck::format_trace(trace));
        lengths.insert(trace.size());
    }
    // With zeros after the last byte, every one-byte input made a trace of
    // one add; seeded tails make 256 traces of every length.
    EXPECT_GE(traces.size(), 250u);
    EXPECT_GE(lengths.size(), 15u);
    EXPECT_NE(decode({}), Trace{});
}

}  // namespace
