// The bootstrap stores: TcpStore against its server, MemoryStore, prefix views; timeouts and a
// wrong peer on the port.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "base/error.h"
#include "comm/rendezvous/memory_store.h"
#include "comm/rendezvous/tcp_store.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Bytes;
using comm::Millis;
using Clock = std::chrono::steady_clock;

Bytes b(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Each store type must pass the same behaviour tests.
struct StoreFactory {
  std::unique_ptr<comm::TcpStoreServer> server;
  std::shared_ptr<comm::Store> memory = std::make_shared<comm::MemoryStore>();
  // A new client of one shared store (the memory store has no clients: all share it).
  std::shared_ptr<comm::Store> make(bool tcp) {
    if (!tcp) return memory;
    if (!server) server = std::make_unique<comm::TcpStoreServer>("127.0.0.1", 0);
    return std::make_shared<comm::TcpStore>("127.0.0.1", server->port(), Millis(5000));
  }
};

class AnyStore : public ::testing::TestWithParam<bool> {
 protected:
  std::shared_ptr<comm::Store> store() { return factory_.make(GetParam()); }
  StoreFactory factory_;
};

TEST_P(AnyStore, SetGetOverwrite) {
  auto s = store();
  s->set("a", b("one"));
  EXPECT_EQ(s->get("a", Millis(100)), b("one"));
  s->set("a", b("two"));
  EXPECT_EQ(s->get("a", Millis(100)), b("two"));
  s->set("empty", Bytes());
  EXPECT_EQ(s->get("empty", Millis(100)), Bytes());
  Bytes big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<uint8_t>(i * 7);
  s->set("big", big);
  EXPECT_EQ(s->get("big", Millis(1000)), big);
}

TEST_P(AnyStore, GetTimesOutNamingTheKey) {
  auto s = store();
  auto t0 = Clock::now();
  try {
    s->get("never", Millis(300));
    FAIL() << "get returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.29);
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST_P(AnyStore, GetAndWaitBlockUntilAnotherClientSets) {
  auto reader = store();
  auto writer = store();
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    writer->set("k1", b("v1"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    writer->set("k2", b("v2"));
  });
  EXPECT_EQ(reader->get("k1", Millis(5000)), b("v1"));
  reader->wait({"k1", "k2"}, Millis(5000));
  t.join();
  try {
    reader->wait({"k1", "missing", "k2"}, Millis(200));
    FAIL() << "wait returned";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
  }
}

TEST_P(AnyStore, AddIsAtomicAcrossClients) {
  std::vector<std::shared_ptr<comm::Store>> clients;
  for (int i = 0; i < 4; ++i)
    clients.push_back(store());
  EXPECT_EQ(clients[0]->add("n", 5), 5);
  EXPECT_EQ(clients[0]->add("n", -5), 0);
  std::vector<std::thread> threads;
  for (auto& c : clients)
    threads.emplace_back([c] {
      for (int i = 0; i < 200; ++i)
        c->add("n", 1);
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(clients[1]->add("n", 0), 800);
  clients[0]->set("text", b("abc"));
  EXPECT_THROW(clients[0]->add("text", 1), InvalidArgument);
  EXPECT_EQ(clients[0]->get("text", Millis(100)), b("abc"));  // connection still usable
}

TEST_P(AnyStore, PrefixStoresDoNotCollide) {
  auto base = store();
  auto a = comm::make_prefix_store(base, "a/");
  auto c = comm::make_prefix_store(base, "c/");
  a->set("k", b("from a"));
  c->set("k", b("from c"));
  EXPECT_EQ(a->get("k", Millis(100)), b("from a"));
  EXPECT_EQ(c->get("k", Millis(100)), b("from c"));
  EXPECT_EQ(base->get("a/k", Millis(100)), b("from a"));
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(c->add("n", 3), 3);
  a->wait({"k", "n"}, Millis(100));
  EXPECT_THROW(c->wait({"only-in-a"}, Millis(50)), TimeoutError);
}

INSTANTIATE_TEST_SUITE_P(Store, AnyStore, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tcp" : "Memory"; });

// A listener that is not a gradex store: `reply` is sent to whoever connects (or nothing).
class FakeServer {
 public:
  explicit FakeServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 8);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      if (!reply_.empty()) (void)!write(c, reply_.data(), reply_.size());
      while (!stop_)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      close(c);
    });
  }
  ~FakeServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  std::string reply_;
  int fd_;
  uint16_t port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(TcpStore, WrongPeerOnThePortIsNamed) {
  FakeServer http("HTTP/1.1 400 Bad Request\r\n\r\n");
  try {
    comm::TcpStore s("127.0.0.1", http.port(), Millis(2000));
    FAIL() << "connected to a non-store";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("does not speak the gradex store protocol"),
              std::string::npos)
        << e.what();
  }
}

TEST(TcpStoreServer, DropsAClientSpeakingAnotherProtocolAndKeepsServing) {
  comm::TcpStoreServer server("127.0.0.1", 0);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(server.port());
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const char request[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_GT(write(fd, request, sizeof(request) - 1), 0);
  // The server answers with an error frame, then closes: read until EOF (bounded by SO_RCVTIMEO).
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string got;
  char buf[256];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0)
    got.append(buf, static_cast<size_t>(n));
  EXPECT_EQ(n, 0) << "the server kept the connection open";
  EXPECT_NE(got.find("not a gradex store client"), std::string::npos);
  close(fd);
  comm::TcpStore good("127.0.0.1", server.port(), Millis(2000));
  good.set("still", b("serving"));
  EXPECT_EQ(good.get("still", Millis(100)), b("serving"));
}

// Found while making the server fuzzable (UBSan would flag it): counters were summed in signed
// arithmetic, which overflows (undefined behaviour) when a client adds past INT64_MAX. Counters
// wrap instead.
TEST(TcpStoreServer, CounterOverflowWraps) {
  comm::TcpStoreServer server("127.0.0.1", 0);
  comm::TcpStore s("127.0.0.1", server.port(), Millis(2000));
  EXPECT_EQ(s.add("n", INT64_MAX), INT64_MAX);
  EXPECT_EQ(s.add("n", 1), INT64_MIN);
  EXPECT_EQ(s.add("n", -1), INT64_MAX);
}

TEST(TcpStore, SilentPeerIsBoundedInTime) {
  FakeServer silent("");
  auto t0 = Clock::now();
  try {
    comm::TcpStore s("127.0.0.1", silent.port(), Millis(1000));
    FAIL() << "connected to a silent peer";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(TcpStore, UnreachableServerIsReportedWithinTheTimeout) {
  uint16_t port = free_port();  // nobody listens there
  auto t0 = Clock::now();
  try {
    comm::TcpStore s("127.0.0.1", port, Millis(700));
    FAIL() << "connected to a closed port";
  } catch (const TimeoutError& e) {
    std::string want =
        "could not connect to the gradex store at 127.0.0.1:" + std::to_string(port) +
        " within 0.7 s: Connection refused";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.69);
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(TcpStore, ClientRetriesUntilTheServerStarts) {
  uint16_t port = free_port();
  std::unique_ptr<comm::TcpStoreServer> server;
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    server = std::make_unique<comm::TcpStoreServer>("127.0.0.1", port);
  });
  comm::TcpStore client("127.0.0.1", port, Millis(5000));
  late.join();
  client.set("x", b("y"));
  EXPECT_EQ(client.get("x", Millis(100)), b("y"));
}

TEST(TcpStore, PortInUseIsAConfigError) {
  comm::TcpStoreServer first("127.0.0.1", 0);
  try {
    comm::TcpStoreServer second("127.0.0.1", first.port());
    FAIL() << "two servers on one port";
  } catch (const ConfigError& e) {
    std::string want = "MASTER_PORT " + std::to_string(first.port()) + " is already in use";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ServerStopsPromptlyWithClientsConnectedAndWaiting) {
  auto server = std::make_unique<comm::TcpStoreServer>("127.0.0.1", 0);
  comm::TcpStore idle("127.0.0.1", server->port(), Millis(2000));
  comm::TcpStore waiting("127.0.0.1", server->port(), Millis(2000));
  std::thread t([&] {
    try {
      waiting.get("never", Millis(60000));
    } catch (const Error&) {
      // the server went away: expected
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto t0 = Clock::now();
  server.reset();
  EXPECT_LT(seconds_since(t0), 1.0);
  t.join();
  EXPECT_LT(seconds_since(t0), 2.0);  // the waiting client saw the connection close
  EXPECT_THROW(idle.set("k", b("v")), TransportError);
}

}  // namespace
}  // namespace gradex::test
