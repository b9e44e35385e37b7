// What a communicator's start asks of the bootstrap store: each get is a round trip to the store's
// host across a WAN, so a rank never reads its own entries back, and where the launcher counts one
// rank on this host (LOCAL_WORLD_SIZE=1) it reads no peer's host entry either.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/collectives.h"
#include "comm/rendezvous/memory_store.h"
#include "comm/rendezvous/store_gather.h"
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

// Connects one rank (thread) per entry of `hosts` through `store` and sums one value over them.
void connect_and_sum(const std::shared_ptr<RecordingStore>& store,
                     const std::vector<std::string>& hosts, bool shared_memory) {
  const int world = static_cast<int>(hosts.size());
  std::vector<std::thread> threads;
  std::vector<std::string> errors(hosts.size());
  std::vector<float> sums(hosts.size(), 0.0f);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        comm::CommOptions options = test_options();
        options.host_id = hosts[static_cast<size_t>(rank)];
        options.shared_memory = shared_memory;
        auto comm = comm::create_ucx_communicator(store, rank, world, options);
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
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(errors[static_cast<size_t>(rank)], "") << "rank " << rank;
    EXPECT_EQ(sums[static_cast<size_t>(rank)], world * (world + 1) / 2.0f) << "rank " << rank;
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

// From 3 ranks on, rank 0 reads its peers' address entries and combines them under one key, which
// every other rank reads instead of its P - 1 peers' (4 ranks: 6 address reads, not 12).
TEST(ConnectStore, RankZeroCombinesTheAddressEntriesForTheOthers) {
  auto store = std::make_shared<RecordingStore>();
  connect_and_sum(store, {"hostA", "hostB", "hostC", "hostD"}, false);
  const std::vector<std::string> reads = store->gets_of("ucx/address/");
  EXPECT_EQ(reads.size(), 6u);
  EXPECT_EQ(std::count_if(reads.begin(), reads.end(),
                          [](const std::string& k) { return k.back() == '+'; }),
            3);
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

// gather_store_entries on its own: every rank ends with every entry, by rank; a combined entry that
// does not parse names its key; a rank that never set its entry is named on rank 0 and on the
// others.
TEST(StoreGather, EveryRankGetsEveryEntryByRank) {
  comm::MemoryStore store;
  auto key_of = [](int r) { return "e/" + std::to_string(r); };
  constexpr int kWorld = 4;
  std::vector<std::vector<comm::Bytes>> got(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      const comm::Bytes own(static_cast<size_t>(r) + 1, static_cast<uint8_t>('a' + r));
      store.set(key_of(r), own);
      got[static_cast<size_t>(r)] =
          comm::gather_store_entries(store, key_of, "e/all", r, kWorld, own, comm::Millis(10000));
    });
  }
  for (std::thread& t : threads)
    t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(got[static_cast<size_t>(r)].size(), static_cast<size_t>(kWorld));
    for (int p = 0; p < kWorld; ++p)
      EXPECT_EQ(got[static_cast<size_t>(r)][static_cast<size_t>(p)],
                comm::Bytes(static_cast<size_t>(p) + 1, static_cast<uint8_t>('a' + p)))
          << "rank " << r << ", entry " << p;
  }
}

TEST(StoreGather, ACorruptCombinedEntryIsNamed) {
  comm::MemoryStore store;
  store.set("e/all", comm::Bytes{3, 0, 0, 0, 0, 0, 0, 0, 'x'});
  auto key_of = [](int r) { return "e/" + std::to_string(r); };
  try {
    comm::gather_store_entries(store, key_of, "e/all", 1, 3, comm::Bytes{'b'}, comm::Millis(1000));
    FAIL() << "a truncated combined entry was accepted";
  } catch (const CorruptPayload& e) {
    EXPECT_NE(std::string(e.what()).find("'e/all'"), std::string::npos) << e.what();
  }
}

TEST(StoreGather, ARankThatNeverSetItsEntryIsNamedOnEveryRank) {
  comm::MemoryStore store;
  auto key_of = [](int r) { return "e/" + std::to_string(r); };
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 of 3 never comes
    threads.emplace_back([&, r] {
      const comm::Bytes own{static_cast<uint8_t>(r)};
      store.set(key_of(r), own);
      try {
        comm::gather_store_entries(store, key_of, "e/all", r, 3, own, comm::Millis(300));
      } catch (const TimeoutError& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[static_cast<size_t>(r)].find("'e/2'"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<size_t>(r)];
}

}  // namespace
}  // namespace gradex::test
