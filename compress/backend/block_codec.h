// The dense block codecs as one table by code width (8: int8_codec.h, 4: int4_codec.h), for the
// callers that take the width as a parameter: the quantized route's allreduce
// (sync/data/int8_exchange.cc), its start-up calibration and its cost terms (sync/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradex::compress::backend {

struct BlockCodec {
  int bits = 0;
  size_t block = 0;  // elements per block (the same at both widths)
  size_t (*encoded_size)(size_t count) = nullptr;
  double (*bytes_per_element)() = nullptr;
  size_t (*encode)(const float* values, float* residual, size_t count, uint8_t* out) = nullptr;
  void (*validate)(const uint8_t* in, size_t size, size_t count, const std::string& what) = nullptr;
  void (*decode_add)(const uint8_t* in, size_t count, float* acc) = nullptr;
  void (*decode)(const uint8_t* in, size_t count, float* out) = nullptr;
};

// The codec of `bits` (8 or 4; anything else is a programming error).
const BlockCodec& block_codec(int bits);

}  // namespace gradex::compress::backend
