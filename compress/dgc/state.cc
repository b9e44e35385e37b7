// DgcCompressor checkpoints. Layout (little-endian):
//   u32 magic "GXDS", u32 version, u64 numel, u64 steps done, u8 has momentum buffer,
//   u8 zero, u16 the residual's DCT chunk (DgcOptions::residual_dct_chunk; version 1: zero),
//   f32 last threshold, f32 the threshold before it, 4 zero bytes,
//   [numel f32 u if present], numel f32 v, u32 CRC-32C of all preceding bytes.
// Version 1: element-domain residuals only (what every build before the DCT codec wrote, and
// what this one still writes for them); version 2: any domain, recorded in the u16.
#include <cstring>
#include <string>

#include "base/error.h"
#include "compress/dgc/compressor.h"
#include "compress/wire/bytes.h"
#include "compress/wire/checksum.h"

namespace gradex::compress {
namespace {
constexpr uint32_t kStateMagic = 0x53445847u;  // "GXDS"
constexpr uint32_t kStateVersion = 2;          // the newest this build reads
constexpr size_t kStateHeader = 40;
}  // namespace

std::vector<uint8_t> DgcCompressor::save_state() const {
  const bool has_u = !u_.empty();
  const size_t arrays = (has_u ? 2 : 1) * numel_ * sizeof(float);
  std::vector<uint8_t> out(kStateHeader + arrays + 4, 0);
  uint8_t* p = out.data();
  wire::put<uint32_t>(p, kStateMagic);
  const uint32_t chunk = options_.residual_dct_chunk;
  wire::put<uint32_t>(p + 4, chunk == 0 ? 1u : kStateVersion);
  wire::put<uint64_t>(p + 8, numel_);
  wire::put<uint64_t>(p + 16, step_);
  p[24] = has_u ? 1 : 0;
  wire::put<uint16_t>(p + 26, static_cast<uint16_t>(chunk));
  wire::put<float>(p + 28, last_threshold_);
  wire::put<float>(p + 32, prev_threshold_);
  uint8_t* at = p + kStateHeader;
  if (has_u) {
    std::memcpy(at, u_.data(), numel_ * 4);
    at += numel_ * 4;
  }
  if (numel_) std::memcpy(at, v_.data(), numel_ * 4);
  wire::put<uint32_t>(p + kStateHeader + arrays, wire::crc32c(p, kStateHeader + arrays));
  return out;
}

void DgcCompressor::load_state(const uint8_t* data, size_t size) {
  if (data == nullptr || size < kStateHeader + 4)
    throw CorruptPayload("DGC state blob is truncated (" + std::to_string(size) + " bytes)");
  if (wire::get<uint32_t>(data) != kStateMagic)
    throw CorruptPayload("DGC state blob has a bad magic number");
  const uint32_t version = wire::get<uint32_t>(data + 4);
  if (version < 1 || version > kStateVersion)
    throw StateError("DGC state blob has version " + std::to_string(version) +
                     ", this build restores versions 1 to " + std::to_string(kStateVersion));
  const uint32_t chunk = version == 1 ? 0u : wire::get<uint16_t>(data + 26);
  if (chunk != options_.residual_dct_chunk) {
    auto domain = [](uint32_t c) {
      return c == 0 ? std::string("elements")
                    : "chunked-DCT coefficients (chunk " + std::to_string(c) + ")";
    };
    throw StateError("DGC state blob holds a residual of " + domain(chunk) +
                     ", this tensor's codec keeps " + domain(options_.residual_dct_chunk) +
                     " (GRADEX_ADAM_TRANSFORM / GRADEX_ADAM_DCT_CHUNK differ from the saving run)");
  }
  const uint64_t numel = wire::get<uint64_t>(data + 8);
  if (numel != numel_)
    throw StateError("DGC state blob holds " + std::to_string(numel) +
                     " elements, this tensor has " + std::to_string(numel_));
  const bool has_u = data[24] != 0;
  if (has_u != !u_.empty())
    throw StateError(std::string("DGC state blob ") + (has_u ? "has" : "lacks") +
                     " a momentum buffer but this compressor's momentum is " +
                     std::to_string(options_.momentum));
  const size_t arrays = (has_u ? 2 : 1) * numel_ * sizeof(float);
  if (size != kStateHeader + arrays + 4)
    throw CorruptPayload("DGC state blob has " + std::to_string(size) + " bytes, expected " +
                         std::to_string(kStateHeader + arrays + 4));
  if (wire::crc32c(data, kStateHeader + arrays) !=
      wire::get<uint32_t>(data + kStateHeader + arrays))
    throw CorruptPayload("DGC state blob checksum mismatch");
  step_ = wire::get<uint64_t>(data + 16);
  last_threshold_ = wire::get<float>(data + 28);
  prev_threshold_ = wire::get<float>(data + 32);
  const uint8_t* at = data + kStateHeader;
  if (has_u) {
    std::memcpy(u_.data(), at, numel_ * 4);
    at += numel_ * 4;
  }
  if (numel_) std::memcpy(v_.data(), at, numel_ * 4);
}

}  // namespace gradex::compress
