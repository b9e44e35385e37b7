// What both allgatherv algorithms (allgatherv.cc: direct, ring_allgatherv.cc: ring) do first: this
// rank's own payload goes into its slot of the result, and every rank's payload size is exchanged
// directly (8 bytes per peer), each received length checked.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace gradex::comm::detail {

// `result` becomes P slots (their buffers are reused), this rank's holding a copy of its payload;
// `sizes` gets every rank's payload size. Returns false, having taken no tag, when P == 1: there
// is nothing to exchange. Otherwise *tag is the collective's tag: the sizes used `tag`, the
// payloads may use tag + 1 onwards. sizes_operation names the size exchange in timeouts and peer
// errors ("allgatherv sizes"). A size message of the wrong length is a MismatchError
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

}  // namespace gradex::comm::detail
