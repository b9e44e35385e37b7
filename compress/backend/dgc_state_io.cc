// DgcState's default checkpoints: u and v travel through host memory in DgcCompressor's blob
// format, so that states move freely between backends. A host
// DgcCompressor is the codec in both directions: saving patches the step counter and the arrays
// into the blob it writes for an empty state (the layout of compress/dgc/state.cc: step at byte
// 16, arrays from byte 40, CRC-32C last), and loading lets it validate the blob completely before
// anything reaches the device. tests/compress/backend_state_test.cc checks the round trip against
// DgcCompressor on every backend.
#include <cstring>
#include <vector>

#include "compress/backend/backend.h"
#include "compress/dgc/compressor.h"
#include "compress/wire/bytes.h"
#include "compress/wire/checksum.h"

namespace gradex::compress::backend {
namespace {

constexpr size_t kStepOffset = 16;
constexpr size_t kArraysOffset = 40;

// Copies n floats of backend memory to host (waits for its own copy only).
void download(Backend& backend, Stream& stream, const float* src, float* dst, size_t n) {
  if (n == 0) return;
  BufferPtr host = backend.allocate_staging(n * 4);
  EventPtr done = backend.create_event();
  backend.copy(host->data(), src, n * 4, stream);
  done->record(stream);
  done->synchronize();
  std::memcpy(dst, host->data(), n * 4);
}

void upload(Backend& backend, Stream& stream, const float* src, float* dst, size_t n) {
  if (n == 0) return;
  BufferPtr host = backend.allocate_staging(n * 4);
  std::memcpy(host->data(), src, n * 4);
  EventPtr done = backend.create_event();
  backend.copy(dst, host->data(), n * 4, stream);
  done->record(stream);
  done->synchronize();  // the staging buffer dies with this call
}

}  // namespace

std::vector<uint8_t> DgcState::save_state(Backend& backend, Stream& stream) {
  const size_t n = numel();
  DgcCompressor shape(n, options());
  std::vector<uint8_t> blob = shape.save_state();
  float* u = momentum_buffer();
  const size_t arrays = (u ? 2 : 1) * n * sizeof(float);
  uint8_t* at = blob.data() + kArraysOffset;
  if (u) {
    download(backend, stream, u, reinterpret_cast<float*>(at), n);
    at += n * 4;
  }
  download(backend, stream, residual(), reinterpret_cast<float*>(at), n);
  wire::put<uint64_t>(blob.data() + kStepOffset, steps_done());
  wire::put<uint32_t>(blob.data() + kArraysOffset + arrays,
                      wire::crc32c(blob.data(), kArraysOffset + arrays));
  return blob;
}

void DgcState::load_state(const uint8_t* data, size_t size, Backend& backend, Stream& stream) {
  DgcCompressor parsed(numel(), options());
  parsed.load_state(data, size);  // throws before anything here changes
  if (float* u = momentum_buffer()) upload(backend, stream, parsed.momentum_buffer(), u, numel());
  upload(backend, stream, parsed.residual(), const_cast<float*>(residual()), numel());
  set_step(parsed.steps_done());
}

DgcStepInfo DgcState::step_and_clear(float* grad, float grad_scale, Backend& backend,
                                     Stream& stream) {
  const DgcStepInfo info = step(grad, grad_scale, stream);
  backend.fill_zero(grad, numel() * 4, stream);
  return info;
}

}  // namespace gradex::compress::backend
