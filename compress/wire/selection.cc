// The adapter from a DGC selection to the wire format's input: kept out of codec.h so that the
// format does not depend on the compressor's header.
#include "compress/dgc/compressor.h"
#include "compress/wire/codec.h"

namespace gradex::compress::wire {

SparseRef sparse_ref(const Selection& s) {
  return {s.numel, s.indices.data(), s.values.data(), s.indices.size(), s.value_dtype};
}

std::vector<uint8_t> encode(const Selection& selection, uint64_t key, const WireOptions& options) {
  std::vector<uint8_t> out;
  encode(sparse_ref(selection), key, options, out);
  return out;
}

}  // namespace gradex::compress::wire
