// kvcheck: checks KV-cache ownership properties of engine adapters.
#include "main.h"

#include "commands.h"

#include <iostream>
#include <map>

namespace kvcheck::cli {

int main(int argc, char** argv, std::vector<Adapter> bundled) {
    set_bundled_adapters(std::move(bundled));
    const Args args(argv + 1, argv + argc);
    const std::map<std::string, int (*)(const Args&)> commands = {
        {"list", command_list}, {"run", command_run}, {"replay", command_replay},
        {"shrink", command_shrink}, {"help", command_help}, {"--help", command_help}, {"-h", command_help}};
    if (args.empty()) return command_help(args);
    const auto command = commands.find(args.front());
    if (command == commands.end()) {
        std::cerr << "kvcheck: unknown command '" << args.front() << "' (try: kvcheck --help)\n";
        return 2;
    }
    try {
        return command->second(Args(args.begin() + 1, args.end()));
    } catch (const UsageError& error) {
        std::cerr << "kvcheck: " << error.what() << "\n";
        return 2;
    }
}

}  // namespace kvcheck::cli
