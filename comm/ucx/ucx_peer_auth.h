// How UCX peers find and trust each other (internal to comm/ucx/): the address entry each rank
// publishes in the store, and the refusal of a peer that cannot prove the job secret. The hello
// round with its challenge-response is UcxCommunicator::exchange_hello (ucx_hello.cc).
// docs/security.md says what this covers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/rendezvous/store.h"

namespace gradex::comm::ucx {

// [u32 world size][u32 n][host identity, n bytes][u32 m][m-byte HMAC][worker address], host byte
// order (all ranks run the same build). A rank started with another world size is caught by the
// first peer that reads its entry, peers on the same host can choose shared memory, and with a job
// secret the HMAC (m = 32) binds the address to the rank, world size and host it claims, so an
// address written by someone without the secret is refused before any endpoint is created (m = 0
// without a secret).
Bytes encode_address_entry(int rank, int world_size, const std::string& host, const void* address,
                           size_t address_size, const std::string& job_secret);

struct AddressEntry {
  uint32_t world = 0;
  std::string host;
  const uint8_t* address = nullptr;  // points into the entry passed to decode_address_entry
  size_t address_size = 0;
};

// Parses rank `peer`'s entry as read by rank `self`. CorruptPayload for a malformed entry;
// ConfigError (logged as a refusal) when the secrets do not match: a missing or wrong HMAC while
// this rank has a secret, or an HMAC while it has none.
AddressEntry decode_address_entry(const Bytes& entry, int self, int peer,
                                  const std::string& job_secret);

// Logs and throws ConfigError "connect: authentication failed: rank P (host H) <why>".
[[noreturn]] void refuse_peer(int self, int peer, const std::string& host, const std::string& why);

}  // namespace gradex::comm::ucx
