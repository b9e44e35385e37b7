// gradex-config: prints the effective GRADEX_* configuration (value, source, range and help of
// every variable) as the library would read it from this environment. Exit status 2 when a
// variable is invalid, with the error on stderr.
#include <cstdio>
#include <cstring>

#include "base/config.h"
#include "base/error.h"

int main(int argc, char** argv) {
  if (argc > 1) {
    bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    std::fprintf(help ? stdout : stderr,
                 "usage: gradex-config\nPrints every GRADEX_* variable with its effective value "
                 "and where it came from.\n");
    return help ? 0 : 2;
  }
  try {
    std::printf("%s", gradex::config::Config::from_environment().describe().c_str());
    return 0;
  } catch (const gradex::Error& e) {
    std::fprintf(stderr, "gradex-config: %s\n", e.what());
    return 2;
  }
}
