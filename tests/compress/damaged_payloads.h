// A check shared by the tests of codecs whose payloads are summed across ranks (Adam codecs): a
// payload damaged in its middle or cut short is refused as a CorruptPayload naming the tensor and
// the rank it came from, never summed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "compress/backend/backend.h"
#include "tests/compress/test_util.h"

namespace gradex::compress::test {

// `rank0` and `rank1` are the same tensor's codec on two ranks, `n` its elements, `key` its name.
// Each encodes one step of its own gradient; rank 0 then sums its payload with rank 1's, damaged.
template <typename Codec>
void expect_damaged_payloads_refused(Codec& rank0, Codec& rank1, size_t n, const std::string& key,
                                     backend::Stream& stream) {
  std::vector<uint8_t> own, theirs;
  std::vector<float> g0 = random_grad(n, 1), g1 = random_grad(n, 2);
  rank0.encode_step(g0.data(), 1.0f, stream, own);
  rank1.encode_step(g1.data(), 1.0f, stream, theirs);
  auto refusal = [&](const std::vector<uint8_t>& bad) {
    std::vector<float> out(n, 0.0f);
    try {
      rank0.sum_payloads({{own.data(), own.size()}, {bad.data(), bad.size()}}, 0.5f, out.data(),
                         stream);
    } catch (const CorruptPayload& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string named = "tensor '" + key + "' from rank 1";
  std::vector<uint8_t> flipped = theirs;
  flipped[flipped.size() / 2] ^= 0x40;
  EXPECT_NE(refusal(flipped).find(named), std::string::npos) << refusal(flipped);
  std::vector<uint8_t> truncated(theirs.begin(), theirs.begin() + theirs.size() - 7);
  EXPECT_NE(refusal(truncated).find(named), std::string::npos) << refusal(truncated);
  EXPECT_NE(refusal({}).find(named), std::string::npos) << refusal({});
}

}  // namespace gradex::compress::test
