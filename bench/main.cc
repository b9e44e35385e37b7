// gradex-bench: dispatches to the registered subcommands (command.h). Exit status: the command's,
// 2 for a usage error, 1 for any other error.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "base/error.h"
#include "bench/command.h"
#include "bench/launcher.h"

namespace {

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: gradex-bench COMMAND [flags]   (gradex-bench COMMAND --help for its flags)\n"
               "\ncommands:\n");
  for (const gradex::bench::Command* c : gradex::bench::all_commands()) {
    std::fprintf(out, "  %-12s %s\n", c->name.c_str(), c->summary.c_str());
  }
  std::fprintf(out,
               "\nRun as one process, a command spawns --ranks local ranks on 127.0.0.1. Under a "
               "launcher that sets\nRANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun) or "
               "OMPI_COMM_WORLD_* (mpirun) each process is one rank.\nOnly rank 0 prints; every "
               "command ends with a line 'RESULT key=value ...'.\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradex::bench;
  set_program_arguments(argc, argv);
  std::vector<std::string> words(argv + 1, argv + argc);
  if (words.empty()) {
    print_usage(stderr);
    return 2;
  }
  if (words[0] == "--help" || words[0] == "-h" || words[0] == "help") {
    if (words.size() > 1 && find_command(words[1])) {
      std::printf("%s", command_help(*find_command(words[1])).c_str());
    } else {
      print_usage(stdout);
    }
    return 0;
  }
  const Command* command = find_command(words[0]);
  if (!command) {
    std::fprintf(stderr, "gradex-bench: unknown command '%s'\n\n", words[0].c_str());
    print_usage(stderr);
    return 2;
  }
  std::vector<std::string> rest(words.begin() + 1, words.end());
  for (const std::string& w : rest) {
    if (w == "--help" || w == "-h") {
      std::printf("%s", command_help(*command).c_str());
      return 0;
    }
  }
  Args args;
  try {
    args = Args::parse(command->flags, rest);
  } catch (const gradex::Error& e) {
    std::fprintf(stderr, "gradex-bench %s: %s\n", command->name.c_str(), e.what());
    return 2;
  }
  try {
    return command->run(args);
  } catch (const gradex::InvalidArgument& e) {
    std::fprintf(stderr, "gradex-bench %s: %s\n", command->name.c_str(), e.what());
    return 2;
  } catch (const gradex::ConfigError& e) {
    std::fprintf(stderr, "gradex-bench %s: %s\n", command->name.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradex-bench %s: error: %s\n", command->name.c_str(), e.what());
    return 1;
  }
}
