// What the encoded allreduce tests share: a call whose codecs refuse every piece it receives.
#pragma once

#include <string>
#include <vector>

#include "base/error.h"
#include "comm/collectives.h"
#include "outer/outer.h"

namespace gradex::test {

// A codec whose validate() refuses every piece: a collective fails, naming the phase, the sender
// and the buffer, before anything is summed.
class RefusingCodec : public outer::Fp32Codec {
 public:
  void validate(const uint8_t*, size_t, size_t, const std::string& what) const override {
    throw CorruptPayload(what + ": refused");
  }
};

// Runs `collective(buffers, options)` on one 100-element buffer "tensor 'w'" whose codecs refuse
// every piece, with options.name "test".
template <typename Collective>
void call_refusing(Collective&& collective) {
  RefusingCodec contribution, result;
  std::vector<float> v(100, 1.0f);
  std::vector<comm::EncodedBuffer> buffers{
      {&contribution, &result, v.data(), v.data(), v.size(), "tensor 'w'"}};
  comm::EncodedAllreduceOptions options;
  options.name = "test";
  collective(buffers, options);
}

}  // namespace gradex::test
