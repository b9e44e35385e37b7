#include "sync/policy/link_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/error.h"
#include "sync/data/byte_io.h"

namespace gradex::sync {
namespace {

constexpr uint32_t kModelMagic = 0x47584c4d;  // "GXLM"
constexpr uint64_t kMaxBursts = 8;

// The most bytes per rank that travel in one hop (every rank's payload to every rank) rather than
// in a direct allreduce's two phases while the hop's extra arrivals, (P-1)(P-2)/P of them at
// `beta` each, cost at most `budget_s`; `cap` where they cost nothing (fewer than three ranks, or
// a link without a time per byte).
uint64_t one_hop_bytes_within(int world, double beta, double budget_s, uint64_t cap) {
  const double P = world;
  const double extra_per_byte = (P - 1) * (P - 2) / P * beta;
  if (world < 3 || extra_per_byte <= 0) return cap;
  const double limit = budget_s / extra_per_byte;
  return limit >= static_cast<double>(cap) ? cap : static_cast<uint64_t>(limit);
}

}  // namespace

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::kHost:
      return "inside a host";
    case Tier::kRegion:
      return "inside a region";
    case Tier::kAcross:
      return "across regions";
  }
  return "?";
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kReduceScatter:
      return "reduce-scatter";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kBroadcast:
      return "broadcast";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kDirect:
      return "direct";
    case Algorithm::kDirectUnsized:
      return "direct (unsized)";
    case Algorithm::kOneHop:
      return "one hop";
  }
  return "?";
}

cost::Terms collective_terms(Collective c, Algorithm a, double bytes, int ranks) {
  if ((a == Algorithm::kOneHop && c != Collective::kAllreduce) ||
      (a == Algorithm::kDirectUnsized && c != Collective::kAllgather))
    throw InvalidArgument(std::string("link model: no ") + algorithm_name(a) + " " +
                          collective_name(c));
  if (ranks < 2) return {};
  const double P = ranks;
  const bool ring = a == Algorithm::kRing;
  switch (c) {
    case Collective::kAllreduce:
      if (a == Algorithm::kOneHop) return {1.0, (P - 1) * bytes};
      // Two ranks swap their buffers directly: one message each way.
      return {ring ? 2 * (P - 1) : ranks == 2 ? 1.0 : 2.0, 2 * (P - 1) / P * bytes};
    case Collective::kReduceScatter:
      return {ring ? P - 1 : 1.0, (P - 1) / P * bytes};
    case Collective::kAllgather:
      return {ring ? P - 1 : a == Algorithm::kDirectUnsized ? 1.0 : 2.0, (P - 1) * bytes};
    case Collective::kBroadcast:
      return ring ? cost::Terms{P - 1, bytes} : cost::Terms{1.0, (P - 1) * bytes};
  }
  return {};
}

LinkModel LinkModel::single(const cost::LinkParams& link, Tier flat, int world) {
  LinkModel m;
  m.tiers[static_cast<size_t>(flat)] = link;
  m.present[static_cast<size_t>(flat)] = true;
  m.flat = flat;
  m.world_size = world;
  return m;
}

double LinkModel::seconds(Tier t, Collective c, Algorithm a, uint64_t bytes, int ranks) const {
  return collective_terms(c, a, static_cast<double>(bytes), ranks).seconds(link(t));
}

double LinkModel::seconds(Collective c, Algorithm a, uint64_t bytes) const {
  const double wire = seconds(flat, c, a, bytes, world_size);
  if (world_size < 3 || a == Algorithm::kRing || c == Collective::kBroadcast) return wire;
  // The direct phases: every other rank's share converges on each rank at once.
  const double P = world_size;
  const double b = static_cast<double>(bytes);
  switch (c) {
    case Collective::kAllreduce:
      if (a == Algorithm::kOneHop) return wire + incast_seconds((P - 1) * b);
      return wire + 2 * incast_seconds((P - 1) / P * b);
    case Collective::kReduceScatter:
      return wire + incast_seconds((P - 1) / P * b);
    case Collective::kAllgather:
      return wire + incast_seconds((P - 1) * b);
    case Collective::kBroadcast:
      break;
  }
  return wire;
}

double LinkModel::incast_seconds(double arriving) const {
  if (!crosses_hosts() || arriving <= 0) return 0;
  const double rule = arriving * link().beta_s_per_byte > port_queue_s ? kIncastPenalty : 0;
  for (const cost::IncastBurst& b : bursts)
    if (arriving <= static_cast<double>(b.bytes)) return std::min(rule, b.extra_s);
  return rule;
}

double LinkModel::gather_direct_seconds(const std::vector<uint64_t>& following) const {
  const int P = static_cast<int>(following.size());
  if (P < 2) return 0;
  uint64_t total = 0, largest = 0, smallest = UINT64_MAX;
  for (uint64_t s : following) {
    total += s;
    largest = std::max(largest, s);
    smallest = std::min(smallest, s);
  }
  const double uplink = static_cast<double>(P - 1) * static_cast<double>(largest);
  const double downlink = static_cast<double>(total - smallest);  // the busiest receiver's
  return link().seconds(1.0, std::max(uplink, downlink)) + incast_seconds(downlink);
}

double LinkModel::gather_ring_seconds(const std::vector<uint64_t>& following) const {
  const int P = static_cast<int>(following.size());
  if (P < 2) return 0;
  uint64_t total = 0, smallest = UINT64_MAX;
  for (uint64_t s : following) {
    total += s;
    smallest = std::min(smallest, s);
  }
  return link().seconds(static_cast<double>(P - 1), static_cast<double>(total - smallest));
}

bool LinkModel::gather_ring_for(const std::vector<uint64_t>& following) const {
  return gather_ring_seconds(following) < gather_direct_seconds(following);
}

size_t LinkModel::inline_max(size_t configured) const {
  const cost::LinkParams& l = link();
  if (latency_bound() && l.beta_s_per_byte > 0) {
    const double in_one_latency = l.alpha_s / l.beta_s_per_byte;
    configured = std::max(configured, static_cast<size_t>(std::min(
                                          in_one_latency, static_cast<double>(kLatencyInlineMax))));
  }
  if (!crosses_hosts() || world_size < 2) return configured;
  const double senders = static_cast<double>(world_size - 1);
  if (absorbs(senders * static_cast<double>(configured))) return configured;
  double fits = port_queue_s / l.beta_s_per_byte;
  for (const cost::IncastBurst& b : bursts) {
    if (b.extra_s > l.alpha_s) break;
    fits = std::max(fits, static_cast<double>(b.bytes));
  }
  fits /= senders;
  if (!(fits < static_cast<double>(configured))) return configured;
  return static_cast<size_t>(std::max(0.0, std::floor(fits)));
}

bool LinkModel::dense_direct_for(uint64_t bytes) const {
  return world_size > 1 &&
         seconds(Collective::kAllreduce, Algorithm::kDirect, bytes) <
             kDenseDirectGain * seconds(Collective::kAllreduce, Algorithm::kRing, bytes);
}

uint64_t LinkModel::dense_direct_max_bytes() const {
  if (!dense_direct_for(1)) return 0;
  uint64_t yes = 1, no = uint64_t{1} << 40;
  if (dense_direct_for(no)) return no;
  while (no - yes > 1) {
    const uint64_t mid = yes + (no - yes) / 2;
    (dense_direct_for(mid) ? yes : no) = mid;
  }
  return yes;
}

uint64_t LinkModel::rider_bytes() const {
  return one_hop_bytes_within(world_size, link().beta_s_per_byte, 2 * link().alpha_s,
                              kRiderMaxBytes);
}

double LinkModel::bulk_beta_s_per_byte() const {
  double beta = link().beta_s_per_byte;
  for (const cost::IncastBurst& b : bursts) {
    const double data_s = b.seconds - 2 * link().alpha_s;
    if (b.bytes > 0 && data_s > 0) beta = std::min(beta, data_s / static_cast<double>(b.bytes));
  }
  return beta;
}

uint64_t LinkModel::quantized_one_hop_max_bytes() const {
  if (world_size < 2 || !latency_bound()) return 0;
  return one_hop_bytes_within(world_size, bulk_beta_s_per_byte(),
                              kOneHopLatencyShare * link().alpha_s, UINT64_MAX);
}

std::string LinkModel::describe() const {
  std::string out;
  for (int t = 0; t < kTiers; ++t) {
    if (!present[static_cast<size_t>(t)]) continue;
    const cost::LinkParams& l = tiers[static_cast<size_t>(t)];
    char line[160];
    std::snprintf(line, sizeof line, "%s%s: alpha %.1f us, beta %.3f ns/B (%.2f Gbit/s)%s",
                  out.empty() ? "" : "; ", tier_name(static_cast<Tier>(t)), l.alpha_s * 1e6,
                  l.beta_s_per_byte * 1e9, l.beta_s_per_byte > 0 ? 8e-9 / l.beta_s_per_byte : 0.0,
                  static_cast<Tier>(t) == flat ? " [flat]" : "");
    out += line;
  }
  return out.empty() ? "one rank: no link" : out;
}

std::vector<uint8_t> LinkModel::encode() const {
  ByteWriter w;
  w.put<uint32_t>(kModelMagic);
  for (size_t t = 0; t < kTiers; ++t) {
    w.put<double>(tiers[t].alpha_s);
    w.put<double>(tiers[t].beta_s_per_byte);
    w.put<uint8_t>(tiers[t].measured ? 1 : 0);
    w.put<uint8_t>(present[t] ? 1 : 0);
  }
  w.put<uint8_t>(static_cast<uint8_t>(flat));
  w.put<int32_t>(world_size);
  w.put<double>(port_queue_s);
  w.put<uint64_t>(bursts.size());
  for (const cost::IncastBurst& b : bursts) {
    w.put<uint64_t>(b.bytes);
    w.put<double>(b.extra_s);
    w.put<double>(b.seconds);
  }
  return std::move(w.bytes());
}

LinkModel LinkModel::decode(const uint8_t* data, size_t size) {
  ByteReader r(data, size, "link model");
  if (r.get<uint32_t>() != kModelMagic) throw CorruptPayload("link model: bad magic");
  LinkModel m;
  for (size_t t = 0; t < kTiers; ++t) {
    m.tiers[t].alpha_s = r.get<double>();
    m.tiers[t].beta_s_per_byte = r.get<double>();
    m.tiers[t].measured = r.get<uint8_t>() != 0;
    m.present[t] = r.get<uint8_t>() != 0;
  }
  const auto flat = r.get<uint8_t>();
  if (flat >= kTiers) throw CorruptPayload("link model: tier " + std::to_string(flat));
  m.flat = static_cast<Tier>(flat);
  m.world_size = r.get<int32_t>();
  if (m.world_size < 1)
    throw CorruptPayload("link model: world size " + std::to_string(m.world_size));
  m.port_queue_s = r.get<double>();
  const auto count = r.get<uint64_t>();
  if (count > kMaxBursts) throw CorruptPayload("link model: " + std::to_string(count) + " bursts");
  for (uint64_t i = 0; i < count; ++i) {
    cost::IncastBurst b;
    b.bytes = r.get<uint64_t>();
    b.extra_s = r.get<double>();
    b.seconds = r.get<double>();
    m.bursts.push_back(b);
  }
  r.expect_end();
  return m;
}

}  // namespace gradex::sync
