// The sealed data plane's cost (comm/seal/seal.h): sealing and opening frames of 256 KiB (a ring
// chunk), 4 MiB and 64 KiB with AES-256-GCM and ChaCha20-Poly1305, one thread, against a plain copy
// of the same bytes (what a staging buffer without cryptography would cost).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "comm/seal/seal.h"
#include "micro.h"

namespace gradex::bench {
namespace {

using comm::seal::Cipher;

comm::seal::Key fixed_key(uint8_t first) {
  comm::seal::Key k{};
  for (size_t i = 0; i < k.size(); ++i)
    k[i] = static_cast<uint8_t>(first + i);
  return k;
}

void bm_seal(benchmark::State& state, Cipher cipher, size_t bytes) {
  std::vector<uint8_t> in(bytes, 0x5a), frame(bytes + comm::seal::kOverheadBytes);
  comm::seal::Sealer sealer(cipher, fixed_key(1));
  for (auto _ : state) {
    sealer.seal(7, in.data(), bytes, frame.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void bm_open(benchmark::State& state, Cipher cipher, size_t bytes) {
  std::vector<uint8_t> in(bytes, 0x5a), out(bytes);
  comm::seal::Sealer sealer(cipher, fixed_key(1));
  comm::seal::Opener opener(cipher, fixed_key(1), 1);
  // A fresh frame per iteration (an opened one is a replay), sealed outside the timed region.
  std::vector<uint8_t> frame(bytes + comm::seal::kOverheadBytes);
  for (auto _ : state) {
    state.PauseTiming();
    sealer.seal(7, in.data(), bytes, frame.data());
    state.ResumeTiming();
    opener.open(7, frame.data(), frame.size(), out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void bm_copy(benchmark::State& state, size_t bytes) {
  std::vector<uint8_t> in(bytes, 0x5a), out(bytes);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

}  // namespace

void register_seal() {
  for (size_t bytes : {size_t{64} << 10, size_t{256} << 10, size_t{4} << 20}) {
    const std::string size = std::to_string(bytes >> 10) + "K";
    for (Cipher c : {Cipher::kAes256Gcm, Cipher::kChaCha20Poly1305}) {
      const std::string name = c == Cipher::kAes256Gcm ? "aes256gcm" : "chacha20poly1305";
      benchmark::RegisterBenchmark(("seal_" + name + "/" + size).c_str(), bm_seal, c, bytes)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("open_" + name + "/" + size).c_str(), bm_open, c, bytes)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(("copy/" + size).c_str(), bm_copy, bytes)->UseRealTime();
  }
}

}  // namespace gradex::bench
