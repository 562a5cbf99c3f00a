// kvcheck: checks KV-cache ownership properties of engine adapters.
#include "main.h"

#include "commands.h"
#include "output.h"
#include "sandbox.h"
#include "text.h"

#include <exception>
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
    if (command == commands.end()) {
        std::cerr << "kvcheck: unknown command '" << printable(args.front(), 80) << "' (try: kvcheck --help)\n";
        return 2;
    }
    try {
        const int status = command->second(Args(args.begin() + 1, args.end()));
        // What a command printed on standard output must have gone through
        // (a report on a full disk is lost): exit 2 when not, unless
        // interrupted (128 + N says more).
        return standard_output_written() || status > 2 ? status : 2;
    } catch (const UsageError& error) {
        std::cerr << "kvcheck: " << error.what() << "\n";
        return 2;
    } catch (const std::exception& error) {
        // What kvcheck itself could not do (a pipe, a fork, a directory):
        // said as an error, not an abort.
        std::cerr << "kvcheck: error: " << printable(error.what(), 2000) << "\n";
        return 2;
    }
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
