// The ring's 16-bit sums: acc[i] = to16(from16(incoming[i]) + from16(acc[i])) for fp16 or bf16,
// added in fp32 and rounded once (to nearest even, as base/half.h). In base/ beside the scalar
// conversions so that comm/'s reductions need nothing from compress/; the bulk casts that scale
// and saturate stay in compress/half/cast.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace gradex {

// One ring hop's sum of n 16-bit values of `type` (kFloat16 or kBFloat16; InvalidArgument
// otherwise). The operand order (incoming + acc) is part of comm/'s documented summation order.
// 8 values at a time with AVX2/F16C; the hardware rounding is base/half.h's, only NaN payloads
// may differ (both stay NaN).
void half_sum_into(uint16_t* acc, const uint16_t* incoming, size_t n, DType type);

}  // namespace gradex
