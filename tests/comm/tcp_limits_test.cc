// The kernel-limits line (comm/topology/tcp_limits.h) as a pure function of the limits and the
// path.
#include "comm/topology/tcp_limits.h"

#include <gtest/gtest.h>

namespace gradex::comm {
namespace {

TcpLimits limits(uint64_t max_bytes, bool slow_start_after_idle) {
  TcpLimits l;
  l.rmem_max = l.wmem_max = max_bytes;
  l.rmem_text = "4096 131072 " + std::to_string(max_bytes);
  l.wmem_text = "4096 16384 " + std::to_string(max_bytes);
  l.slow_start_after_idle = slow_start_after_idle;
  l.read = true;
  return l;
}

TEST(TcpLimits, AWindowBelowRateTimesRoundTripIsNamedWithItsFix) {
  // 4 MiB over 50 ms: 0.67 Gbit/s; 10 Gbit/s needs 62.5 MB.
  const std::string line = tcp_limits_advice(limits(4u << 20, false), 0.05, 10e9);
  EXPECT_NE(line.find("capped at 0.67 Gbit/s"), std::string::npos) << line;
  EXPECT_NE(line.find("sysctl -w net.ipv4.tcp_wmem='4096 16384 62500000'"), std::string::npos)
      << line;
  EXPECT_NE(line.find("sysctl -w net.ipv4.tcp_rmem='4096 131072 62500000'"), std::string::npos)
      << line;
}

TEST(TcpLimits, SlowStartAfterIdleIsNamed) {
  const std::string line = tcp_limits_advice(limits(64u << 20, true), 0.05, 10e9);
  EXPECT_EQ(line.find("capped"), std::string::npos) << line;  // 64 MiB cover 10 Gbit/s x 50 ms
  EXPECT_NE(line.find("sysctl -w net.ipv4.tcp_slow_start_after_idle=0"), std::string::npos) << line;
}

TEST(TcpLimits, NothingToSayWhenTheKernelKeepsUp) {
  EXPECT_EQ(tcp_limits_advice(limits(64u << 20, false), 0.05, 10e9), "");
  EXPECT_EQ(tcp_limits_advice(limits(4u << 20, false), 0.0001, 10e9), "");  // a LAN round trip
  TcpLimits unread;
  EXPECT_EQ(tcp_limits_advice(unread, 0.05, 10e9), "");
}

TEST(TcpLimits, StripedFlowsShareTheNeed) {
  // 4 flows of 4 MiB over 50 ms: 2.68 Gbit/s together; 10 Gbit/s needs 15.6 MB per flow.
  const std::string line = tcp_limits_advice(limits(4u << 20, false), 0.05, 10e9, 4);
  EXPECT_NE(line.find("4 TCP flows per peer are capped at 2.68 Gbit/s"), std::string::npos) << line;
  EXPECT_NE(line.find("tcp_wmem='4096 16384 15625000'"), std::string::npos) << line;
  // 16 flows of 4 MiB cover 10 Gbit/s x 50 ms (10.7 Gbit/s).
  EXPECT_EQ(tcp_limits_advice(limits(4u << 20, false), 0.05, 10e9, 16), "");
}

// The rate the advice sizes windows for: the measured one where the windows did not hold the
// stream, else the fallback. 4 flows of 4 MiB buffers (2 MiB in flight each) at 50 ms carry
// 1.34 Gbit/s: a 1 Gbit/s stream is the link's, and the windows then need no advice.
TEST(TcpLimits, AdviceSizesForTheMeasuredRateWhereTheWindowsDidNotHoldIt) {
  const TcpLimits l = limits(4u << 20, false);
  EXPECT_NEAR(windows_cap_bits(l, 0.05, 4), 4 * 2.0 * (1 << 20) * 8 / 0.05, 1.0);
  EXPECT_EQ(advice_target_bits(l, 0.05, 4, 1e9, 10e9), 1e9);
  EXPECT_EQ(tcp_limits_advice(l, 0.05, advice_target_bits(l, 0.05, 4, 1e9, 10e9), 4), "");
  // At 150 ms the same windows carry 0.45 Gbit/s: a stream at 0.44 may be theirs.
  EXPECT_EQ(advice_target_bits(l, 0.15, 4, 0.44e9, 10e9), 10e9);
  // Nothing measured: the fallback.
  EXPECT_EQ(advice_target_bits(l, 0.05, 4, 0, 10e9), 10e9);
  // A slow link at a long round trip: one flow of those windows carries 16.8 Mbit/s at 1 s, a
  // 10 Mbit/s stream is the link's.
  EXPECT_EQ(advice_target_bits(l, 1.0, 1, 1e7, 10e9), 1e7);
}

TEST(TcpLimits, StripesAreTheBandwidthDelayProductOverOneFlowsWindow) {
  const TcpLimits l = limits(4u << 20, false);  // 2 MiB in flight per flow
  EXPECT_DOUBLE_EQ(flow_window_bytes(l), 2u << 20);
  // 1 Gbit/s x 50 ms = 6.25 MB: 3 flows of 2 MiB.
  EXPECT_EQ(stripes_for_path(l, 0.05, 1e9, 8), 3);
  EXPECT_EQ(stripes_for_path(l, 0.05, 10e9, 4), 4);            // 30 wanted, capped
  EXPECT_EQ(stripes_for_path(l, 0.0001, 10e9, 4), 1);          // a LAN round trip
  EXPECT_EQ(stripes_for_path(l, 0.0167772, 1e9, 8), 1);        // exactly one window: 2097150 B
  EXPECT_EQ(stripes_for_path(TcpLimits{}, 0.05, 10e9, 4), 1);  // limits unread
  EXPECT_EQ(stripes_for_path(l, 0, 10e9, 4), 1);               // round trip unmeasured
}

TEST(TcpLimits, ReadsThisKernel) {
  const TcpLimits l = read_tcp_limits();
  if (!l.read) GTEST_SKIP() << "/proc/sys/net/ipv4 not readable here";
  EXPECT_GT(l.wmem_max, 0u);
  EXPECT_GT(l.rmem_max, 0u);
}

}  // namespace
}  // namespace gradex::comm
