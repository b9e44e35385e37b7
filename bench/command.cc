#include "bench/command.h"

#include <algorithm>
#include <memory>

#include "base/error.h"

namespace gradex::bench {

namespace {

// Function-local so registration from other translation units' static initializers is safe.
std::vector<std::unique_ptr<Command>>& registry() {
  static std::vector<std::unique_ptr<Command>> commands;
  return commands;
}

}  // namespace

CommandRegistration::CommandRegistration(Command command) {
  if (find_command(command.name)) {
    throw InternalError("gradex-bench command '" + command.name + "' registered twice");
  }
  registry().push_back(std::make_unique<Command>(std::move(command)));
}

std::vector<const Command*> all_commands() {
  std::vector<const Command*> out;
  for (const auto& c : registry())
    out.push_back(c.get());
  std::sort(out.begin(), out.end(),
            [](const Command* a, const Command* b) { return a->name < b->name; });
  return out;
}

const Command* find_command(const std::string& name) {
  for (const auto& c : registry()) {
    if (c->name == name) return c.get();
  }
  return nullptr;
}

std::string command_help(const Command& command) {
  std::string out = "usage: gradex-bench " + command.name + " [flags]\n\n" + command.summary + "\n";
  if (!command.details.empty()) out += "\n" + command.details + "\n";
  std::vector<FlagSpec> flags = command.flags;
  flags.push_back({"help", "", "this text", true});
  out += "\nflags:\n" + describe_flags(flags);
  return out;
}

}  // namespace gradex::bench
