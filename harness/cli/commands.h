// The kvcheck subcommands. Each returns the process exit code:
// 0 all properties hold, 1 a property fails, 2 usage or adapter load error,
// 128 + N interrupted by signal N. check-dump: 0 valid, 1 invalid, 2
// unreadable (of several files, the worst).
#pragma once

#include <string>
#include <vector>

namespace kvcheck::cli {

using Args = std::vector<std::string>;

int command_list(const Args& args);
int command_run(const Args& args);
int command_replay(const Args& args);
int command_shrink(const Args& args);
int command_help(const Args& args);
int command_version(const Args& args);
int command_check_dump(const Args& args);

}  // namespace kvcheck::cli
