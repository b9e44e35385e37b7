// libFuzzer target for the sealed-frame parser (comm/seal/seal.h: Opener), transport-free. The
// input is a stream of chunks [u8 op][u8 tag][u16 little-endian length][bytes]:
//   op % 4 == 0  the bytes as a received frame: it must be refused (the fuzzer cannot forge a tag)
//   op % 4 == 1  the bytes sealed by the genuine peer and opened: must open, bit-exact
//   op % 4 == 2  sealed, then one bit flipped (position from the bytes): must be refused
//   op % 4 == 3  the last genuine frame again (a replay), under the given tag: must be refused
// Both ciphers (bit 7 of the first byte). A crash, a sanitizer report, an escaping exception other
// than SealViolation, an accepted forgery or a genuine frame refused is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/seal/seal.h"

using namespace gradex::comm::seal;

namespace {

Key key_of(uint8_t first) {
  Key k{};
  for (size_t i = 0; i < k.size(); ++i)
    k[i] = static_cast<uint8_t>(first * 7 + i);
  return k;
}

bool refused(Opener& o, uint64_t tag, const std::vector<uint8_t>& frame) {
  std::vector<uint8_t> out(frame.size());
  try {
    o.open(tag, frame.data(), frame.size(), out.data());
  } catch (const SealViolation&) {
    return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Cipher cipher = (data[0] & 0x80) ? Cipher::kAes256Gcm : Cipher::kChaCha20Poly1305;
  Sealer sealer(cipher, key_of(1));
  Opener opener(cipher, key_of(1), 1);
  std::vector<uint8_t> last;
  uint64_t last_tag = 0;
  size_t at = 1;
  while (at + 4 <= size) {
    const uint8_t op = data[at];
    const uint64_t tag = data[at + 1];
    size_t len = static_cast<size_t>(data[at + 2]) | static_cast<size_t>(data[at + 3]) << 8;
    at += 4;
    len = std::min(len, size - at);
    const uint8_t* bytes = data + at;
    at += len;
    switch (op % 4) {
      case 0:
        if (!refused(opener, tag, std::vector<uint8_t>(bytes, bytes + len))) std::abort();
        break;
      case 1:
      case 2: {
        std::vector<uint8_t> frame(len + kOverheadBytes);
        sealer.seal(tag, bytes, len, frame.data());
        if (op % 4 == 2) {
          const size_t bit = (len > 0 ? bytes[0] * 131u + len : 7u) % (frame.size() * 8);
          frame[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
          if (!refused(opener, tag, frame)) std::abort();
          break;
        }
        std::vector<uint8_t> out(len);
        try {
          opener.open(tag, frame.data(), frame.size(), out.data());
        } catch (const SealViolation&) {
          std::abort();  // a genuine frame, in order: must open
        }
        if (len > 0 && std::memcmp(out.data(), bytes, len) != 0) std::abort();
        last = frame;
        last_tag = tag;
        break;
      }
      case 3:
        if (!last.empty() && !refused(opener, tag == 0 ? last_tag : tag, last)) std::abort();
        break;
    }
  }
  return 0;
}
