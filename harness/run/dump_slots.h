// Where a run's dumps go: one directory per dump slot under the run's work
// directory (RunOptions::work_dir, or a temporary directory made on the
// first dump and removed with the run), and the damage a `corrupt`
// operation does to the files in a slot.
#pragma once

#include <cstdint>
#include <optional>
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

    // Flips one byte of the files in `slot` (taken in name order): of the
    // byte classes the files hold (kvcheck/dump_bytes.h: header, metadata,
    // tensor data, or a file of no format kvcheck reads), class
    // `offset` mod their count, then byte `offset` / count mod the class's
    // size, its ranges taken in file order. Truncating: the file holding
    // byte `offset` mod the files' total size is cut to end before it.
    // What was done, naming the file and the real byte offset in it
    // ("byte 2155 of x.pt flipped (of 3293 bytes; tensor data: record
    // archive/data/3, its byte 12)"); nullopt when the slot holds no bytes.
    std::optional<std::string> corrupt(std::int64_t slot, std::int64_t offset, bool truncate);

  private:
    std::string work_dir_;
    bool own_work_dir_ = false;
};

}  // namespace kvcheck
