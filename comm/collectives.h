// Collectives over a Communicator. Every rank calls the same collectives in the same order with
// matching arguments (the sync engine guarantees that); mismatched sizes are detected where the
// protocol can see them (allreduce exchanges no sizes: the engine validates before calling it).
#pragma once

#include <cstddef>
#include <vector>

#include "base/dtype.h"
#include "comm/communicator.h"

namespace gradex::comm {

// In-place sum across ranks (ring: reduce-scatter then allgather, each ring step pipelined in
// options().ring_chunk_bytes chunks). fp16/bf16 inputs are accumulated in fp32 and rounded once per
// hop. fp32 results are bit-identical on every rank and equal to summing the ranks' values in the
// ring order documented in docs/collectives.md (so a reference can reproduce them exactly).
void allreduce_sum(Communicator& comm, void* data, size_t count, DType dtype);

// Every rank contributes a byte payload of any size (0 included); returns all payloads, indexed by
// rank.
std::vector<Bytes> allgatherv(Communicator& comm, const void* data, size_t bytes);

// Same contract and result as allgatherv, as a ring: each rank sends its own payload and forwards
// the others' to its right neighbour, chunk by chunk, so no link carries more than one payload at
// a time (no incast on an uplink; P-1 ring steps of latency). Received lengths are checked against
// the announced sizes (MismatchError naming the origin rank otherwise).
std::vector<Bytes> ring_allgatherv(Communicator& comm, const void* data, size_t bytes);

// Copies `bytes` bytes from `root`'s buffer into every other rank's buffer.
void broadcast(Communicator& comm, void* data, size_t bytes, int root);

// Returns once every rank has entered the barrier.
void barrier(Communicator& comm);

}  // namespace gradex::comm
