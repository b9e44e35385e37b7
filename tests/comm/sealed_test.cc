// Sealed communicators (GRADEX_SEAL, comm/seal/seal.h) over real UCX, ranks as threads: every
// collective gives the same bits sealed as in clear; a flipped, cut, replayed or forged message is
// refused by the rank that receives it, naming the peer and the check, and every rank fails at
// once; a message injected through an endpoint of a stranger's own is refused; a capture of the
// loopback wire holds a known payload's bytes in clear and none of them sealed.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "base/config.h"
#include "base/dtype.h"
#include "comm/collectives.h"
#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/memory_store.h"
#include "comm/seal/seal.h"
#include "comm/ucx/ucx_communicator.h"
#include "comm/ucx/ucx_peer_auth.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Bytes;
using comm::CommOptions;
using comm::Communicator;

CommOptions sealed_options(CommOptions::Seal seal = CommOptions::Seal::kAuto) {
  CommOptions o = test_options();
  o.job_secret = "the job's secret";
  o.seal = seal;
  o.timeout = std::chrono::milliseconds(10000);
  return o;
}

std::vector<float> values(int rank, size_t n) {
  std::vector<float> v(n);
  std::mt19937 gen(static_cast<uint32_t>(100 + rank));
  std::normal_distribution<float> d;
  for (auto& x : v)
    x = d(gen);
  return v;
}

// Every route's collective on a world of 3: what each rank ends with, as bytes.
std::vector<Bytes> run_routes(const CommOptions& options, std::vector<uint64_t>* sent = nullptr,
                              size_t ring_values = 1000) {
  constexpr int kWorld = 3;
  std::vector<Bytes> out(kWorld);
  std::mutex m;
  run_ranks(
      kWorld,
      [&](Communicator& c) {
        Bytes mine;
        auto append = [&](const void* p, size_t n) {
          const auto* b = static_cast<const uint8_t*>(p);
          mine.insert(mine.end(), b, b + n);
        };
        std::vector<float> a = values(c.rank(), ring_values);
        comm::allreduce_sum(c, a.data(), a.size(), DType::kFloat32);  // ring
        append(a.data(), a.size() * 4);
        std::vector<float> d = values(c.rank(), 77);
        comm::direct_allreduce_sum(c, d.data(), d.size(), DType::kFloat32);
        append(d.data(), d.size() * 4);
        const std::vector<float> g = values(c.rank(), 50 + 10 * static_cast<size_t>(c.rank()));
        for (const Bytes& b : comm::allgatherv(c, g.data(), g.size() * 4))
          append(b.data(), b.size());
        std::vector<Bytes> unsized;
        for (bool ring : {false, true}) {  // any-length receives, direct and around the ring
          comm::allgatherv_unsized(c, g.data(), g.size() * 4, unsized, ring,
                                   comm::kUnsizedMaxBytes);
          for (const Bytes& b : unsized)
            append(b.data(), b.size());
        }
        for (const Bytes& b : comm::ring_allgatherv(c, g.data(), g.size() * 4))
          append(b.data(), b.size());
        std::vector<float> root = values(7, 300);
        if (c.rank() != 1) std::fill(root.begin(), root.end(), 0.f);
        comm::broadcast(c, root.data(), root.size() * 4, 1);
        append(root.data(), root.size() * 4);
        comm::barrier(c);
        std::lock_guard<std::mutex> lock(m);
        out[static_cast<size_t>(c.rank())] = mine;
        if (sent) sent->push_back(c.bytes_sent());
      },
      options);
  return out;
}

TEST(SealedCommunicator, EveryRouteGivesTheSameBitsSealedAsInClear) {
  std::vector<uint64_t> sent_clear, sent_sealed;
  const auto clear = run_routes(sealed_options(CommOptions::Seal::kOff), &sent_clear);
  const auto sealed = run_routes(sealed_options(CommOptions::Seal::kOn), &sent_sealed);
  ASSERT_EQ(clear.size(), sealed.size());
  for (size_t r = 0; r < clear.size(); ++r) {
    EXPECT_FALSE(clear[r].empty());
    EXPECT_EQ(clear[r], sealed[r]) << "rank " << r;
  }
  // The statistics count payloads, sealed or not.
  std::sort(sent_clear.begin(), sent_clear.end());
  std::sort(sent_sealed.begin(), sent_sealed.end());
  EXPECT_EQ(sent_clear, sent_sealed);
  // Over shared memory too (same-host peers: UCX's rendezvous carries the larger frames), with
  // 256 KiB ring chunks as in production.
  CommOptions shm = sealed_options(CommOptions::Seal::kOn);
  shm.shared_memory = true;
  shm.ring_chunk_bytes = 256 << 10;
  const size_t big = 600000;  // 2.4 MB: multi-chunk rings and rendezvous-sized frames
  const auto over_shm = run_routes(shm, nullptr, big);
  CommOptions tcp_big = sealed_options(CommOptions::Seal::kOff);
  tcp_big.ring_chunk_bytes = 256 << 10;
  const auto clear_big = run_routes(tcp_big, nullptr, big);
  for (size_t r = 0; r < clear.size(); ++r)
    EXPECT_EQ(over_shm[r], clear_big[r]) << "rank " << r << " over shared memory";
}

// Runs fn on `world` ranks as threads, rank r with options_of(r), over `store`; each rank's gradex
// error message ("" for none).
std::vector<std::string> ranks_with(int world, const std::function<CommOptions(int)>& options_of,
                                    const std::function<void(Communicator&)>& fn,
                                    std::shared_ptr<comm::MemoryStore> store = nullptr) {
  if (!store) store = std::make_shared<comm::MemoryStore>();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto c = comm::create_ucx_communicator(store, r, world, options_of(r));
        fn(*c);
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string("not a gradex error: ") + e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return errors;
}

enum class Route { kRing, kUnsized, kBroadcast, kDirect };

// One collective of `route` on 3 ranks, then barriers, rank 1 tampering with its `at`-th sealed
// message as an attacker on its path would. Returns each rank's error; `applied` tells whether any
// rank got through them all (none may: every rank must fail, and nothing of a refused message may
// be used).
std::vector<std::string> tampered(const std::string& tamper, Route route, bool* applied) {
  std::atomic<bool> returned{false};
  auto errors = ranks_with(
      3,
      [&](int r) {
        CommOptions o = sealed_options();
        if (r == 1) o.seal_test_tamper = tamper;
        return o;
      },
      [&](Communicator& c) {
        std::vector<float> a = values(c.rank(), 400);
        std::vector<Bytes> got;
        switch (route) {
          case Route::kRing:
            comm::allreduce_sum(c, a.data(), a.size(), DType::kFloat32);
            break;
          case Route::kDirect:
            comm::direct_allreduce_sum(c, a.data(), a.size(), DType::kFloat32);
            break;
          case Route::kUnsized:
            comm::allgatherv_unsized(c, a.data(), a.size() * 4, got, false, comm::kUnsizedMaxBytes);
            break;
          case Route::kBroadcast:
            comm::broadcast(c, a.data(), a.size() * 4, 1);
            break;
        }
        // Ranks the tampered message did not reach learn of the failure in their next collective:
        // barriers enough that one follows the tampered message whichever of the first few it is.
        for (int i = 0; i < 4; ++i)
          comm::barrier(c);
        returned = true;
      });
  *applied = returned.load();
  return errors;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every kind of tampering on every route: GX_SEAL_TRIALS trials (default 16, one of each kind and
// route; docs/benchmarks.md records a run of 1,000), the tampered message moving over the first
// few a rank sends.
TEST(SealedCommunicator, TamperedMessagesAreRefusedOnEveryRouteAndEveryRankFails) {
  struct Case {
    const char* kind;
    const char* check;
  };
  const Case cases[] = {{"flip", "check failed"},
                        {"truncate", "authentication tag check failed"},
                        {"replay", "check failed"},
                        {"forge", "authentication tag check failed"}};
  const Route routes[] = {Route::kRing, Route::kDirect, Route::kUnsized, Route::kBroadcast};
  const char* env = std::getenv("GX_SEAL_TRIALS");
  const int trials = env != nullptr ? std::atoi(env) : 16;
  int refused = 0;
  for (int i = 0; i < trials; ++i) {
    const Route route = routes[i % 4];
    const Case& k = cases[(i / 4) % 4];
    const std::string tamper = std::string(k.kind) + ":" + std::to_string(2 + (i / 16) % 4);
    bool applied = true;
    const auto errors = tampered(tamper, route, &applied);
    const std::string where = "trial " + std::to_string(i) + ": " + tamper + " on route " +
                              std::to_string(static_cast<int>(route));
    EXPECT_FALSE(applied) << where;
    int refusing = -1;
    bool every_rank_failed = true;
    for (size_t r = 0; r < errors.size(); ++r) {
      every_rank_failed = every_rank_failed && !errors[r].empty();
      EXPECT_FALSE(errors[r].empty()) << where << ": rank " << r << " did not fail";
      if (has(errors[r], "refused a sealed message")) refusing = static_cast<int>(r);
    }
    ASSERT_GE(refusing, 0) << where << ": " << errors[0] << " | " << errors[2];
    const std::string& e = errors[static_cast<size_t>(refusing)];
    EXPECT_TRUE(has(e, k.check)) << where << ": " << e;
    EXPECT_TRUE(has(e, "from rank 1")) << where << ": " << e;
    refused += !applied && every_rank_failed && has(e, k.check) ? 1 : 0;
  }
  std::printf("sealed communicator: %d of %d tampered collectives refused, every rank failing\n",
              refused, trials);
  EXPECT_EQ(refused, trials);
}

// Someone who learned rank 0's UCX address (under a framework's store anyone can read it) opens an
// endpoint of its own and sends a message that claims to come from rank 1, with the tag of the
// next collective, before rank 1's real one: rank 0 refuses it and both ranks fail.
TEST(SealedCommunicator, AMessageInjectedThroughAStrangersEndpointIsRefused) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::atomic<int> connected{0};
  std::atomic<bool> injected{false};
  std::atomic<bool> stranger_failed{false};
  std::atomic<bool> rank0_ready{false};
  std::atomic<bool> done{false};
  const CommOptions options = sealed_options();
  std::thread stranger([&] {
    try {
      while (connected.load() < 2)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const Bytes entry = store->get("gradex/ucx/address/0", std::chrono::milliseconds(5000));
      auto e = comm::ucx::decode_address_entry(entry, 1, 0, options.job_secret);
      comm::ucx::Config config;
      comm::ucx::Context context(config);
      comm::ucx::Worker worker(context);
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      params.address = reinterpret_cast<const ucp_address_t*>(e.address);
      comm::ucx::Endpoint ep(worker.get(), params, 0);
      // A well-formed frame under a key of the stranger's own, for the first collective's tag.
      std::vector<uint8_t> payload(400 * 4, 0x42),
          frame(payload.size() + comm::seal::kOverheadBytes);
      comm::seal::Key key{};
      key[0] = 1;
      comm::seal::Sealer forger(comm::seal::Cipher::kAes256Gcm, key);
      const uint64_t tag = uint64_t{1} << 16;
      forger.seal(tag, payload.data(), payload.size(), frame.data());
      ucp_request_param_t param{};
      ucs_status_ptr_t st = ucp_tag_send_nbx(ep.get(), frame.data(), frame.size(),
                                             (tag << comm::ucx::kRankBits) | 1u, &param);
      if (UCS_PTR_IS_ERR(st)) throw std::runtime_error("stranger's send failed");
      while (st != nullptr && ucp_request_check_status(st) == UCS_INPROGRESS)
        ucp_worker_progress(worker.get());
      if (st != nullptr) ucp_request_free(st);
      injected = true;
      while (!done.load()) {  // keep the stranger's side of the connection alive
        ucp_worker_progress(worker.get());
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    } catch (...) {
      stranger_failed = true;
      injected = true;
    }
  });
  const auto errors = ranks_with(
      2, [&](int) { return options; },
      [&](Communicator& c) {
        ++connected;
        while (!injected.load())
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (c.rank() == 0) {
          // Rank 0 takes the stranger's message in (UCX's unexpected queue) before rank 1 sends.
          const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
          while (std::chrono::steady_clock::now() < until)
            c.progress();
          rank0_ready = true;
        } else {
          while (!rank0_ready.load())
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        const uint64_t tag = c.next_collective_tag();
        std::vector<float> in(400), out = values(c.rank(), 400);
        std::vector<comm::RequestPtr> requests;
        const int peer = 1 - c.rank();
        requests.push_back(c.irecv(peer, tag, in.data(), in.size() * 4));
        requests.push_back(c.isend(peer, tag, out.data(), out.size() * 4));
        c.wait_all(requests, "exchange");
        comm::barrier(c);
      },
      store);
  done = true;
  stranger.join();
  ASSERT_FALSE(stranger_failed.load());
  EXPECT_TRUE(has(errors[0], "refused a sealed message")) << errors[0];
  EXPECT_TRUE(has(errors[0], "authentication tag check failed")) << errors[0];
  EXPECT_TRUE(has(errors[0], "rank 1")) << errors[0];
  EXPECT_FALSE(errors[1].empty()) << "rank 1 must fail too";
}

TEST(SealedCommunicator, SettingsAreRefusedByName) {
  CommOptions on = test_options();
  on.seal = CommOptions::Seal::kOn;
  try {
    comm::check_seal_setting(on);
    ADD_FAILURE() << "GRADEX_SEAL=on without a secret was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(has(e.what(), "GRADEX_SEAL=on")) << e.what();
    EXPECT_TRUE(has(e.what(), "GRADEX_JOB_SECRET")) << e.what();
  }
  try {
    config::Config::from_strings({"GRADEX_SEAL=sometimes"}, config::Source::kEnvironment);
    ADD_FAILURE() << "GRADEX_SEAL=sometimes was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(has(e.what(), "GRADEX_SEAL")) << e.what();
  }
  try {
    auto c = config::Config::from_strings({"GRADEX_SEAL=on"}, config::Source::kEnvironment);
    comm::comm_options_from_config(c);
    ADD_FAILURE() << "GRADEX_SEAL=on without a secret was accepted";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(has(e.what(), "GRADEX_JOB_SECRET_FILE")) << e.what();
  }
}

TEST(SealedCommunicator, RanksThatDisagreeOnSealingStopAtConnection) {
  const auto errors = ranks_with(
      2,
      [](int r) {
        return sealed_options(r == 0 ? CommOptions::Seal::kAuto : CommOptions::Seal::kOff);
      },
      [](Communicator& c) { comm::barrier(c); });
  for (const std::string& e : errors) {
    EXPECT_TRUE(has(e, "GRADEX_SEAL: 'auto' on ranks [0], 'off' on ranks [1]")) << e;
  }
}

// Reads every frame on the loopback device while `work` runs (raw socket: needs CAP_NET_RAW).
class LoopbackCapture {
 public:
  LoopbackCapture() {
    fd_ = ::socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
    if (fd_ < 0) return;
    sockaddr_ll a{};
    a.sll_family = AF_PACKET;
    a.sll_protocol = htons(ETH_P_ALL);
    a.sll_ifindex = static_cast<int>(if_nametoindex("lo"));
    timeval tv{0, 50000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int big = 64 << 20;
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    reader_ = std::thread([this] {
      std::vector<uint8_t> packet(1 << 17);
      while (!stop_.load()) {
        const ssize_t n = ::recv(fd_, packet.data(), packet.size(), 0);
        if (n > 0 && captured_.size() < (size_t{256} << 20))
          captured_.insert(captured_.end(), packet.begin(), packet.begin() + n);
      }
    });
  }
  ~LoopbackCapture() { stop(); }
  bool ok() const { return fd_ >= 0; }
  const std::vector<uint8_t>& stop() {
    if (reader_.joinable()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      stop_ = true;
      reader_.join();
    }
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return captured_;
  }

 private:
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread reader_;
  std::vector<uint8_t> captured_;
};

// How many of a payload's 64-byte pieces appear in `wire`.
size_t pieces_seen(const std::vector<uint8_t>& wire, const std::vector<uint8_t>& payload) {
  size_t seen = 0;
  for (size_t at = 0; at + 64 <= payload.size(); at += 4096)
    if (std::search(wire.begin(), wire.end(), payload.begin() + at, payload.begin() + at + 64) !=
        wire.end())
      ++seen;
  return seen;
}

// How many sealed frames' headers ("GXSL") appear in `wire`.
size_t seal_headers_seen(const std::vector<uint8_t>& wire) {
  static const uint8_t magic[4] = {'G', 'X', 'S', 'L'};
  size_t seen = 0;
  for (auto it = wire.begin(); (it = std::search(it, wire.end(), magic, magic + 4)) != wire.end();
       ++it)
    ++seen;
  return seen;
}

TEST(SealedCommunicator, TheWireHoldsAKnownGradientInClearAndNothingOfItSealed) {
  // A gradient pattern nobody else sends: random floats from a seed of this run.
  std::vector<uint8_t> payload(size_t{1} << 20);
  std::mt19937 gen(static_cast<uint32_t>(std::random_device{}()));
  for (auto& b : payload)
    b = static_cast<uint8_t>(gen());
  const size_t pieces = payload.size() / 4096;
  // The capture sees every process's loopback traffic and drops frames when its reader falls behind
  // (a loaded machine): each run is checked to have been captured (the clear payload's pieces; the
  // sealed frames' headers) and repeated, up to three times, when it was not.
  for (bool seal : {false, true}) {
    size_t clear_pieces = 0, headers = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      LoopbackCapture capture;
      if (!capture.ok()) GTEST_SKIP() << "no raw socket on lo (needs CAP_NET_RAW: run as root)";
      CommOptions o = sealed_options(seal ? CommOptions::Seal::kOn : CommOptions::Seal::kOff);
      o.ring_chunk_bytes = 64 << 10;
      run_ranks(
          2,
          [&](Communicator& c) {
            std::vector<Bytes> got;
            comm::allgatherv(c, payload.data(), payload.size(), got);
            for (const Bytes& b : got)
              ASSERT_TRUE(std::equal(b.begin(), b.end(), payload.begin()));
            comm::barrier(c);
          },
          o);
      const std::vector<uint8_t>& wire = capture.stop();
      clear_pieces = pieces_seen(wire, payload);
      headers = seal_headers_seen(wire);
      // Sealed: no piece may ever be in clear, whatever was dropped.
      if (seal) {
        ASSERT_EQ(clear_pieces, 0u) << "captured " << wire.size();
      }
      const bool captured = seal ? headers >= 16 : clear_pieces >= pieces * 9 / 10;
      if (captured) break;
    }
    if (!seal) {
      // The capture works: the payload's pieces are on the wire in clear.
      EXPECT_GE(clear_pieces, pieces * 9 / 10);
    } else {
      // 1 MiB each way in 64 KiB chunks: at least 16 sealed frames per direction were on the wire.
      EXPECT_GE(headers, 16u) << "the sealed exchange was not captured";
    }
  }
}

}  // namespace
}  // namespace gradex::test
