// The subcommands of gradex-bench. Each command lives in its own file and registers itself with a
// static CommandRegistration (name, one-line summary, flags, run function), so main.cc never lists
// them and adding a benchmark touches one new file.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench/args.h"

namespace gradex::bench {

struct Command {
  std::string name;
  std::string summary;  // one line for the command list
  std::string details;  // a paragraph for "gradex-bench CMD --help"
  std::vector<FlagSpec> flags;
  // Returns the process exit status. Errors may also be thrown (gradex::Error): main prints them.
  std::function<int(const Args&)> run;
};

// Every registered command, sorted by name.
std::vector<const Command*> all_commands();
// The command called `name`, or nullptr.
const Command* find_command(const std::string& name);

struct CommandRegistration {
  explicit CommandRegistration(Command command);
};

// "usage: gradex-bench CMD [flags]" plus details and the flag list.
std::string command_help(const Command& command);

}  // namespace gradex::bench
