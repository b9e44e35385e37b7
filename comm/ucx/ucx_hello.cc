// UcxCommunicator::exchange_hello: the first messages between every pair of ranks, and with a job
// secret a challenge-response in both directions (ucx_peer_auth.h, docs/security.md).
#include <algorithm>

#include "base/log.h"
#include "comm/rendezvous/auth.h"
#include "comm/ucx/ucx_communicator.h"
#include "comm/ucx/ucx_peer_auth.h"

namespace gradex::comm::ucx {
namespace {

constexpr uint32_t kHelloMagic = 0x4c484758;  // "XGHL"
// User tags below 2^16 are reserved: next_collective_tag() starts at 2^16 (1: the goodbye).
constexpr uint64_t kHelloTag = 0;  // the hello round after connecting
constexpr uint64_t kProofTag = 2;  // the challenge-response round (with a job secret)

constexpr const char* kPeerLabel = "gradex ucx peer";

struct Hello {
  uint32_t magic;
  uint32_t world_size;
  uint32_t rank;
  uint32_t has_secret;  // 1 when this rank holds a job secret
  uint32_t stripes;     // CommOptions::stripes as given (0: auto): must be equal on every rank
  uint32_t seal;        // 1 when this rank seals its messages (check_seal_setting)
  uint32_t seal_given;  // CommOptions::seal as given (auto, on, off), for the error message
  uint32_t has_aes;     // 1 when this rank's CPU has AES instructions (seal::pair_cipher)
  auth::Nonce nonce;    // fresh per connection: the challenge the peer must answer
  seal::PublicKey seal_public;  // sealing: this connection's ephemeral X25519 key (else zeros)
};

const char* seal_text(uint32_t given) {
  return given == static_cast<uint32_t>(CommOptions::Seal::kOn)    ? "on"
         : given == static_cast<uint32_t>(CommOptions::Seal::kOff) ? "off"
                                                                   : "auto";
}

std::string stripes_text(uint32_t stripes) {
  return stripes == 0 ? "auto" : std::to_string(stripes);
}

// The proof that `from` knows the secret, answering `to`'s challenge in a world of `world`. It
// covers both ends' ephemeral sealing keys, so nobody without the secret can swap them for its
// own (and sit in the middle of a sealed connection).
auth::Mac peer_proof(const std::string& secret, uint32_t from, uint32_t to, uint32_t world,
                     const auth::Nonce& challenge, const auth::Nonce& own,
                     const seal::PublicKey& from_key, const seal::PublicKey& to_key) {
  return auth::hmac(
      secret, kPeerLabel,
      {auth::Part(&from, 4), auth::Part(&to, 4), auth::Part(&world, 4), challenge, own,
       auth::Part(from_key.data(), from_key.size()), auth::Part(to_key.data(), to_key.size())});
}

}  // namespace

// One small message each way between every pair proves that the transport works before the first
// collective, and catches ranks launched with a different world size. With a job secret each hello
// carries a fresh nonce and a second round answers the peer's nonce with an HMAC (both directions),
// so a peer that cannot prove the secret now, on this connection, is refused before any data.
void UcxCommunicator::exchange_hello() {
  const std::string& secret = options_.job_secret;
  sealing_ = check_seal_setting(options_);
  tamper_ = seal::parse_tamper(options_.seal_test_tamper);
  const auto n = static_cast<size_t>(size_);
  std::vector<Hello> in(n);
  Hello base{kHelloMagic,
             static_cast<uint32_t>(size_),
             static_cast<uint32_t>(rank_),
             secret.empty() ? 0u : 1u,
             static_cast<uint32_t>(options_.stripes),
             sealing_ ? 1u : 0u,
             static_cast<uint32_t>(options_.seal),
             seal::cpu_has_aes() ? 1u : 0u,
             auth::Nonce{},
             seal::PublicKey{}};
  if (!secret.empty()) base.nonce = auth::random_nonce();
  // One hello per connection: with sealing, each carries an ephemeral key of that connection.
  std::vector<Hello> out(n, base);
  std::vector<std::unique_ptr<seal::EphemeralKey>> keys(n);
  std::vector<RequestPtr> requests;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto pi = static_cast<size_t>(p);
    if (sealing_) {
      keys[pi] = std::make_unique<seal::EphemeralKey>();
      out[pi].seal_public = keys[pi]->public_key();
    }
    requests.push_back(irecv(p, kHelloTag, &in[pi], sizeof(Hello)));
    requests.push_back(isend(p, kHelloTag, &out[pi], sizeof(Hello)));
  }
  wait_all(requests, "connect");
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const Hello& h = in[static_cast<size_t>(p)];
    if (h.magic != kHelloMagic || static_cast<int>(h.rank) != p || h.has_secret > 1)
      throw CorruptPayload("connect: malformed hello from rank " + std::to_string(p));
    if (static_cast<int>(h.world_size) != size_)
      throw MismatchError("connect: rank " + std::to_string(p) + " was started with world size " +
                          std::to_string(h.world_size) + ", this rank with " +
                          std::to_string(size_));
    // The connections per peer are opened next (connect_stripes): both ends must open as many.
    // A configuration error, worded as the start-up agreement words a variable that differs.
    const bool mine_first = rank_ < p;
    if (h.stripes != base.stripes) {
      throw ConfigError("connect: GRADEX_STRIPES: '" +
                        stripes_text(mine_first ? base.stripes : h.stripes) + "' on ranks [" +
                        std::to_string(std::min(rank_, p)) + "], '" +
                        stripes_text(mine_first ? h.stripes : base.stripes) + "' on ranks [" +
                        std::to_string(std::max(rank_, p)) + "] (it must be equal on every rank)");
    }
    if ((h.has_secret != 0) != !secret.empty())
      refuse_peer(rank_, p, "",
                  h.has_secret ? "was started with a job secret and this rank without one"
                               : "has no job secret and this rank requires one");
    if (h.seal > 1) throw CorruptPayload("connect: malformed hello from rank " + std::to_string(p));
    // Both ends of a connection must seal, or neither: said as the start-up agreement says it.
    if (h.seal != base.seal) {
      const uint32_t lo = mine_first ? base.seal_given : h.seal_given;
      const uint32_t hi = mine_first ? h.seal_given : base.seal_given;
      throw ConfigError("connect: GRADEX_SEAL: '" + std::string(seal_text(lo)) + "' on ranks [" +
                        std::to_string(std::min(rank_, p)) + "], '" + seal_text(hi) +
                        "' on ranks [" + std::to_string(std::max(rank_, p)) +
                        "] (it must be equal on every rank: one would seal its messages and the "
                        "other send them in clear)");
    }
  }
  if (secret.empty()) return;
  std::vector<auth::Mac> proofs_in(static_cast<size_t>(size_));
  std::vector<auth::Mac> proofs_out(static_cast<size_t>(size_));
  requests.clear();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const size_t i = static_cast<size_t>(p);
    proofs_out[i] = peer_proof(secret, static_cast<uint32_t>(rank_), static_cast<uint32_t>(p),
                               static_cast<uint32_t>(size_), in[i].nonce, base.nonce,
                               out[i].seal_public, in[i].seal_public);
    requests.push_back(irecv(p, kProofTag, &proofs_in[i], sizeof(auth::Mac)));
    requests.push_back(isend(p, kProofTag, &proofs_out[i], sizeof(auth::Mac)));
  }
  wait_all(requests, "connect");
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const size_t i = static_cast<size_t>(p);
    auth::Mac want = peer_proof(secret, static_cast<uint32_t>(p), static_cast<uint32_t>(rank_),
                                static_cast<uint32_t>(size_), base.nonce, in[i].nonce,
                                in[i].seal_public, out[i].seal_public);
    if (!auth::equal(want, proofs_in[i].data(), proofs_in[i].size()))
      refuse_peer(rank_, p, "",
                  "did not prove knowledge of the job secret on its connection (a different "
                  "GRADEX_JOB_SECRET)");
  }
  GX_LOG(kDebug) << "every peer proved knowledge of the job secret";
  if (!sealing_) return;
  std::vector<seal::Handshake> handshakes(n);
  std::vector<bool> peer_has_aes(n, false);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto pi = static_cast<size_t>(p);
    seal::Handshake& h = handshakes[pi];
    h.secret = secret;
    h.self = static_cast<uint32_t>(rank_);
    h.peer = static_cast<uint32_t>(p);
    h.world = static_cast<uint32_t>(size_);
    h.self_nonce = base.nonce;
    h.peer_nonce = in[pi].nonce;
    h.self_public = out[pi].seal_public;
    h.peer_public = in[pi].seal_public;
    peer_has_aes[pi] = in[pi].has_aes == 1;
  }
  install_seals(handshakes, keys, peer_has_aes);
}

}  // namespace gradex::comm::ucx
