// StoreChannel and the store handshake's proofs (store_seal.h).
#include "comm/rendezvous/store_seal.h"

#include "base/error.h"
#include "comm/rendezvous/tcp_store_protocol.h"

namespace gradex::comm {
namespace {

// The store's frames all carry this tag in their authenticated data (one stream each way, in
// order: the sequence numbers alone order them).
constexpr uint64_t kStoreTag = 0;

// HMAC under the secret of `label`, then each side's nonce and key in the order that side names
// them.
auth::Mac store_proof(const std::string& secret, const char* label, const auth::Nonce& nonce_a,
                      const auth::Nonce& nonce_b, const seal::PublicKey& key_a,
                      const seal::PublicKey& key_b) {
  return auth::hmac(secret, label,
                    {nonce_a, nonce_b, auth::Part(key_a.data(), key_a.size()),
                     auth::Part(key_b.data(), key_b.size())});
}

}  // namespace

StoreChannel::StoreChannel(const std::string& secret, bool server, const auth::Nonce& client_nonce,
                           const auth::Nonce& server_nonce, const seal::EphemeralKey& own_key,
                           const seal::PublicKey& peer_key) {
  seal::Handshake h;
  h.secret = secret;
  // The store is "rank 0" of its connection, the client "rank 1"; world 0 keeps these keys apart
  // from any UCX connection's.
  h.self = server ? 0 : 1;
  h.peer = server ? 1 : 0;
  h.world = 0;
  h.self_nonce = server ? server_nonce : client_nonce;
  h.peer_nonce = server ? client_nonce : server_nonce;
  h.self_public = own_key.public_key();
  h.peer_public = peer_key;
  const seal::DirectionKeys keys = seal::derive_keys(own_key.agree(peer_key), h);
  // The two ends need not share a CPU, and store frames are small: ChaCha20-Poly1305, fast
  // everywhere, needs no agreement.
  const seal::Cipher cipher = seal::Cipher::kChaCha20Poly1305;
  sealer_ = std::make_unique<seal::Sealer>(cipher, keys.send);
  opener_ = std::make_unique<seal::Opener>(cipher, keys.receive, server ? 1 : 0);
}

Bytes StoreChannel::seal(const Bytes& frame) {
  Bytes out(store_wire::kHeaderBytes + frame.size() + seal::kOverheadBytes);
  store_wire::Header h;
  h.type = store_wire::Type::kSealed;
  h.length = static_cast<uint32_t>(frame.size() + seal::kOverheadBytes);
  store_wire::encode_header(h, out.data());
  sealer_->seal(kStoreTag, frame.data(), frame.size(), out.data() + store_wire::kHeaderBytes);
  return out;
}

Bytes StoreChannel::open(const uint8_t* payload, size_t bytes) {
  Bytes inner(opener_->payload_bytes(bytes));
  opener_->open(kStoreTag, payload, bytes, inner.data());
  if (inner.size() < store_wire::kHeaderBytes)
    throw CorruptPayload("a sealed store frame holds " + std::to_string(inner.size()) +
                         " bytes, less than a frame header");
  const store_wire::Header h = store_wire::decode_header(inner.data());
  const std::string bad = store_wire::check_header(h);
  if (!bad.empty()) throw CorruptPayload("a sealed store frame holds a bad frame: " + bad);
  if (h.length != inner.size() - store_wire::kHeaderBytes || h.type == store_wire::Type::kSealed)
    throw CorruptPayload("a sealed store frame's inner frame is malformed");
  return inner;
}

auth::Mac store_server_proof(const std::string& secret, const auth::Nonce& client_nonce,
                             const auth::Nonce& server_nonce, const seal::PublicKey& client_key,
                             const seal::PublicKey& server_key) {
  return store_proof(secret, "gradex store server", client_nonce, server_nonce, client_key,
                     server_key);
}

auth::Mac store_client_proof(const std::string& secret, const auth::Nonce& client_nonce,
                             const auth::Nonce& server_nonce, const seal::PublicKey& client_key,
                             const seal::PublicKey& server_key) {
  return store_proof(secret, "gradex store client", server_nonce, client_nonce, server_key,
                     client_key);
}

}  // namespace gradex::comm
