// The network model of gradex-delayline (bench/cluster/delayline/link.h): a pipe serializes at its
// rate behind its backlog and drops at a full queue; a topology's paths cross the right pipes.
#include <gtest/gtest.h>

#include <stdexcept>

#include "link.h"

namespace gradex::delayline {
namespace {

TEST(Pipe, SerializesBackToBackPacketsAtItsRate) {
  Pipe pipe(8e6, 1 << 20);                       // 1 byte per microsecond
  EXPECT_EQ(pipe.admit(0, 1000), 1000000);       // 1000 bytes: 1 ms
  EXPECT_EQ(pipe.admit(0, 1000), 2000000);       // queued behind the first
  EXPECT_EQ(pipe.admit(5000000, 500), 5500000);  // idle again: starts at once
}

TEST(Pipe, DropsWhatDoesNotFitTheQueue) {
  Pipe pipe(8e6, 2500);
  EXPECT_EQ(pipe.admit(0, 1500), 1500000);        // an idle transmitter always accepts
  EXPECT_EQ(pipe.admit(0, 1000), 2500000);        // 1500 queued + 1000 = 2500: fits
  EXPECT_EQ(pipe.admit(0, 1), -1);                // full
  EXPECT_EQ(pipe.admit(1500000, 1000), 3500000);  // 1000 left queued: room again
}

TEST(Topology, OneRegionIsNicToNicWithTheDelay) {
  TopologySpec spec;
  spec.region_of = {0, 0, 0};
  spec.intra = {1e9, 25000000};
  Topology topo(spec);
  const auto& path = topo.path(0, 2);
  ASSERT_EQ(path.size(), 2u);
  EXPECT_EQ(path[0].delay_ns, 25000000);
  EXPECT_EQ(path[1].delay_ns, 0);
  EXPECT_FALSE(path[0].inter_region || path[1].inter_region);  // no WAN hop in one region
  EXPECT_EQ(topo.path(1, 2)[1].pipe, path[1].pipe);            // one downlink per receiver
  EXPECT_EQ(topo.path(0, 1)[0].pipe, path[0].pipe);            // one uplink per sender
}

TEST(Topology, RegionsShareOnePipePerDirection) {
  TopologySpec spec;
  spec.region_of = {0, 0, 1, 1};
  spec.intra = {10e9, 250000};
  spec.inter = {1e9, 25000000};
  Topology topo(spec);
  EXPECT_EQ(topo.path(0, 1).size(), 2u);
  EXPECT_EQ(topo.path(0, 1)[0].delay_ns, 250000);
  const auto& across = topo.path(0, 2);
  ASSERT_EQ(across.size(), 3u);
  EXPECT_EQ(across[1].delay_ns, 25000000);
  EXPECT_DOUBLE_EQ(across[1].pipe->rate_bps(), 1e9);
  EXPECT_TRUE(across[1].inter_region);  // the WAN hop, and only it
  EXPECT_FALSE(across[0].inter_region);
  EXPECT_FALSE(across[2].inter_region);
  EXPECT_FALSE(topo.path(0, 1)[0].inter_region);
  EXPECT_FALSE(topo.path(0, 1)[1].inter_region);
  EXPECT_EQ(topo.path(1, 3)[1].pipe, across[1].pipe);  // region 0 -> 1: shared
  EXPECT_NE(topo.path(2, 0)[1].pipe, across[1].pipe);  // the other direction: its own
}

TEST(Topology, RegionPairsCanDifferFromTheDefault) {
  TopologySpec spec;
  spec.region_of = {0, 1, 2};
  spec.intra = {10e9, 0};
  spec.inter = {1e9, 20000000};
  spec.inter_pairs = parse_inter_pairs("2-0:500mbit,150ms;1-2:1gbit,75ms");
  Topology topo(spec);
  EXPECT_EQ(topo.path(0, 1)[1].delay_ns, 20000000);
  EXPECT_EQ(topo.path(0, 2)[1].delay_ns, 150000000);
  EXPECT_EQ(topo.path(2, 0)[1].delay_ns, 150000000);
  EXPECT_DOUBLE_EQ(topo.path(2, 0)[1].pipe->rate_bps(), 5e8);
  EXPECT_EQ(topo.path(2, 1)[1].delay_ns, 75000000);
  spec.inter_pairs = parse_inter_pairs("0-3:1gbit,1ms");
  EXPECT_THROW(Topology{spec}, std::invalid_argument);
  EXPECT_THROW(parse_inter_pairs("0:1gbit,1ms"), std::invalid_argument);
}

TEST(Topology, RejectsAnEmptyRegion) {
  TopologySpec spec;
  spec.region_of = {0, 2};
  spec.intra = spec.inter = {1e9, 0};
  EXPECT_THROW(Topology{spec}, std::invalid_argument);
}

TEST(Parse, RatesTimesAndLinks) {
  EXPECT_DOUBLE_EQ(parse_rate("1gbit"), 1e9);
  EXPECT_DOUBLE_EQ(parse_rate("100mbit"), 1e8);
  EXPECT_DOUBLE_EQ(parse_rate("2.5gbit"), 2.5e9);
  EXPECT_EQ(parse_time("0.25ms"), 250000);
  EXPECT_EQ(parse_time("100us"), 100000);
  EXPECT_EQ(parse_link("1gbit,25ms").delay_ns, 25000000);
  EXPECT_THROW(parse_rate("1gbps"), std::invalid_argument);
  EXPECT_THROW(parse_time("25"), std::invalid_argument);
  EXPECT_THROW(parse_link("1gbit"), std::invalid_argument);
}

}  // namespace
}  // namespace gradex::delayline
