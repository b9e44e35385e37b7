// sync/'s exchange functions called directly, ranks as threads over real UCX: sparse_average (its
// parallel decode, the zeros written while compressing, reused buffers) must give exactly what the
// plain per-payload path gives: compress, allgatherv, zero-fill, then accumulate in rank order.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "base/config.h"
#include "comm/collectives.h"
#include "sync/byte_io.h"
#include "sync/sparse_exchange.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

std::vector<float> gradient(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(n);
  for (float& x : g)
    x = dist(rng);
  return g;
}

// The reference: the same codecs' plain path, one payload per tensor, in rank order.
void reference_average(comm::Communicator& c,
                       std::vector<std::unique_ptr<sync::SparseCodec>>& codecs,
                       std::vector<std::vector<float>>& values) {
  sync::ByteWriter message;
  for (size_t i = 0; i < codecs.size(); ++i) {
    std::vector<uint8_t> payload;
    codecs[i]->compress(values[i].data(), 1.0f, payload);
    message.put<uint64_t>(payload.size());
    message.put_bytes(payload.data(), payload.size());
  }
  auto all = comm::allgatherv(c, message.bytes().data(), message.bytes().size());
  for (auto& v : values)
    std::fill(v.begin(), v.end(), 0.0f);
  for (int r = 0; r < c.size(); ++r) {
    sync::ByteReader reader(all[static_cast<size_t>(r)].data(), all[static_cast<size_t>(r)].size(),
                            "reference");
    for (size_t i = 0; i < codecs.size(); ++i) {
      uint64_t n = reader.get<uint64_t>();
      codecs[i]->accumulate(reader.get_bytes(n), n, 1.0f / static_cast<float>(c.size()),
                            values[i].data());
    }
  }
}

TEST(SparseAverage, BitIdenticalToThePlainPath) {
  const std::vector<uint64_t> sizes = {300000, 5000, 1 << 19, 70001};
  for (bool ring : {true, false}) {
    run_ranks(3, [&](comm::Communicator& c) {
      config::Config config;
      config.set("GRADEX_SPARSITY", "0.99");
      std::vector<std::unique_ptr<sync::SparseCodec>> fast, plain;
      std::vector<std::string> keys;
      for (size_t i = 0; i < sizes.size(); ++i)
        keys.push_back("t" + std::to_string(i));
      for (size_t i = 0; i < sizes.size(); ++i) {
        const uint64_t id = sync::tensor_key_id(keys[i]);
        fast.push_back(
            std::make_unique<sync::SparseCodec>(keys[i], id, sizes[i], 0.99, config, c.size()));
        plain.push_back(
            std::make_unique<sync::SparseCodec>(keys[i], id, sizes[i], 0.99, config, c.size()));
      }
      sync::SparseCounters counters;
      for (int step = 0; step < 4; ++step) {
        std::vector<std::vector<float>> a, b;
        for (size_t i = 0; i < sizes.size(); ++i) {
          a.push_back(gradient(sizes[i], 1000 * step + 10 * i + c.rank()));
          b.push_back(a.back());
        }
        // Every call: all tensors together, then (step 3) one tensor per call as a pipelined
        // engine would.
        if (step < 3) {
          std::vector<sync::SparseItem> items;
          for (size_t i = 0; i < sizes.size(); ++i)
            items.push_back({&keys[i], fast[i].get(), a[i].data(), 1.0f});
          sync::sparse_average(c, items, counters, ring);
        } else {
          for (size_t i = 0; i < sizes.size(); ++i) {
            std::vector<sync::SparseItem> one = {{&keys[i], fast[i].get(), a[i].data(), 1.0f}};
            sync::sparse_average(c, one, counters, ring);
          }
        }
        if (step < 3) {
          reference_average(c, plain, b);
        } else {
          for (size_t i = 0; i < sizes.size(); ++i) {
            std::vector<std::unique_ptr<sync::SparseCodec>> one;
            one.push_back(std::move(plain[i]));
            std::vector<std::vector<float>> v = {b[i]};
            reference_average(c, one, v);
            b[i] = v[0];
            plain[i] = std::move(one[0]);
          }
        }
        for (size_t i = 0; i < sizes.size(); ++i)
          if (std::memcmp(a[i].data(), b[i].data(), sizes[i] * 4) != 0)
            throw std::runtime_error("tensor " + keys[i] + " differs at step " +
                                     std::to_string(step));
      }
      if (counters.wire_bytes == 0) throw std::runtime_error("no wire bytes counted");
    });
  }
}

TEST(SparseAverage, DamagedPayloadNamesTensorAndRank) {
  // A codec of another key decodes this tensor's payload: refused, naming tensor and rank.
  run_ranks(2, [&](comm::Communicator& c) {
    config::Config config;
    std::string key = "weights";
    sync::SparseCodec codec(key, sync::tensor_key_id(c.rank() == 0 ? key : "other"), 1 << 18, 0.99,
                            config, c.size());
    std::vector<float> g = gradient(1 << 18, 5 + c.rank());
    std::vector<sync::SparseItem> items = {{&key, &codec, g.data(), 1.0f}};
    sync::SparseCounters counters;
    try {
      sync::sparse_average(c, items, counters, true);
    } catch (const CorruptPayload& e) {
      const std::string want =
          "tensor 'weights' from rank " + std::to_string(1 - c.rank()) + ": payload for tensor";
      if (std::string(e.what()).find(want) == std::string::npos)
        throw std::runtime_error(std::string("unexpected message: ") + e.what());
      return;
    }
    throw std::runtime_error("a payload of another key was accepted");
  });
}

}  // namespace
}  // namespace gradex::test
