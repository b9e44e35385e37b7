// The TCP store's sealed connections: with a job secret, the hello carries the client's ephemeral
// X25519 key, the challenge the store's, both proofs cover both keys, and every frame after the
// client's proof (the store's answer to it included) travels as a kSealed frame whose payload is
// the inner frame (header and payload) sealed with that connection's keys (comm/seal/seal.h).
// Used by the store's client (tcp_store.cc) and its server core (tcp_store_core.cc).
#pragma once

#include <memory>
#include <string>

#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/store.h"
#include "comm/seal/seal.h"

namespace gradex::comm {

// One sealed store connection, from one end.
class StoreChannel {
 public:
  // `server`: this end is the store. The nonces and keys are those of the hello round.
  StoreChannel(const std::string& secret, bool server, const auth::Nonce& client_nonce,
               const auth::Nonce& server_nonce, const seal::EphemeralKey& own_key,
               const seal::PublicKey& peer_key);
  // A frame (header + payload) as the kSealed frame that travels.
  Bytes seal(const Bytes& frame);
  // The inner frame of a kSealed frame's payload; SealViolation when it fails a check,
  // CorruptPayload when the inner frame is malformed.
  Bytes open(const uint8_t* payload, size_t bytes);

 private:
  std::unique_ptr<seal::Sealer> sealer_;
  std::unique_ptr<seal::Opener> opener_;
};

// The proofs of the store handshake: the store's over (Nc, Ns, Pc, Ps), the client's over
// (Ns, Nc, Ps, Pc).
auth::Mac store_server_proof(const std::string& secret, const auth::Nonce& client_nonce,
                             const auth::Nonce& server_nonce, const seal::PublicKey& client_key,
                             const seal::PublicKey& server_key);
auth::Mac store_client_proof(const std::string& secret, const auth::Nonce& client_nonce,
                             const auth::Nonce& server_nonce, const seal::PublicKey& client_key,
                             const seal::PublicKey& server_key);

}  // namespace gradex::comm
