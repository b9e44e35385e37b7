// What a communicator's start asks of the bootstrap store: each get is a round trip to the store's
// host across a WAN, so a rank never reads its own entries back, and where the launcher counts one
// rank on this host (LOCAL_WORLD_SIZE=1) it reads no peer's host entry either.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "comm/rendezvous/memory_store.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

// A MemoryStore that records the keys it was asked for.
class RecordingStore : public comm::Store {
 public:
  void set(const std::string& key, const comm::Bytes& value) override { inner_.set(key, value); }
  comm::Bytes get(const std::string& key, comm::Millis timeout) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gets_.push_back(key);
    }
    return inner_.get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, comm::Millis timeout) override {
    inner_.wait(keys, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_.add(key, delta); }
  // Keys asked for that contain `part`.
  std::vector<std::string> gets_of(const std::string& part) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const std::string& k : gets_)
      if (k.find(part) != std::string::npos) out.push_back(k);
    return out;
  }

 private:
  comm::MemoryStore inner_;
  std::mutex mutex_;
  std::vector<std::string> gets_;
};

// Sets the launcher variables of torchrun for the test's lifetime (every rank thread reads them).
class LauncherEnvironment {
 public:
  explicit LauncherEnvironment(const char* local_world_size) {
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", local_world_size, 1);
  }
  ~LauncherEnvironment() {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
      unsetenv(name);
  }
};

// Connects two ranks (threads) on hosts `hosts` through `store` and sums one value over them.
void connect_and_sum(const std::shared_ptr<RecordingStore>& store,
                     const std::vector<std::string>& hosts, bool shared_memory) {
  std::vector<std::thread> threads;
  std::vector<std::string> errors(2);
  std::vector<float> sums(2, 0.0f);
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        comm::CommOptions options = test_options();
        options.host_id = hosts[static_cast<size_t>(rank)];
        options.shared_memory = shared_memory;
        auto comm = comm::create_ucx_communicator(store, rank, 2, options);
        float value = static_cast<float>(rank + 1);
        comm::allreduce_sum(*comm, &value, 1, DType::kFloat32);
        sums[static_cast<size_t>(rank)] = value;
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << "rank " << rank;
    EXPECT_EQ(sums[static_cast<size_t>(rank)], 3.0f) << "rank " << rank;
  }
}

TEST(ConnectStore, ARankReadsOnlyItsPeersEntries) {
  auto store = std::make_shared<RecordingStore>();
  connect_and_sum(store, {"hostA", "hostB"}, false);
  // Each rank read the other's host and address entries once, never its own.
  EXPECT_EQ(store->gets_of("ucx/host/").size(), 2u);
  EXPECT_EQ(store->gets_of("ucx/address/").size(), 2u);
  for (const std::string& key : store->gets_of("ucx/")) {
    EXPECT_TRUE(key.back() == '0' || key.back() == '1') << key;
  }
}

TEST(ConnectStore, ALauncherCountingOneRankHereSkipsThePeersHostEntries) {
  LauncherEnvironment one_here("1");
  auto store = std::make_shared<RecordingStore>();
  connect_and_sum(store, {"hostA", "hostB"}, false);
  EXPECT_TRUE(store->gets_of("ucx/host/").empty());
  EXPECT_EQ(store->gets_of("ucx/address/").size(), 2u);
}

// The launcher is wrong (both ranks publish one host and may share its memory): the ranks connect
// all the same, with a warning, and the exchange is right.
TEST(ConnectStore, ALauncherWrongAboutItsHostStillConnects) {
  LauncherEnvironment one_here("1");
  auto store = std::make_shared<RecordingStore>();
  connect_and_sum(store, {"shared", "shared"}, true);
  EXPECT_TRUE(store->gets_of("ucx/host/").empty());
}

// A launcher that counts two ranks here reads the peers' host entries as without one.
TEST(ConnectStore, ALauncherCountingTwoRanksReadsThePeersHostEntries) {
  LauncherEnvironment two_here("2");
  auto store = std::make_shared<RecordingStore>();
  connect_and_sum(store, {"shared", "shared"}, true);
  EXPECT_EQ(store->gets_of("ucx/host/").size(), 2u);
}

}  // namespace
}  // namespace gradex::test
