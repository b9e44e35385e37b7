// gradex-config: prints the effective GRADEX_* configuration (value, source, range and help of
// every variable) as the library would read it from this environment, then whether the data plane
// is sealed and with which cipher. Exit status 2 when a variable is invalid, with the error on
// stderr.
#include <cstdio>
#include <cstring>

#include "base/config.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "comm/seal/seal.h"

namespace {

// "sealed data plane: ..." for the effective settings (ConfigError for GRADEX_SEAL=on without a
// secret, as at start-up).
std::string seal_line(const gradex::config::Config& config) {
  namespace seal = gradex::comm::seal;
  const gradex::comm::CommOptions o = gradex::comm::comm_options_from_config(config);
  const std::string given = config.get_string("GRADEX_SEAL");
  if (!gradex::comm::check_seal_setting(o))
    return "sealed data plane: off (GRADEX_SEAL=" + given +
           (o.job_secret.empty() ? ", no job secret" : ", with a job secret") +
           "): messages between ranks travel in clear\n";
  const bool aes = seal::cpu_has_aes();
  return "sealed data plane: on (GRADEX_SEAL=" + given +
         " with a job secret): " + seal::cipher_name(seal::pair_cipher(aes, aes)) +
         (aes ? " (this CPU has AES instructions; a connection to a rank without them uses "
                "ChaCha20-Poly1305)"
              : " (this CPU has no AES instructions)") +
         ", keys per connection from ephemeral X25519 bound to the job secret\n";
}

}  // namespace

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
    std::printf("%s", seal_line(config).c_str());
    return 0;
  } catch (const gradex::Error& e) {
    std::fprintf(stderr, "gradex-config: %s\n", e.what());
    return 2;
  }
}
