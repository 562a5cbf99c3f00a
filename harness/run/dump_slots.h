// Where a run's dumps go: one directory per dump slot under the run's work
// directory (RunOptions::work_dir, or a temporary directory made on the
// first dump and removed with the run), and the damage a `corrupt`
// operation does to the files in a slot.
#pragma once

#include <cstdint>
#include <string>

namespace kvcheck {

class DumpSlots {
  public:
    explicit DumpSlots(std::string work_dir) : work_dir_(std::move(work_dir)) {}
    ~DumpSlots();
    DumpSlots(const DumpSlots&) = delete;
    DumpSlots& operator=(const DumpSlots&) = delete;

    // The directory of `slot` (not created: the engine's dump makes it).
    std::string dir(std::int64_t slot);

    // Flips one byte of the files in `slot`, taken in name order as one
    // stream, at `offset` modulo their total size; or truncates the file
    // that byte is in to end before it. False when the slot holds no bytes.
    bool corrupt(std::int64_t slot, std::int64_t offset, bool truncate);

  private:
    std::string work_dir_;
    bool own_work_dir_ = false;
};

}  // namespace kvcheck
