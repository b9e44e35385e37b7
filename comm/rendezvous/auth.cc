#include "comm/rendezvous/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace gradex::comm::auth {
namespace {

void append_framed(std::vector<uint8_t>* out, const void* data, size_t size) {
  uint64_t n = size;
  for (int i = 0; i < 8; ++i)
    out->push_back(static_cast<uint8_t>(n >> (8 * i)));
  const uint8_t* p = static_cast<const uint8_t*>(data);
  out->insert(out->end(), p, p + size);
}

}  // namespace

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw TransportError("OpenSSL RAND_bytes failed: no random nonce for authentication");
  return n;
}

Mac hmac(const std::string& secret, const char* label, const std::vector<Part>& parts) {
  std::vector<uint8_t> message;
  append_framed(&message, label, std::strlen(label));
  for (const Part& p : parts)
    append_framed(&message, p.data, p.size);
  Mac mac{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message.data(),
           message.size(), mac.data(), &len) == nullptr ||
      len != mac.size())
    throw TransportError("OpenSSL HMAC-SHA256 failed");
  return mac;
}

bool equal(const Mac& expected, const uint8_t* actual, size_t actual_size) {
  if (actual_size != expected.size()) return false;
  return CRYPTO_memcmp(expected.data(), actual, expected.size()) == 0;
}

std::string resolve_job_secret(const std::string& secret, bool secret_given,
                               const std::string& file) {
  if (secret_given && !file.empty())
    throw ConfigError(
        "GRADEX_JOB_SECRET and GRADEX_JOB_SECRET_FILE are both set: set only one (the file "
        "keeps the secret out of the environment)");
  if (!file.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(file, ec))
      throw ConfigError("GRADEX_JOB_SECRET_FILE='" + file + "' is a directory, not a file");
    std::ifstream in(file, std::ios::binary);
    if (!in)
      throw ConfigError("GRADEX_JOB_SECRET_FILE='" + file +
                        "' cannot be read: " + std::strerror(errno));
    std::ostringstream content;
    content << in.rdbuf();
    if (in.bad())
      throw ConfigError("GRADEX_JOB_SECRET_FILE='" + file + "' cannot be read: read error");
    std::string s = content.str();
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r'))
      s.pop_back();
    if (s.empty())
      throw ConfigError("GRADEX_JOB_SECRET_FILE='" + file +
                        "' holds an empty secret (write the secret into the file)");
    return s;
  }
  if (secret_given && secret.empty())
    throw ConfigError("GRADEX_JOB_SECRET is set but empty: give a secret or unset it");
  return secret;
}

}  // namespace gradex::comm::auth
