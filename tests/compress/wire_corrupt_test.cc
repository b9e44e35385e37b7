// The decoder rejects truncated, damaged, forged and random payloads with CorruptPayload and a
// message that says what is wrong. Forged payloads carry a valid checksum, so the structural
// checks behind it are exercised too.
#include <gtest/gtest.h>

#include <random>

#include "compress/compress.h"
#include "compress/wire/bytes.h"
#include "compress/wire/checksum.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

std::vector<uint8_t> sample_payload(IndexCoding coding, DType dtype = DType::kFloat32,
                                    int zstd = 0) {
  std::vector<uint32_t> idx = {2, 3, 40, 41, 90, 300, 301, 999};
  std::vector<float> val = {1, -2, 3.5f, 4, -5, 6, 7, 8};
  std::vector<uint8_t> out;
  wire::encode({1000, idx.data(), val.data(), idx.size(), dtype}, 5, {coding, zstd}, out);
  return out;
}

// Re-signs a payload after a deliberate edit so that only the structural checks can catch it.
void resign(std::vector<uint8_t>& p) {
  uint32_t crc = wire::crc32c(p.data(), 44);
  crc = wire::crc32c(p.data() + wire::kHeaderBytes, p.size() - wire::kHeaderBytes, crc);
  wire::put<uint32_t>(p.data() + 44, crc);
}

std::string decode_error(const std::vector<uint8_t>& p) {
  try {
    wire::decode(p.data(), p.size());
  } catch (const CorruptPayload& e) {
    return e.what();
  }
  return "";
}

TEST(WireCorrupt, EveryTruncationIsRejected) {
  for (IndexCoding c : {IndexCoding::kVarint, IndexCoding::kRice, IndexCoding::kBitmap}) {
    auto p = sample_payload(c);
    for (size_t len = 0; len < p.size(); ++len) {
      std::vector<uint8_t> cut(p.begin(), p.begin() + len);
      ASSERT_NE(decode_error(cut), "") << "length " << len;
    }
  }
}

TEST(WireCorrupt, EverySingleBitFlipIsRejected) {
  for (IndexCoding c : {IndexCoding::kVarint, IndexCoding::kRice, IndexCoding::kBitmap}) {
    auto p = sample_payload(c, DType::kFloat16, c == IndexCoding::kBitmap ? 3 : 0);
    for (size_t bit = 0; bit < p.size() * 8; ++bit) {
      auto q = p;
      q[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      ASSERT_NE(decode_error(q), "") << "bit " << bit;
    }
  }
}

TEST(WireCorrupt, HeaderFieldsAreNamedInTheError) {
  auto p = sample_payload(IndexCoding::kVarint);
  auto q = p;
  q[0] = 'X';
  EXPECT_NE(decode_error(q).find("magic"), std::string::npos);
  q = p;
  q[4] = 2;
  EXPECT_NE(decode_error(q).find("version 2"), std::string::npos);
  q = p;
  wire::put<uint32_t>(q.data() + 24, 2000);  // selected > numel
  resign(q);
  EXPECT_NE(decode_error(q).find("exceeds the element count"), std::string::npos);
  q = p;
  q[44] ^= 1;
  EXPECT_NE(decode_error(q).find("checksum"), std::string::npos);
  q = p;
  q.push_back(0);
  EXPECT_NE(decode_error(q).find("length"), std::string::npos);
}

TEST(WireCorrupt, OutOfRangeIndicesAreRejected) {
  auto p = sample_payload(IndexCoding::kVarint);
  // Shrink numel below the last index (999) and re-sign: the index check must fire.
  wire::put<uint64_t>(p.data() + 16, 500);
  resign(p);
  std::string e = decode_error(p);
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
}

TEST(WireCorrupt, ForgedIndexSectionsAreRejected) {
  // varint: a continuation bit on the last gap runs past the section.
  auto p = sample_payload(IndexCoding::kVarint);
  p[wire::kHeaderBytes + 7] |= 0x80;
  resign(p);
  EXPECT_NE(decode_error(p), "");
  // bitmap: one bit more than the declared count.
  p = sample_payload(IndexCoding::kBitmap);
  p[wire::kHeaderBytes] |= 1;
  resign(p);
  EXPECT_NE(decode_error(p).find("more than the declared"), std::string::npos);
  // rice: a parameter with another coding.
  p = sample_payload(IndexCoding::kVarint);
  p[31] = 3;
  resign(p);
  EXPECT_NE(decode_error(p).find("rice parameter"), std::string::npos);
  // rice: a section of all ones (unary runs longer than one 64-bit look) is rejected cleanly.
  p = sample_payload(IndexCoding::kRice);
  std::fill(p.begin() + wire::kHeaderBytes, p.begin() + wire::kHeaderBytes + p[32], 0xff);
  resign(p);
  EXPECT_NE(decode_error(p), "");
  // rice: flipping coded bits changes gaps; either the range, padding or count check fires.
  p = sample_payload(IndexCoding::kRice);
  for (size_t b = wire::kHeaderBytes; b < wire::kHeaderBytes + p[32]; ++b) {
    auto q = p;
    q[b] = 0xff;
    resign(q);
    try {
      wire::decode(q.data(), q.size());
    } catch (const CorruptPayload&) {
    }
  }
}

TEST(WireCorrupt, RandomAndMutatedInputsNeverCrash) {
  std::mt19937_64 rng(99);
  std::vector<std::vector<uint8_t>> seeds = {
      sample_payload(IndexCoding::kVarint), sample_payload(IndexCoding::kRice, DType::kBFloat16),
      sample_payload(IndexCoding::kBitmap, DType::kFloat16, 3)};
  wire::DecodedPayload out;
  size_t accepted = 0;
  for (int i = 0; i < 30000; ++i) {
    std::vector<uint8_t> q;
    if (i % 3 == 0) {
      q.resize(rng() % 128);
      for (auto& b : q)
        b = static_cast<uint8_t>(rng());
    } else {
      q = seeds[i % seeds.size()];
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
        q[rng() % q.size()] = static_cast<uint8_t>(rng());
      if (i % 2) resign(q);
    }
    try {
      wire::decode(q.data(), q.size(), out);
      ++accepted;
      for (size_t j = 0; j < out.indices.size(); ++j) {
        ASSERT_LT(out.indices[j], out.header.numel);
        if (j) {
          ASSERT_GT(out.indices[j], out.indices[j - 1]);
        }
      }
    } catch (const CorruptPayload&) {
    }
  }
  SUCCEED() << accepted << " mutated payloads were still valid";
}

}  // namespace
}  // namespace gradex::compress
