// Session keys of the sealed data plane (seal.h): ephemeral X25519 key pairs and HKDF-SHA256 from
// their shared value to one key per direction, salted under the job secret.
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include <cstring>

#include "comm/rendezvous/auth.h"
#include "comm/seal/seal.h"

namespace gradex::comm::seal {
namespace {

EVP_PKEY* pkey_of(void* p) {
  return static_cast<EVP_PKEY*>(p);
}

// Frees an EVP_PKEY_CTX on every path.
struct PkeyCtx {
  EVP_PKEY_CTX* ctx;
  ~PkeyCtx() { EVP_PKEY_CTX_free(ctx); }
};

}  // namespace

EphemeralKey::EphemeralKey() {
  PkeyCtx gen{EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr)};
  EVP_PKEY* key = nullptr;
  if (gen.ctx == nullptr || EVP_PKEY_keygen_init(gen.ctx) != 1 ||
      EVP_PKEY_keygen(gen.ctx, &key) != 1)
    throw TransportError("libcrypto: generating an X25519 key pair failed");
  pkey_ = key;
  size_t len = public_.size();
  if (EVP_PKEY_get_raw_public_key(key, public_.data(), &len) != 1 || len != public_.size())
    throw TransportError("libcrypto: reading an X25519 public key failed");
}

EphemeralKey::~EphemeralKey() {
  EVP_PKEY_free(pkey_of(pkey_));
}

Key EphemeralKey::agree(const PublicKey& peer) const {
  EVP_PKEY* remote =
      EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer.data(), peer.size());
  if (remote == nullptr) throw CorruptPayload("seal: the peer's X25519 public key is malformed");
  PkeyCtx derive{EVP_PKEY_CTX_new(pkey_of(pkey_), nullptr)};
  Key shared{};
  size_t len = shared.size();
  // libcrypto refuses a low-order peer key (an all-zero shared value) here.
  const bool ok = derive.ctx != nullptr && EVP_PKEY_derive_init(derive.ctx) == 1 &&
                  EVP_PKEY_derive_set_peer(derive.ctx, remote) == 1 &&
                  EVP_PKEY_derive(derive.ctx, shared.data(), &len) == 1 && len == shared.size();
  EVP_PKEY_free(remote);
  if (!ok) throw CorruptPayload("seal: key agreement with the peer's X25519 public key failed");
  return shared;
}

DirectionKeys derive_keys(const Key& shared, const Handshake& h) {
  // Everything is ordered by rank (low end first), so both ends compute the same bytes.
  const bool low = h.self < h.peer;
  const uint32_t lo = low ? h.self : h.peer, hi = low ? h.peer : h.self;
  const auto& nonce_lo = low ? h.self_nonce : h.peer_nonce;
  const auto& nonce_hi = low ? h.peer_nonce : h.self_nonce;
  const auto& pub_lo = low ? h.self_public : h.peer_public;
  const auto& pub_hi = low ? h.peer_public : h.self_public;
  const auth::Mac salt = auth::hmac(
      h.secret, "gradex seal salt",
      {auth::Part(&lo, 4), auth::Part(&hi, 4), auth::Part(&h.world, 4),
       auth::Part(nonce_lo.data(), nonce_lo.size()), auth::Part(nonce_hi.data(), nonce_hi.size()),
       auth::Part(pub_lo.data(), pub_lo.size()), auth::Part(pub_hi.data(), pub_hi.size())});
  std::string info = "gradex seal keys " + std::to_string(lo) + "<->" + std::to_string(hi) + "/" +
                     std::to_string(h.world);
  uint8_t okm[2 * kKeyBytes];
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  EVP_KDF_CTX* ctx = kdf != nullptr ? EVP_KDF_CTX_new(kdf) : nullptr;
  EVP_KDF_free(kdf);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(shared.data()),
                                        shared.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<uint8_t*>(salt.data()),
                                        salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info.data(), info.size()),
      OSSL_PARAM_construct_end()};
  const bool ok = ctx != nullptr && EVP_KDF_derive(ctx, okm, sizeof(okm), params) == 1;
  EVP_KDF_CTX_free(ctx);
  if (!ok) throw TransportError("libcrypto: HKDF-SHA256 key derivation failed");
  DirectionKeys keys;
  // okm = key(low -> high) || key(high -> low)
  std::memcpy(keys.send.data(), okm + (low ? 0 : kKeyBytes), kKeyBytes);
  std::memcpy(keys.receive.data(), okm + (low ? kKeyBytes : 0), kKeyBytes);
  OPENSSL_cleanse(okm, sizeof(okm));
  return keys;
}

}  // namespace gradex::comm::seal
