#include "compress/zstd/zstd_stage.h"

#include <zstd.h>

#include <memory>
#include <string>

#include "base/error.h"

namespace gradex::compress::zstd {
namespace {

struct CctxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// One context per thread: creating them per payload costs more than small payloads take.
ZSTD_CCtx* cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CctxFree> c(ZSTD_createCCtx());
  return c.get();
}
ZSTD_DCtx* dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DctxFree> d(ZSTD_createDCtx());
  return d.get();
}

}  // namespace

bool compress(const uint8_t* data, size_t size, int level, size_t max_bytes,
              std::vector<uint8_t>& out) {
  if (max_bytes == 0) return false;
  out.resize(ZSTD_compressBound(size));
  size_t n = ZSTD_compressCCtx(cctx(), out.data(), out.size(), data, size, level);
  if (ZSTD_isError(n) || n >= max_bytes) return false;
  out.resize(n);
  return true;
}

void decompress(const uint8_t* data, size_t size, uint8_t* out, size_t expected) {
  unsigned long long declared = ZSTD_getFrameContentSize(data, size);
  if (declared == ZSTD_CONTENTSIZE_ERROR)
    throw CorruptPayload("payload zstd frame is invalid (bad frame header)");
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != expected)
    throw CorruptPayload("payload zstd frame declares " + std::to_string(declared) +
                         " bytes, the header declares " + std::to_string(expected));
  size_t n = ZSTD_decompressDCtx(dctx(), out, expected, data, size);
  if (ZSTD_isError(n))
    throw CorruptPayload(std::string("payload zstd frame does not decode: ") +
                         ZSTD_getErrorName(n));
  if (n != expected)
    throw CorruptPayload("payload zstd frame decodes to " + std::to_string(n) +
                         " bytes, the header declares " + std::to_string(expected));
}

}  // namespace gradex::compress::zstd
