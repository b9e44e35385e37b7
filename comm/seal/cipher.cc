// The AEAD ciphers of the sealed data plane (seal.h): AES-256-GCM and ChaCha20-Poly1305 through
// libcrypto's EVP interface, one keyed context per direction.
#include <openssl/evp.h>

#include <algorithm>
#include <cstring>

#include "comm/seal/seal.h"

namespace gradex::comm::seal {
namespace {

EVP_CIPHER_CTX* ctx_of(void* p) {
  return static_cast<EVP_CIPHER_CTX*>(p);
}

const EVP_CIPHER* evp_cipher(Cipher cipher) {
  return cipher == Cipher::kAes256Gcm ? EVP_aes_256_gcm() : EVP_chacha20_poly1305();
}

// 96-bit nonce: four zero bytes, then the sequence number (little-endian). Keys are per direction
// and connection, so the sequence number alone never repeats under one key.
void make_nonce(uint64_t sequence, uint8_t* nonce) {
  std::memset(nonce, 0, 4);
  for (int i = 0; i < 8; ++i)
    nonce[4 + i] = static_cast<uint8_t>(sequence >> (8 * i));
}

[[noreturn]] void fail(const char* what) {
  throw TransportError(std::string("libcrypto: ") + what + " failed");
}

// EVP takes int lengths: long messages go through in pieces.
constexpr size_t kPiece = size_t{1} << 30;

}  // namespace

const char* cipher_name(Cipher cipher) {
  return cipher == Cipher::kAes256Gcm ? "AES-256-GCM" : "ChaCha20-Poly1305";
}

bool cpu_has_aes() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
#else
  return false;
#endif
}

Cipher pair_cipher(bool a_has_aes, bool b_has_aes) {
  return a_has_aes && b_has_aes ? Cipher::kAes256Gcm : Cipher::kChaCha20Poly1305;
}

Aead::Aead(Cipher cipher, const Key& key, bool encrypt) : cipher_(cipher) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (ctx == nullptr) fail("EVP_CIPHER_CTX_new");
  ctx_ = ctx;
  const int enc = encrypt ? 1 : 0;
  if (EVP_CipherInit_ex(ctx, evp_cipher(cipher), nullptr, nullptr, nullptr, enc) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, 12, nullptr) != 1 ||
      EVP_CipherInit_ex(ctx, nullptr, nullptr, key.data(), nullptr, enc) != 1) {
    EVP_CIPHER_CTX_free(ctx);
    ctx_ = nullptr;
    fail("AEAD key set-up");
  }
}

Aead::~Aead() {
  EVP_CIPHER_CTX_free(ctx_of(ctx_));
}

void Aead::seal(uint64_t sequence, const uint8_t* aad, size_t aad_bytes, const uint8_t* in,
                size_t n, uint8_t* out, uint8_t* tag) {
  EVP_CIPHER_CTX* ctx = ctx_of(ctx_);
  uint8_t nonce[12];
  make_nonce(sequence, nonce);
  int len = 0;
  if (EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_EncryptUpdate(ctx, nullptr, &len, aad, static_cast<int>(aad_bytes)) != 1)
    fail("AEAD seal (nonce, header)");
  for (size_t done = 0; done < n;) {
    const size_t piece = std::min(kPiece, n - done);
    if (EVP_EncryptUpdate(ctx, out + done, &len, in + done, static_cast<int>(piece)) != 1)
      fail("AEAD seal");
    done += piece;
  }
  if (EVP_EncryptFinal_ex(ctx, out + n, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, static_cast<int>(kTagBytes), tag) != 1)
    fail("AEAD seal (tag)");
}

bool Aead::open(uint64_t sequence, const uint8_t* aad, size_t aad_bytes, const uint8_t* in,
                size_t n, uint8_t* out, const uint8_t* tag) {
  EVP_CIPHER_CTX* ctx = ctx_of(ctx_);
  uint8_t nonce[12];
  make_nonce(sequence, nonce);
  uint8_t expected[kTagBytes];
  std::memcpy(expected, tag, kTagBytes);  // the ctrl call takes a non-const pointer
  int len = 0;
  if (EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, static_cast<int>(kTagBytes), expected) != 1 ||
      EVP_DecryptUpdate(ctx, nullptr, &len, aad, static_cast<int>(aad_bytes)) != 1)
    fail("AEAD open (nonce, header)");
  for (size_t done = 0; done < n;) {
    const size_t piece = std::min(kPiece, n - done);
    if (EVP_DecryptUpdate(ctx, out + done, &len, in + done, static_cast<int>(piece)) != 1)
      return false;
    done += piece;
  }
  return EVP_DecryptFinal_ex(ctx, out + n, &len) == 1;
}

}  // namespace gradex::comm::seal
