// gradex-config: prints the effective GRADEX_* configuration (value, source, range and help of
// every variable) as the library would read it from this environment, then whether the data plane
// is sealed and with which cipher. Exit status 2 when a variable is invalid, with the error on
// stderr.
#include <cstdio>
#include <cstring>

#include "base/config.h"
#include "base/error.h"
#include "comm/communicator.h"

int main(int argc, char** argv) {
  if (argc > 1) {
    bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    std::fprintf(help ? stdout : stderr,
                 "usage: gradex-config\nPrints every GRADEX_* variable with its effective value "
                 "and where it came from.\n");
    return help ? 0 : 2;
  }
  try {
    const auto config = gradex::config::Config::from_environment();
    std::printf("%s", config.describe().c_str());
    std::printf("%s", gradex::comm::describe_seal_setting(config).c_str());
    return 0;
  } catch (const gradex::Error& e) {
    std::fprintf(stderr, "gradex-config: %s\n", e.what());
    return 2;
  }
}
