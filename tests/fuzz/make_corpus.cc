// Writes the decoder fuzzer's seed corpus: valid payloads over every index coding, value type and
// the zstd stage, small enough for the fuzzer to mutate quickly. Usage: gradex-fuzz-corpus DIR
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "compress/compress.h"

using namespace gradex;
using namespace gradex::compress;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::mt19937 rng(2024);
  int written = 0;
  const IndexCoding codings[] = {IndexCoding::kVarint, IndexCoding::kRice, IndexCoding::kBitmap};
  const DType types[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (uint64_t numel : {uint64_t{0}, uint64_t{1}, uint64_t{77}, uint64_t{1000}, uint64_t{4096}}) {
    for (IndexCoding coding : codings) {
      for (DType type : types) {
        for (int zstd : {0, 3}) {
          std::vector<uint32_t> idx;
          for (uint32_t i = 0; i < numel; ++i)
            if (rng() % 16 == 0 || (zstd && i >= 10 && i < 60)) idx.push_back(i);
          std::vector<float> val(idx.size());
          for (float& v : val) {
            bool saturated;
            v = half::round_to(static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 64.0f,
                               type, &saturated);
          }
          std::vector<uint8_t> bytes;
          wire::encode({numel, idx.data(), val.data(), idx.size(), type}, rng(), {coding, zstd},
                       bytes);
          char name[96];
          std::snprintf(name, sizeof(name), "/seed-%04llu-%s-%s-z%d.bin",
                        static_cast<unsigned long long>(numel), index_coding_name(coding),
                        dtype_name(type), zstd);
          std::ofstream(dir + name, std::ios::binary)
              .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          ++written;
        }
      }
    }
  }
  std::printf("wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}
