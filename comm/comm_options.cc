// comm_options_from_config: CommOptions from the GRADEX_* registry.
#include <atomic>
#include <cmath>

#include "base/config.h"
#include "base/log.h"
#include "comm/communicator.h"
#include "comm/rendezvous/auth.h"
#include "comm/seal/seal.h"

namespace gradex::comm {

bool check_seal_setting(const CommOptions& options) {
  if (options.seal == CommOptions::Seal::kOn && options.job_secret.empty())
    throw ConfigError(
        "GRADEX_SEAL=on needs a job secret, and neither GRADEX_JOB_SECRET nor "
        "GRADEX_JOB_SECRET_FILE is set: every connection's keys are bound to the secret "
        "(docs/security.md)");
  if (options.seal == CommOptions::Seal::kOff && !options.job_secret.empty()) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      GX_LOG(kWarn) << "GRADEX_SEAL=off with a job secret: peers prove the secret, but gradients, "
                       "parameters and control messages travel in clear and unauthenticated";
    }
  }
  return options.seal != CommOptions::Seal::kOff && !options.job_secret.empty();
}

CommOptions comm_options_from_config(const config::Config& config) {
  CommOptions o;
  o.timeout =
      Millis(static_cast<int64_t>(std::llround(config.get_float("GRADEX_TIMEOUT_S") * 1000)));
  if (o.timeout.count() < 1) o.timeout = Millis(1);
  o.iface = config.get_string("GRADEX_IFACE");
  o.ring_chunk_bytes = static_cast<size_t>(config.get_int("GRADEX_RING_CHUNK_KB")) << 10;
  o.allgather_inline_bytes = static_cast<size_t>(config.get_int("GRADEX_ALLGATHER_INLINE_KB"))
                             << 10;
  o.shared_memory = config.get_bool("GRADEX_SHM");
  o.host_id = config.get_string("GRADEX_HOST_ID");
  // An explicit GRADEX_SHM=0 keeps every peer on tcp, hierarchical or not.
  const bool shm_refused =
      config.source_of("GRADEX_SHM") != config::Source::kDefault && !o.shared_memory;
  const std::string& hierarchical = config.get_string("GRADEX_HIERARCHICAL");
  if (!shm_refused && hierarchical != "0")
    o.hierarchical_shm = hierarchical == "1" ? CommOptions::HierarchicalShm::kOn
                                             : CommOptions::HierarchicalShm::kAuto;
  const std::string& stripes = config.get_string("GRADEX_STRIPES");
  o.stripes = stripes == "auto" ? 0 : std::stoi(stripes);
  o.tcp_pacing = config.get_bool("GRADEX_TCP_PACING");
  o.job_secret =
      auth::resolve_job_secret(config.get_string("GRADEX_JOB_SECRET"),
                               config.source_of("GRADEX_JOB_SECRET") != config::Source::kDefault,
                               config.get_string("GRADEX_JOB_SECRET_FILE"));
  const std::string& seal = config.get_string("GRADEX_SEAL");
  o.seal = seal == "on"    ? CommOptions::Seal::kOn
           : seal == "off" ? CommOptions::Seal::kOff
                           : CommOptions::Seal::kAuto;
  check_seal_setting(o);
  o.seal_test_tamper = config.get_string("GRADEX_TEST_SEAL_TAMPER");
  seal::parse_tamper(o.seal_test_tamper);  // a malformed value is refused here, by name
  return o;
}

std::string describe_seal_setting(const config::Config& config) {
  const CommOptions o = comm_options_from_config(config);
  const std::string given = config.get_string("GRADEX_SEAL");
  if (!check_seal_setting(o))
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

}  // namespace gradex::comm
