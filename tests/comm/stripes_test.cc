// Striping (CommOptions::stripes, GRADEX_STRIPES): several connections per peer chosen by the
// tag's lane. Ranks as forked processes over a real TcpStore: striped and unstriped collectives
// give the same bits at chunk boundaries, messages of one tag keep their order while lanes spread
// over connections, automatic striping agrees on one connection across a LAN, and a killed peer
// fails every survivor naming it.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "comm/collectives.h"
#include "comm/rendezvous/launch.h"
#include "tests/comm/rank_harness.h"
#include "tests/comm/reference.h"

namespace gradex::test {
namespace {

using comm::Millis;

constexpr int kOk = 0;
constexpr int kExpectedFailure = 10;
constexpr int kWrongResult = 20;
constexpr int kUnexpectedError = 30;
constexpr size_t kChunk = 256;  // ring chunk in bytes: small buffers take many chunks and lanes

std::unique_ptr<comm::Communicator> bootstrap(int rank, int world, uint16_t port, int stripes,
                                              Millis timeout = Millis(20000),
                                              const std::string& host_id = "") {
  comm::LaunchInfo info;
  info.rank = rank;
  info.world_size = world;
  info.master_port = port;
  auto store = comm::connect_tcp_store(info, Millis(20000));
  comm::CommOptions o;
  o.timeout = timeout;
  o.ring_chunk_bytes = kChunk;
  o.stripes = stripes;
  o.host_id = host_id;
  return comm::create_ucx_communicator(store, rank, world, o);
}

std::string describe(const std::vector<ChildResult>& results) {
  std::string s;
  for (const auto& r : results)
    s += "rank " + std::to_string(r.rank) + ": exit " + std::to_string(r.exit_code) + " signal " +
         std::to_string(r.signal) + (r.watchdog_killed ? " (watchdog)" : "") +
         ", report: " + r.report + "\n";
  return s;
}

void expect_all_ok(const std::vector<ChildResult>& results) {
  for (const auto& r : results)
    EXPECT_TRUE(r.exited && r.exit_code == kOk) << describe(results);
}

// Element counts whose segments end exactly on, one below and one above chunk boundaries, for P
// ranks and `elem`-byte elements, plus counts smaller than one chunk and than the world.
std::vector<size_t> boundary_counts(int P, size_t elem) {
  const size_t per_chunk = kChunk / elem;
  std::vector<size_t> counts{0, 1, static_cast<size_t>(P) - 1, per_chunk - 1};
  for (size_t chunks : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{17}})
    for (long delta : {-1L, 0L, 1L})
      counts.push_back(static_cast<size_t>(static_cast<long>(chunks * per_chunk * P) + delta));
  return counts;
}

// Every rank allreduces and allgathers the same inputs with `stripes` connections per peer and
// checks the bits against the documented summation order (tests/comm/reference.h), so striped and
// unstriped runs are compared with one reference.
int collectives_match_reference(int rank, int P, uint16_t port, int stripes) {
  auto comm = bootstrap(rank, P, port, stripes);
  if (comm->connections_per_peer() != stripes) {
    report("connections_per_peer " + std::to_string(comm->connections_per_peer()));
    return kWrongResult;
  }
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    for (size_t count : boundary_counts(P, dtype_size(dtype))) {
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < P; ++r)
        inputs.push_back(make_input(r, count, dtype, static_cast<uint32_t>(count)));
      const auto want = reference_sum(inputs, count, dtype);
      // The ring, and the direct exchange (two ranks: a swap in one piece per connection).
      for (auto* allreduce : {&comm::allreduce_sum, &comm::direct_allreduce_sum}) {
        auto buf = inputs[static_cast<size_t>(rank)];
        allreduce(*comm, buf.data(), count, dtype);
        if (buf != want) {
          report(std::string(allreduce == &comm::allreduce_sum ? "ring" : "direct") +
                 " allreduce of " + std::to_string(count) + " x " + dtype_name(dtype) + " differs");
          return kWrongResult;
        }
      }
    }
  }
  // Payloads of different lengths around chunk boundaries, one per rank, by the ring allgatherv.
  for (size_t chunks : {size_t{0}, size_t{1}, size_t{8}, size_t{9}}) {
    auto payload_of = [&](int r) {
      std::vector<uint8_t> p(chunks * kChunk + static_cast<size_t>(r) - 1 + (r == 0));
      for (size_t i = 0; i < p.size(); ++i)
        p[i] = static_cast<uint8_t>(i * 31 + static_cast<size_t>(r) * 7 + chunks);
      return p;
    };
    const auto mine = payload_of(rank);
    const auto all = comm::ring_allgatherv(*comm, mine.data(), mine.size());
    for (int r = 0; r < P; ++r)
      if (all[static_cast<size_t>(r)] != payload_of(r)) {
        report("ring_allgatherv payload of rank " + std::to_string(r) + " differs");
        return kWrongResult;
      }
  }
  comm::barrier(*comm);
  return kOk;
}

TEST(Stripes, StripedAndUnstripedCollectivesGiveTheSameBits) {
  for (int P : {2, 3}) {
    for (int stripes : {1, 3, 8}) {
      const uint16_t port = free_port();
      ProcessGroup group(
          P, [&](int rank) { return collectives_match_reference(rank, P, port, stripes); });
      auto results = group.wait(std::chrono::seconds(90));
      SCOPED_TRACE("P " + std::to_string(P) + ", stripes " + std::to_string(stripes));
      expect_all_ok(results);
    }
  }
}

// This process's established TCP connections whose remote port is not `except_port` (the store):
// UCX's tcp connections.
int tcp_connections(uint16_t except_port) {
  std::set<std::string> inodes;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  int n = 0;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      const auto remote_port =
          static_cast<uint16_t>(std::stoul(remote.substr(remote.find(':') + 1), nullptr, 16));
      if (state == "01" && remote_port != except_port && inodes.count(inode) != 0) ++n;
    }
  }
  return n;
}

// Rank 0 sends rank 1 messages over every lane, several per tag: each tag's messages arrive in
// the order they were sent although the lanes travel over different connections. Returns rank 1's
// open sockets after the exchange (through its exit code's report).
std::vector<ChildResult> lanes_exchange(int stripes) {
  const int P = 2;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, stripes);
    const uint64_t tag = comm->next_collective_tag();
    constexpr int kMessages = 96;  // 12 per lane
    constexpr size_t kBytes = 3000;
    std::vector<std::vector<uint8_t>> bufs(kMessages, std::vector<uint8_t>(kBytes));
    std::vector<comm::RequestPtr> requests;
    for (int i = 0; i < kMessages; ++i) {
      const uint64_t t = tag + comm::tag_lane(static_cast<size_t>(i));
      auto& b = bufs[static_cast<size_t>(i)];
      if (rank == 0) {
        std::fill(b.begin(), b.end(), static_cast<uint8_t>(i));
        requests.push_back(comm->isend(1, t, b.data(), b.size()));
      } else {
        requests.push_back(comm->irecv(0, t, b.data(), b.size()));
      }
    }
    comm->wait_all(requests, "lanes");
    if (rank == 1)
      for (int i = 0; i < kMessages; ++i)
        for (uint8_t v : bufs[static_cast<size_t>(i)])
          if (v != static_cast<uint8_t>(i)) {
            report("message " + std::to_string(i) + " holds " + std::to_string(v));
            return kWrongResult;
          }
    comm::barrier(*comm);
    // UCX may hold a second socket for a moment while two ends connect at once: the fewest seen
    // over half a second counts the connections that stay.
    int sockets = tcp_connections(port);
    for (int i = 0; i < 10; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      sockets = std::min(sockets, tcp_connections(port));
    }
    report("sockets " + std::to_string(sockets));
    comm::barrier(*comm);
    return kOk;
  });
  return group.wait(std::chrono::seconds(60));
}

int reported_sockets(const ChildResult& r) {
  const size_t at = r.report.find("sockets ");
  return at == std::string::npos ? -1 : std::stoi(r.report.substr(at + 8));
}

// Each extra connection is a TCP connection of its own (so a flow with its own window): three more
// between two ranks with four per peer.
TEST(Stripes, MessagesOfOneTagKeepTheirOrderAcrossLanesOverSeparateConnections) {
  const auto one = lanes_exchange(1);
  expect_all_ok(one);
  const auto four = lanes_exchange(4);
  expect_all_ok(four);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(four.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const int s1 = reported_sockets(one[static_cast<size_t>(r)]);
    const int s4 = reported_sockets(four[static_cast<size_t>(r)]);
    EXPECT_GE(s1, 1) << describe(one);
    EXPECT_GE(s4 - s1, 3) << "rank " << r << ": " << s1 << " TCP connections with one per peer, "
                          << s4 << " with four";
  }
}

// auto across (declared) hosts: rank 0 times its peers and every rank takes its count; over
// loopback the round trip is a LAN's, so one connection.
TEST(Stripes, AutoAgreesOnOneConnectionAcrossALan) {
  const int P = 3;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, 0, Millis(20000), "stripes-host-" + std::to_string(rank));
    if (comm->connections_per_peer() != 1) return kWrongResult;
    std::vector<float> buf(5000, 1.0f);
    comm::allreduce_sum(*comm, buf.data(), buf.size(), DType::kFloat32);
    return buf[4999] == static_cast<float>(P) ? kOk : kWrongResult;
  });
  expect_all_ok(group.wait(std::chrono::seconds(60)));
}

TEST(Stripes, OutOfRangeCountIsRefused) {
  const uint16_t port = free_port();
  ProcessGroup group(1, [&](int) {
    try {
      bootstrap(0, 1, port, comm::kStripesMax + 1);
    } catch (const InvalidArgument& e) {
      report(e.what());
      return kExpectedFailure;
    }
    return kWrongResult;
  });
  auto results = group.wait(std::chrono::seconds(30));
  EXPECT_TRUE(results[0].exited && results[0].exit_code == kExpectedFailure) << describe(results);
  EXPECT_NE(results[0].report.find("stripes is 9"), std::string::npos) << describe(results);
}

// Ranks started with different counts are refused at connection, each naming the other's setting
// (rather than waiting for connections the other end never opens).
TEST(Stripes, DifferentCountsAreRefusedAtConnection) {
  const int P = 2;
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    try {
      bootstrap(rank, P, port, rank == 0 ? 2 : 0);
    } catch (const ConfigError& e) {
      report(e.what());
      return kExpectedFailure;
    }
    return kWrongResult;
  });
  auto results = group.wait(std::chrono::seconds(60));
  for (const auto& r : results)
    EXPECT_TRUE(r.exited && r.exit_code == kExpectedFailure) << describe(results);
  for (const auto& r : results)
    EXPECT_NE(r.report.find("GRADEX_STRIPES: '2' on ranks [0], 'auto' on ranks [1]"),
              std::string::npos)
        << describe(results);
}

// A rank SIGKILLed during striped allreduces: every survivor fails with a PeerFailure naming a
// peer (at least one names the victim: a survivor may first see another survivor leave).
TEST(Stripes, KilledPeerFailsEverySurvivorNamingAPeer) {
  const int P = 4, victim = 2;
  const Millis timeout(3000);
  const uint16_t port = free_port();
  ProcessGroup group(P, [&](int rank) {
    auto comm = bootstrap(rank, P, port, 4, timeout);
    std::vector<float> buf(size_t{1} << 18, 1.0f);  // 1 MiB: thousands of chunks over 4 lanes
    for (int iter = 0;; ++iter) {
      try {
        std::fill(buf.begin(), buf.end(), 1.0f);
        comm::allreduce_sum(*comm, buf.data(), buf.size(), DType::kFloat32);
        if (buf[12345] != static_cast<float>(P)) return kWrongResult;
        if (iter == 2) report("looping");
      } catch (const PeerFailure& e) {
        report("peer=" + std::to_string(e.peer()) + ": " + e.what());
        return kExpectedFailure;
      } catch (const std::exception& e) {
        report(std::string("unexpected: ") + e.what());
        return kUnexpectedError;
      }
    }
  });
  for (int r = 0; r < P; ++r)
    ASSERT_TRUE(group.wait_for_report(r, "looping", std::chrono::seconds(30))) << "rank " << r;
  group.signal(victim, SIGKILL);
  auto results = group.wait(timeout * 3 + std::chrono::seconds(10));
  EXPECT_EQ(results[victim].signal, SIGKILL) << describe(results);
  int naming_victim = 0;
  for (int r = 0; r < P; ++r) {
    if (r == victim) continue;
    const auto& c = results[static_cast<size_t>(r)];
    EXPECT_FALSE(c.watchdog_killed) << describe(results);
    EXPECT_TRUE(c.exited && c.exit_code == kExpectedFailure) << describe(results);
    EXPECT_NE(c.report.find("rank "), std::string::npos) << describe(results);
    naming_victim += c.report.find("peer=2") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(naming_victim, 1) << describe(results);
}

}  // namespace
}  // namespace gradex::test
