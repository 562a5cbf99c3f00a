// The workload reaches the shapes of interest (Coverage::shapes) often
// enough: floors on how many of a fixed set of seeded traces meet each, so
// that a change of the generator cannot drift away from one unseen. The
// floors are about a third of what the generator gave when they were set.
#include "run_util.h"

#include <gtest/gtest.h>

#include <iostream>
#include <map>

namespace kvcheck::props {
namespace {

TEST(Workload, ReachesEveryShapeOfInterest) {
    constexpr std::uint64_t traces = 600;
    const Adapter& reference = *adapters::find_bundled("reference");
    WorkloadOptions workload;
    workload.capabilities = reference.make()->capabilities();
    Coverage total;
    for (std::uint64_t seed = 1; seed <= traces; ++seed) {
        // Nothing checked: the shapes come from the transitions alone.
        total.add(run_on(reference, trace_for_seed(seed, workload), PropertySet::none()).coverage);
    }
    const std::map<Shape, std::uint32_t> floors = {
        {Shape::re_add_after_delete, 20}, {Shape::same_content_twice, 2},   {Shape::metadata_item, 150},
        {Shape::release_borrowed, 4},     {Shape::release_owned, 6},        {Shape::copy_of_uninitialized, 15},
        {Shape::conversion_of_owned, 6},  {Shape::generation_from_owned, 18}, {Shape::merge, 70},
        {Shape::mixed_merge, 5},          {Shape::slot_64_tokens, 65},      {Shape::slot_256_tokens, 12},
        {Shape::other_geometry, 110},     {Shape::interrupted_dump, 95},    {Shape::corrupted_dump, 28},
        {Shape::failed_load, 110},        {Shape::returned_cache_reused, 25}, {Shape::extracted_memory, 80},
        {Shape::store_64_items, 6},
    };
    ASSERT_EQ(floors.size(), shape_count) << "every shape needs a floor";
    for (const auto& [shape, floor] : floors) {
        std::cout << "[ shape    ] " << shape_id(shape) << ": " << total.count_of(shape) << " in " << traces << " traces (floor "
                  << floor << ")\n";
        EXPECT_GE(total.count_of(shape), floor) << shape_id(shape) << ": " << shape_summary(shape);
    }
}

}  // namespace
}  // namespace kvcheck::props
