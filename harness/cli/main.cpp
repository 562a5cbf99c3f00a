// kvcheck: checks KV-cache ownership properties of engine adapters.
#include "main.h"

#include "command_line.h"
#include "commands.h"
#include "sandbox.h"

#include <iostream>
#include <map>

#include <sys/prctl.h>

namespace kvcheck::cli {

namespace {

int run_command(int argc, char** argv, std::vector<Adapter> bundled) {
    set_bundled_adapters(std::move(bundled));
    const Args args(argv + 1, argv + argc);
    const std::map<std::string, int (*)(const Args&)> commands = {
        {"list", command_list},   {"run", command_run},   {"replay", command_replay},
        {"shrink", command_shrink}, {"check-dump", command_check_dump}, {"help", command_help},
        {"--help", command_help}, {"-h", command_help}, {"--version", command_version}, {"version", command_version}};
    if (args.empty()) return command_help(args);
    const auto command = commands.find(args.front());
    if (command == commands.end()) return refuse_unknown_command(args.front());
    return command_status([&] { return command->second(Args(args.begin() + 1, args.end())); });
}

}  // namespace

int main(int argc, char** argv, std::vector<Adapter> bundled) {
    // Every process an adapter starts stays below kvcheck, even one that
    // leaves its parent and session (setsid): kvcheck is its subreaper, and
    // ends it before it exits itself.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    const int status = run_command(argc, argv, std::move(bundled));
    end_descendants();
    return status;
}

}  // namespace kvcheck::cli
