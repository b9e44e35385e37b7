// The dense quantized route's allreduce (sync/data/int8_exchange.h) at 8 and 4 bits over real UCX,
// ranks as threads, 1-4 ranks: bit-identical averages on every rank, exact error feedback (what
// was delivered plus every residual is what was submitted), closeness to the exact mean, and
// refusal of a unit whose pieces do not match; in two phases, in one hop, and alternating (the one
// hop neither uses nor changes the owner residuals the two phases keep).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/topology/host_topology.h"
#include "sync/data/int8_exchange.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using sync::Int8Counters;
using sync::Int8Item;

const std::vector<size_t> kSizes = {0, 1, 127, 128, 129, 1000, 4097};

float draw_input(int rank, int round, size_t tensor, size_t i) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 7919 + round * 104729 + tensor * 31 + i));
  std::normal_distribution<float> d(0.0f, 1.0f + static_cast<float>(tensor));
  return d(rng);
}

// Every rank's input of every round, drawn once before the ranks start: each draw seeds a generator
// of its own, and the checks read every value P * rounds times (seconds per world otherwise,
// minutes under ThreadSanitizer). Read-only while the ranks run.
class Inputs {
 public:
  Inputs(int world, int rounds) : rounds_(rounds) {
    for (size_t n : kSizes) {
      offset_.push_back(per_round_);
      per_round_ += n;
    }
    values_.resize(static_cast<size_t>(world * rounds) * per_round_);
    for (int q = 0; q < world; ++q)
      for (int round = 0; round < rounds; ++round)
        for (size_t t = 0; t < kSizes.size(); ++t)
          for (size_t i = 0; i < kSizes[t]; ++i)
            values_[index(q, round, t, i)] = draw_input(q, round, t, i);
  }
  float operator()(int rank, int round, size_t tensor, size_t i) const {
    return values_[index(rank, round, tensor, i)];
  }

 private:
  size_t index(int rank, int round, size_t tensor, size_t i) const {
    return static_cast<size_t>(rank * rounds_ + round) * per_round_ + offset_[tensor] + i;
  }
  int rounds_;
  size_t per_round_ = 0;
  std::vector<size_t> offset_;
  std::vector<float> values_;
};

enum class Hops { kTwo, kOne, kAlternating };

// Whether element i of an n-element tensor lies in a local shard that rank q owns under `topo`
// (every element when there is no layout).
bool owns_local_shard(const comm::HostTopology* topo, int q, size_t n, size_t i) {
  if (topo == nullptr) return true;
  const size_t S = static_cast<size_t>(topo->max_local());
  const size_t L = topo->hosts[static_cast<size_t>(topo->host_of[static_cast<size_t>(q)])].size();
  for (size_t s = 0; s < S; ++s) {
    if (s % L != static_cast<size_t>(topo->local_index[static_cast<size_t>(q)])) continue;
    const comm::Segment seg =
        comm::encoded_segment(n, 128, static_cast<int>(S), static_cast<int>(s));
    if (i >= seg.begin && i < seg.begin + seg.count) return true;
  }
  return false;
}

// `hosts`: each rank's host for the layout form (empty: the flat exchange).
void check_world(int P, int bits, Hops hops = Hops::kTwo, std::vector<std::string> hosts = {}) {
  const int rounds = 6;
  const comm::HostTopology layout = comm::host_topology(hosts, P);
  const comm::HostTopology* topo = hosts.empty() ? nullptr : &layout;
  const Inputs input(P, rounds);
  run_ranks(P, [&](comm::Communicator& c) {
    std::vector<std::vector<float>> residual, owner, delivered;  // delivered: sum of averages
    for (size_t n : kSizes) {
      residual.emplace_back(n, 0.0f);
      owner.emplace_back(n, 0.0f);
      delivered.emplace_back(n, 0.0f);
    }
    std::vector<std::vector<float>> values(kSizes.size());
    for (int round = 0; round < rounds; ++round) {
      std::vector<Int8Item> items;
      for (size_t t = 0; t < kSizes.size(); ++t) {
        values[t].resize(kSizes[t]);
        for (size_t i = 0; i < kSizes[t]; ++i)
          values[t][i] = input(c.rank(), round, t, i);
        static const std::string key = "t";
        items.push_back({values[t].data(), kSizes[t], residual[t].data(), owner[t].data(), &key});
      }
      Int8Counters counters;
      const bool one_hop = hops == Hops::kOne || (hops == Hops::kAlternating && round % 2 == 1);
      const auto owner_before = owner;
      sync::int8_allreduce(c, items, bits, counters, one_hop, topo);
      if (counters.nonfinite != 0) throw std::runtime_error("non-finite counted");
      if (one_hop && owner != owner_before)
        throw std::runtime_error("the one hop changed an owner residual");
      for (size_t t = 0; t < kSizes.size(); ++t) {
        const size_t n = kSizes[t];
        // Bit-identical on every rank.
        auto all = comm::allgatherv(c, values[t].data(), 4 * n);
        for (const auto& other : all)
          if (other.size() != 4 * n || (n && std::memcmp(other.data(), values[t].data(), 4 * n)))
            throw std::runtime_error("ranks hold different averages");
        for (size_t i = 0; i < n; ++i) {
          float mean = 0.0f;
          for (int q = 0; q < P; ++q)
            mean += input(q, round, t, i);
          mean /= static_cast<float>(P);
          // Two quantizations plus carried residuals: a few steps of (block max) / (largest code).
          const float step = 6.0f * (1.0f + static_cast<float>(t)) / (bits == 4 ? 7.0f : 127.0f);
          if (std::fabs(values[t][i] - mean) > 4.0f * step)
            throw std::runtime_error("far from the mean: tensor " + std::to_string(t) + "[" +
                                     std::to_string(i) + "] " + std::to_string(values[t][i]) +
                                     " vs " + std::to_string(mean));
          delivered[t][i] += values[t][i];
        }
      }
    }
    // Error feedback: P * (delivered + owner residual) + sum of every rank's residual equals
    // everything submitted, up to the rounding of the owners' sums and divisions.
    for (size_t t = 0; t < kSizes.size(); ++t) {
      const size_t n = kSizes[t];
      auto res = comm::allgatherv(c, residual[t].data(), 4 * n);
      auto own = comm::allgatherv(c, owner[t].data(), 4 * n);
      for (size_t i = 0; i < n; ++i) {
        double submitted = 0, kept = 0, owner_kept = 0;
        for (int q = 0; q < P; ++q) {
          for (int round = 0; round < rounds; ++round)
            submitted += input(q, round, t, i);
          float r, o;
          std::memcpy(&r, res[static_cast<size_t>(q)].data() + 4 * i, 4);
          std::memcpy(&o, own[static_cast<size_t>(q)].data() + 4 * i, 4);
          kept += r;
          owner_kept += o;
          // Only the owner of element i keeps an owner residual for it (with a layout: the
          // owner of its local shard).
          const comm::Segment s = sync::int8_segment(n, P, q);
          if (topo == nullptr && o != 0.0f && (i < s.begin || i >= s.begin + s.count))
            throw std::runtime_error("an owner residual outside the owner's segment");
          if (o != 0.0f && !owns_local_shard(topo, q, n, i))
            throw std::runtime_error("an owner residual outside the rank's local shards");
        }
        const double got = P * (static_cast<double>(delivered[t][i]) + owner_kept) + kept;
        const double tol = 1e-5 * (1.0 + std::fabs(submitted)) * rounds * P * (1.0 + t);
        if (std::fabs(got - submitted) > tol)
          throw std::runtime_error("error feedback lost mass: tensor " + std::to_string(t) + "[" +
                                   std::to_string(i) + "] " + std::to_string(got) + " vs " +
                                   std::to_string(submitted));
      }
    }
  });
}

TEST(Int8Exchange, OneRank) {
  check_world(1, 8);
}
TEST(Int8Exchange, TwoRanks) {
  check_world(2, 8);
}
TEST(Int8Exchange, ThreeRanks) {
  check_world(3, 8);
}
TEST(Int8Exchange, FourRanks) {
  check_world(4, 8);
}
TEST(Int8Exchange, FourBitsOneRank) {
  check_world(1, 4);
}
TEST(Int8Exchange, FourBitsThreeRanks) {
  check_world(3, 4);
}
TEST(Int8Exchange, FourBitsFourRanks) {
  check_world(4, 4);
}
TEST(Int8Exchange, OneHop) {
  for (int P : {1, 2, 3, 4})
    for (int bits : {8, 4})
      check_world(P, bits, Hops::kOne);
}
TEST(Int8Exchange, OneHopAlternatingWithTwoPhases) {
  for (int P : {2, 3, 4})
    for (int bits : {8, 4})
      check_world(P, bits, Hops::kAlternating);
}

// With a layout: hosts of two ranks, of uneven sizes, and of one rank each; in two phases and in
// one hop among the shards' owners.
TEST(Int8Exchange, HierarchicalLayouts) {
  check_world(4, 8, Hops::kTwo, {"a", "a", "b", "b"});
  check_world(4, 4, Hops::kTwo, {"a", "a", "b", "b"});
  check_world(5, 4, Hops::kTwo, {"x", "y", "x", "z", "y"});
  check_world(3, 4, Hops::kTwo, {"a", "b", "c"});
  check_world(4, 4, Hops::kAlternating, {"a", "b", "a", "b"});
  check_world(2, 4, Hops::kTwo, {"a", "a"});  // one host: the sums alone
}

// A rank whose unit holds a different tensor size sends pieces of another length: every rank
// fails (CorruptPayload where the message is short, MismatchError where it is longer than the
// posted receive), before anything is summed.
void check_mismatch_refused(int bits, bool one_hop = false) {
  const int P = 3;
  std::vector<std::string> errors(P);
  try {
    run_ranks(P, [&](comm::Communicator& c) {
      const size_t n = c.rank() == 1 ? 1000 : 1200;
      std::vector<float> v(n, 1.0f), r(n, 0.0f), o(n, 0.0f);
      const std::string key = "w";
      std::vector<Int8Item> items{{v.data(), n, r.data(), o.data(), &key}};
      Int8Counters counters;
      try {
        sync::int8_allreduce(c, items, bits, counters, one_hop);
      } catch (const Error& e) {
        errors[static_cast<size_t>(c.rank())] = e.what();
        throw;
      }
    });
    FAIL() << "a mismatched unit was summed";
  } catch (const std::exception&) {
  }
  for (int q = 0; q < P; ++q)
    EXPECT_FALSE(errors[static_cast<size_t>(q)].empty()) << "rank " << q << " did not fail";
  const std::string phase =
      std::to_string(bits) + (one_hop ? "-bit gather" : "-bit reduce-scatter");
  EXPECT_NE(errors[0].find(phase), std::string::npos) << errors[0];
}

TEST(Int8Exchange, MismatchedUnitIsRefused) {
  check_mismatch_refused(8);
}
TEST(Int8Exchange, FourBitsMismatchedUnitIsRefused) {
  check_mismatch_refused(4);
}
TEST(Int8Exchange, OneHopMismatchedUnitIsRefused) {
  check_mismatch_refused(8, true);
  check_mismatch_refused(4, true);
}

}  // namespace
}  // namespace gradex::test
