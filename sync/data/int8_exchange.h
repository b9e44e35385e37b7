// The dense quantized route (policies 'int8' and 'int4': GRADEX_SPARSITY_OVERRIDES 'pattern:int8'
// or 'pattern:int4', the auto policy's '8-bit' and '4-bit' rungs): an allreduce whose every hop
// moves compress/backend/int8_codec.h's 8-bit (or int4_codec.h's 4-bit) block encoding, with error
// feedback on both quantizations, so that nothing a rank submits is ever lost, only delayed. The
// steps below are the same at both widths (both codecs have 128-element blocks, so a rank owns
// the same elements at either, and a tensor moving between the widths keeps its residuals).
//
//   1. every rank encodes residual + values (its gradient, or its momentum-corrected gradient when
//      gradex owns momentum) to 8 bits and keeps residual' = input - dequant(sent), exactly;
//   2. reduce-scatter: each tensor is cut into P segments of whole 128-element blocks
//      (comm::encoded_segment of the tensor alone, so a rank owns the same elements of a tensor
//      whatever else shares its unit); rank k receives every rank's encoding of its segments,
//      validates it, and sums the dequantized values in fp32 in rank order 0..P-1;
//   3. the owner divides by P and re-encodes average + owner residual to 8 bits, keeping that
//      second error as its owner residual for those elements (exact as in 1);
//   4. allgather: every rank, the owner included, decodes every segment from the same bytes, so
//      the averages are bit-identical on every rank.
// Invariant (per element, over any number of steps): P * (sum of delivered averages + the owner
// residual) + sum of every rank's residual == sum of everything submitted, up to the rounding of
// the owner's fp32 sum and division (tests/sync/int8_exchange_test.cc).
// One unit's tensors travel in one message per peer and phase (a fused bucket). Bytes on the wire:
// 2 (P-1)/P x 1.03 bytes per element per rank at 8 bits (a ring allreduce's pattern at a quarter
// of fp32), 2 (P-1)/P x 0.53 at 4 bits.
// One hop (where a message latency costs more than the bytes: LinkModel::quantized_one_hop_max_
// bytes): steps 2-4 become one exchange of whole encodings. Every rank sends its step-1 encoding
// of every tensor to every rank and sums the P decoded contributions in rank order, then divides
// by P: the same bits everywhere, one message latency instead of two, (P-1) x the encoding through
// each rank's link instead of 2 (P-1)/P x, and no second quantization: the owner residuals are
// neither used nor changed (the invariant above holds as it is).
// A received piece of the wrong length or with an invalid scale or code is a CorruptPayload naming
// the tensor and the rank, before anything is summed.
// The collective is comm::encoded_allreduce (comm/collectives.h) with 8-bit codecs; this file
// holds what is the route's own: the codecs' residuals, the division by P, the counters.
// Code widths: 8 or 4 bits (anything else is a programming error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "comm/communicator.h"
#include "comm/topology/host_topology.h"

namespace gradex::sync {

struct Int8Item {
  float* values = nullptr;  // host fp32: in, this rank's contribution; out, the average
  size_t numel = 0;
  // numel floats: this rank's contribution residual; null: none is added or kept (an absent
  // contribution, Engine::submit_absent, sends its zeros exactly and leaves the residual alone)
  float* residual = nullptr;
  float* owner_residual = nullptr;  // numel floats: the owner's residual (its segments only)
  const std::string* key = nullptr;
};

struct Int8Counters {
  uint64_t nonfinite = 0;  // non-finite inputs (sent as 0, their residual reset)
  double encode_seconds = 0;
  double communicate_seconds = 0;
  double decode_seconds = 0;
};

// Elements of `numel` that rank k of `world` owns in the reduce-scatter.
comm::Segment int8_segment(size_t numel, int world, int k);

// The exchange above at `bits` (8 or 4; collective: every rank the same items, sizes, order,
// width, `one_hop` and layout). With a layout (`hierarchy`: GRADEX_HIERARCHICAL's groups) the
// encoded phases run across the groups only, through comm::hierarchical_encoded_allreduce: inside
// a group each rank encodes (step 1, its contribution residual) the local shards another rank owns
// (a tensor's elements cut into max_local() shards of whole blocks) and sends them to the owner,
// which sums the group's values and runs steps 1-4 on that sum among the shard's owners of every
// group; the owners pass the averages' encodings on inside the group. Cross-group bytes per group:
// the flat exchange's divided by the group's ranks. A rank's contribution residual then holds the
// error of its own encoding on the shards others own and of its group's sum on the shards it owns;
// its owner residual lies in the shards it owns. The invariant above holds as it is.
void int8_allreduce(comm::Communicator& comm, std::vector<Int8Item>& items, int bits,
                    Int8Counters& counters, bool one_hop = false,
                    const comm::HostTopology* hierarchy = nullptr);

// Bytes of one rank's encoding of `numel` elements at `bits` (what the one hop sends each peer).
uint64_t int8_encoded_bytes(size_t numel, int bits);

// A residual pair folded into the values that are about to leave the 8-bit route (a tensor whose
// policy changed, or a new membership): values[i] += residual[i] + world * owner_residual[i]; the
// owner residual is in units of the average, which `world` contributions of it make up. Both
// residuals are then zero.
void int8_fold_residuals(float* values, float* residual, float* owner_residual, size_t numel,
                         int world);

}  // namespace gradex::sync
