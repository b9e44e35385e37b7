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
  auth::Nonce nonce;    // fresh per connection: the challenge the peer must answer
};

std::string stripes_text(uint32_t stripes) {
  return stripes == 0 ? "auto" : std::to_string(stripes);
}

// The proof that `from` knows the secret, answering `to`'s challenge in a world of `world`.
auth::Mac peer_proof(const std::string& secret, uint32_t from, uint32_t to, uint32_t world,
                     const auth::Nonce& challenge, const auth::Nonce& own) {
  return auth::hmac(
      secret, kPeerLabel,
      {auth::Part(&from, 4), auth::Part(&to, 4), auth::Part(&world, 4), challenge, own});
}

}  // namespace

// One small message each way between every pair proves that the transport works before the first
// collective, and catches ranks launched with a different world size. With a job secret each hello
// carries a fresh nonce and a second round answers the peer's nonce with an HMAC (both directions),
// so a peer that cannot prove the secret now, on this connection, is refused before any data.
void UcxCommunicator::exchange_hello() {
  const std::string& secret = options_.job_secret;
  std::vector<Hello> in(static_cast<size_t>(size_));
  Hello out{kHelloMagic,
            static_cast<uint32_t>(size_),
            static_cast<uint32_t>(rank_),
            secret.empty() ? 0u : 1u,
            static_cast<uint32_t>(options_.stripes),
            auth::Nonce{}};
  if (!secret.empty()) out.nonce = auth::random_nonce();
  std::vector<RequestPtr> requests;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    requests.push_back(irecv(p, kHelloTag, &in[static_cast<size_t>(p)], sizeof(Hello)));
    requests.push_back(isend(p, kHelloTag, &out, sizeof(Hello)));
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
    if (h.stripes != out.stripes) {
      const bool mine_first = rank_ < p;
      throw ConfigError("connect: GRADEX_STRIPES: '" +
                        stripes_text(mine_first ? out.stripes : h.stripes) + "' on ranks [" +
                        std::to_string(std::min(rank_, p)) + "], '" +
                        stripes_text(mine_first ? h.stripes : out.stripes) + "' on ranks [" +
                        std::to_string(std::max(rank_, p)) + "] (it must be equal on every rank)");
    }
    if ((h.has_secret != 0) != !secret.empty())
      refuse_peer(rank_, p, "",
                  h.has_secret ? "was started with a job secret and this rank without one"
                               : "has no job secret and this rank requires one");
  }
  if (secret.empty()) return;
  std::vector<auth::Mac> proofs_in(static_cast<size_t>(size_));
  std::vector<auth::Mac> proofs_out(static_cast<size_t>(size_));
  requests.clear();
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const size_t i = static_cast<size_t>(p);
    proofs_out[i] = peer_proof(secret, static_cast<uint32_t>(rank_), static_cast<uint32_t>(p),
                               static_cast<uint32_t>(size_), in[i].nonce, out.nonce);
    requests.push_back(irecv(p, kProofTag, &proofs_in[i], sizeof(auth::Mac)));
    requests.push_back(isend(p, kProofTag, &proofs_out[i], sizeof(auth::Mac)));
  }
  wait_all(requests, "connect");
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const size_t i = static_cast<size_t>(p);
    auth::Mac want = peer_proof(secret, static_cast<uint32_t>(p), static_cast<uint32_t>(rank_),
                                static_cast<uint32_t>(size_), out.nonce, in[i].nonce);
    if (!auth::equal(want, proofs_in[i].data(), proofs_in[i].size()))
      refuse_peer(rank_, p, "",
                  "did not prove knowledge of the job secret on its connection (a different "
                  "GRADEX_JOB_SECRET)");
  }
  GX_LOG(kDebug) << "every peer proved knowledge of the job secret";
}

}  // namespace gradex::comm::ucx
