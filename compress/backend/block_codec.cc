#include "compress/backend/block_codec.h"

#include "base/check.h"
#include "compress/backend/int4_codec.h"
#include "compress/backend/int8_codec.h"

namespace gradex::compress::backend {

static_assert(int8::kInt8Block == int4::kInt4Block, "both widths must own the same segments");

const BlockCodec& block_codec(int bits) {
  static const BlockCodec eight{8,
                                int8::kInt8Block,
                                int8::encoded_size,
                                int8::bytes_per_element,
                                int8::encode,
                                int8::validate,
                                int8::decode_add,
                                int8::decode};
  static const BlockCodec four{4,
                               int4::kInt4Block,
                               int4::encoded_size,
                               int4::bytes_per_element,
                               int4::encode,
                               int4::validate,
                               int4::decode_add,
                               int4::decode};
  GX_CHECK(bits == 8 || bits == 4);
  return bits == 4 ? four : eight;
}

}  // namespace gradex::compress::backend
