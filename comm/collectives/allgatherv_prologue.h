// The parts the allgatherv algorithms share. The two-round ones (allgatherv.cc: direct,
// ring_allgatherv.cc: ring) first exchange every rank's payload size directly (8 bytes per peer,
// each received length checked), then move the payloads; the one-round one (allgatherv_inline.cc)
// sends small payloads with their size and moves only the larger ones in a second round, by the
// same payload phases.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace gradex::comm::detail {

// What every allgatherv starts with: `result` becomes P slots (their buffers are reused), this
// rank's holding a copy of its payload. Returns false, having taken no tag, when P == 1: there is
// nothing to exchange; otherwise *tag is the collective's tag.
bool take_own_slot(Communicator& comm, const void* data, size_t bytes, std::vector<Bytes>& result,
                   uint64_t* tag);

// take_own_slot, then `sizes` gets every rank's payload size. Returns false, having taken no tag,
// when P == 1: there is nothing to exchange. Otherwise *tag is the collective's tag: the sizes used
// `tag`, the payloads may use tag + 1 onwards. sizes_operation names the size exchange in timeouts
// and peer errors ("allgatherv sizes"). A size message of the wrong length is a MismatchError
// "<operation>: rank r received N bytes of size from rank q, expected 8: ...".
bool allgatherv_prologue(Communicator& comm, const char* operation, const char* sizes_operation,
                         const void* data, size_t bytes, std::vector<Bytes>& result,
                         std::vector<uint64_t>& sizes, uint64_t* tag);

// This host's physical memory: the bound on the payload sizes peers announce (a larger set is a
// CorruptPayload naming the rank, raised before anything is allocated for it).
uint64_t physical_memory_bytes();

// MismatchError for a received length that is not the expected one (what: "size", "payload").
[[noreturn]] void throw_length_mismatch(const char* operation, const Communicator& comm,
                                        const char* what, int peer, size_t received,
                                        size_t expected);

// CorruptPayload when announced sizes add up to more than this host's memory (checked before
// anything is allocated for them).
void check_announced_sizes(const char* operation, const std::vector<uint64_t>& sizes);

// The payload phases. travel[q] is how many bytes of rank q's payload this phase moves (0: none;
// result[q] is then left as it is); result[q] must already hold travel[q] bytes of room for every
// q != rank with travel[q] > 0, and `data` this rank's travel[rank] bytes. Every rank passes the
// same `travel`. Each received length is checked against travel (MismatchError naming the rank).
//   direct: every rank sends its payload to every other at once (tag `tag`);
//   ring:   at step s rank r forwards to r+1 the payload of rank r-1-s, chunk by chunk (tags
//           tag + s), so every link carries one payload at a time.
void direct_payloads(Communicator& comm, const char* operation, uint64_t tag, const void* data,
                     const std::vector<uint64_t>& travel, std::vector<Bytes>& result);
void ring_payloads(Communicator& comm, const char* operation, uint64_t tag, const void* data,
                   const std::vector<uint64_t>& travel, std::vector<Bytes>& result);

// A payload phase above (direct_payloads or ring_payloads).
using PayloadPhase = void (*)(Communicator& comm, const char* operation, uint64_t tag,
                              const void* data, const std::vector<uint64_t>& travel,
                              std::vector<Bytes>& result);

// The two-round allgatherv: the sizes (allgatherv_prologue), every peer's slot sized to its
// payload, then the whole payloads through `payloads` from tag + 1.
void two_round_allgatherv(Communicator& comm, const char* operation, const char* sizes_operation,
                          const void* data, size_t bytes, std::vector<Bytes>& result,
                          PayloadPhase payloads);

}  // namespace gradex::comm::detail
