// Dense gradients that ride a DGC unit's gather ("riders"). Where a round holds DGC tensors and
// small dense ones, the dense bucket would cost a collective of its own (a ring's 2(P-1) message
// latencies, or the direct exchange's 2) before the DGC unit's gather; on a latency-bound link
// those latencies are most of the step. A rider instead travels inside the gather: each rank's
// values in full, as one payload of the sparse wire format (compress/wire/codec.h) that selects
// every element (bitmap index coding), and every rank sums every rank's payload in rank order.
// The average is the same bits on every rank; each rank receives (P-1) times the tensor's wire
// bytes where an allreduce moves 2(P-1)/P times them, and the step saves the bucket's collective.
//
// The wire type is the dense route's: fp32, or the 16-bit type with the values divided by the
// world size before the cast (as the dense exchange does: a sum cannot overflow), summed in fp32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "compress/wire/message.h"

namespace gradex::sync::rider {

// Appends x[0, n) as one full payload of `wire` values (fp32, fp16 or bf16; a 16-bit wire
// carries x / world_size) for the tensor `key`. Returns the number of finite values that
// saturated the 16-bit range.
uint64_t encode(const float* x, uint64_t n, const std::string& key, DType wire, int world_size,
                std::vector<uint8_t>& out);

// out[0, n) = the average of the payloads (one per rank, in rank order): fp32 wire payloads are
// summed with weight 1/world_size, 16-bit ones (divided before the cast) with weight 1. A payload
// that is not a full payload of `key` with n elements is a CorruptPayload naming its rank.
// Returns whether the average holds NaN or Inf.
bool average(const std::vector<compress::wire::PayloadSpan>& payloads, const std::string& key,
             uint64_t n, DType wire, float* out);

}  // namespace gradex::sync::rider
