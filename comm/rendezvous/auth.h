// The job secret and the primitives that prove knowledge of it: HMAC-SHA256, fresh random nonces
// and constant-time comparison, all from OpenSSL's libcrypto (no cryptography is written here).
// What the secret covers and what it does not: docs/security.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gradex::comm::auth {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// A view of bytes to authenticate.
struct Part {
  const void* data;
  size_t size;
  Part(const std::string& s) : data(s.data()), size(s.size()) {}
  Part(const Nonce& n) : data(n.data()), size(n.size()) {}
  Part(const void* d, size_t n) : data(d), size(n) {}
};

// Fresh unpredictable bytes from RAND_bytes; TransportError if the generator fails.
Nonce random_nonce();

// HMAC-SHA256 under `secret` of `label` and `parts`, each prefixed by its length (so that no two
// different sequences of parts are authenticated by the same bytes). `label` separates the uses
// (store server, store client, UCX address, UCX peer), so a proof made for one is useless in
// another.
Mac hmac(const std::string& secret, const char* label, const std::vector<Part>& parts);

// Constant-time comparison (CRYPTO_memcmp): false when the sizes differ.
bool equal(const Mac& expected, const uint8_t* actual, size_t actual_size);

// The job secret from the values of GRADEX_JOB_SECRET and GRADEX_JOB_SECRET_FILE (either may be
// empty; `secret_given` says whether GRADEX_JOB_SECRET was set at all, even to ""). Returns "" when
// neither is set. ConfigError when both are set, when the file cannot be read, or when the secret
// is empty (a file's trailing newline does not count).
std::string resolve_job_secret(const std::string& secret, bool secret_given,
                               const std::string& file);

}  // namespace gradex::comm::auth
