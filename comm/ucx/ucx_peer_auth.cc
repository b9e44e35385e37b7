// The published address entries and refusals of peers without the job secret (ucx_peer_auth.h).
#include "comm/ucx/ucx_peer_auth.h"

#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "comm/rendezvous/auth.h"

namespace gradex::comm::ucx {
namespace {

constexpr const char* kAddressLabel = "gradex ucx address";

// Binds a published address entry to the rank, world size and host it claims, under the secret.
auth::Mac address_proof(const std::string& secret, uint32_t rank, uint32_t world,
                        const std::string& host, const uint8_t* address, size_t size) {
  return auth::hmac(secret, kAddressLabel,
                    {auth::Part(&rank, 4), auth::Part(&world, 4), host, auth::Part(address, size)});
}

}  // namespace

[[noreturn]] void refuse_peer(int self, int peer, const std::string& host, const std::string& why) {
  std::string where = host.substr(0, host.find('|'));
  std::string msg = "connect: authentication failed: rank " + std::to_string(peer) +
                    (where.empty() ? "" : " (host " + where + ")") + " " + why;
  GX_LOG(kWarn) << "rank " << self << " refuses a peer: " << msg.substr(9);
  throw ConfigError(msg);
}

Bytes encode_address_entry(int rank, int world_size, const std::string& host, const void* address,
                           size_t address_size, const std::string& job_secret) {
  const auto* addr = static_cast<const uint8_t*>(address);
  Bytes mac;
  if (!job_secret.empty()) {
    auth::Mac m = address_proof(job_secret, static_cast<uint32_t>(rank),
                                static_cast<uint32_t>(world_size), host, addr, address_size);
    mac.assign(m.begin(), m.end());
  }
  Bytes entry(12 + host.size() + mac.size() + address_size);
  uint32_t world = static_cast<uint32_t>(world_size);
  uint32_t host_len = static_cast<uint32_t>(host.size());
  uint32_t mac_len = static_cast<uint32_t>(mac.size());
  uint8_t* p = entry.data();
  std::memcpy(p, &world, 4);
  std::memcpy(p + 4, &host_len, 4);
  std::memcpy(p + 8, host.data(), host.size());
  std::memcpy(p + 8 + host.size(), &mac_len, 4);
  if (!mac.empty()) std::memcpy(p + 12 + host.size(), mac.data(), mac.size());
  std::memcpy(p + 12 + host.size() + mac.size(), addr, address_size);
  return entry;
}

AddressEntry decode_address_entry(const Bytes& remote, int self, int peer,
                                  const std::string& job_secret) {
  uint32_t world = 0, host_len = 0, mac_len = 0;
  if (remote.size() >= 12) std::memcpy(&host_len, remote.data() + 4, 4);
  if (remote.size() < 12 || host_len > remote.size() - 12)
    throw CorruptPayload("connect: malformed address entry for rank " + std::to_string(peer));
  std::memcpy(&mac_len, remote.data() + 8 + host_len, 4);
  const size_t address_at = 12 + size_t{host_len} + mac_len;
  if ((mac_len != 0 && mac_len != auth::kMacBytes) || address_at >= remote.size())
    throw CorruptPayload("connect: malformed address entry for rank " + std::to_string(peer));
  std::memcpy(&world, remote.data(), 4);
  AddressEntry e;
  e.world = world;
  e.host.assign(reinterpret_cast<const char*>(remote.data() + 8), host_len);
  e.address = remote.data() + address_at;
  e.address_size = remote.size() - address_at;
  if (!job_secret.empty()) {
    if (mac_len == 0)
      refuse_peer(self, peer, e.host,
                  "published a UCX address without proof of the job secret: it was started "
                  "without GRADEX_JOB_SECRET, or someone without the secret wrote it");
    auth::Mac want = address_proof(job_secret, static_cast<uint32_t>(peer), world, e.host,
                                   e.address, e.address_size);
    if (!auth::equal(want, remote.data() + 12 + host_len, mac_len))
      refuse_peer(self, peer, e.host,
                  "published a UCX address with a wrong proof of the job secret: it has a "
                  "different GRADEX_JOB_SECRET, or someone without the secret wrote it");
  } else if (mac_len != 0) {
    refuse_peer(self, peer, e.host,
                "was started with a job secret (GRADEX_JOB_SECRET) and this rank without one");
  }
  return e;
}

}  // namespace gradex::comm::ucx
