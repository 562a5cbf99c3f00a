// The power-cut model: from the directory before a dump, the shim's record
// of the dump's calls and the directory after the dump ended (or was
// killed), the directory states a power cut at that moment could leave.
// The rules are in dumpshim.h and docs/durability.md; in short: file data
// is durable once fsynced, a name once its directory is fsynced, and name
// changes not yet durable survive as a prefix of the order they were made.
//
// Constructed: for each prefix of the pending name changes (none, ..., all;
// at most prefixes_max of them, evenly spaced, always none and all), each
// of three data outcomes for every file (unflushed data kept, lost, or only
// the size kept with zeros for the unflushed bytes). States equal to an
// earlier one are dropped.
//
//   PowerCutModel model = power_cut_states(read_image(dir), events, after);
//   if (!model.unfollowed.empty()) ...;   // the record cannot explain `after`
//   for (const CrashState& s : model.states) write_image(scratch, s.image);
#pragma once

#include "durability/dir_image.h"
#include "durability/shim_log.h"

#include <cstddef>
#include <string>
#include <vector>

namespace kvcheck::durability {

struct CrashState {
    std::string description;  // "a power cut: 1 of 2 pending name changes kept (create ...); unflushed data lost"
    DirImage image;
};

struct PowerCutModel {
    std::vector<CrashState> states;
    // Why the record cannot explain the directory after the dump (a call the
    // shim does not see or the model does not follow); empty when it can.
    // With it, `states` may be wrong, and nothing may be concluded from them.
    std::string unfollowed;
    std::vector<std::string> created;  // names the dump created (files and directories), in order
    std::size_t pending = 0;           // name changes not durable at the end
};

struct PowerCutOptions {
    std::size_t prefixes_max = 8;  // prefixes of the pending name changes tried
};

PowerCutModel power_cut_states(const DirImage& before, const std::vector<ShimEvent>& events, const DirImage& after,
                               const PowerCutOptions& options = {});

}  // namespace kvcheck::durability
