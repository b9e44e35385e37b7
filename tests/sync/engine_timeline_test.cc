// GRADEX_TIMELINE (sync/timeline/): three forked ranks exchange a DGC tensor and two dense ones for
// a few steps with the timeline on; every rank's file must hold every phase of every step
// (submission, negotiation, encode, transfer with route and codec, decode, completion, waits, the
// framework's wait), every peer's sends and receives with their bytes, and close as valid JSON;
// the merge must put the ranks on one clock. The recorder's and the merge's own rules are tested
// on their own below.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "base/error.h"
#include "process_ranks.h"
#include "rank_checks.h"
#include "sync/timeline/merge.h"
#include "sync/timeline/recorder.h"

using namespace gradex::test;
namespace timeline = gradex::sync::timeline;

namespace {

constexpr int kWorld = 3;
constexpr int kSteps = 4;

// The lines of `text` holding an event named `name` on row `tid` (any row: -1).
std::vector<std::string> events(const std::string& text, const std::string& name, int tid = -1) {
  std::vector<std::string> found;
  size_t at = 0;
  const std::string key = "{\"name\":\"" + name;
  while ((at = text.find(key, at)) != std::string::npos) {
    const size_t end = text.find('\n', at);
    std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (tid < 0 || line.find("\"tid\":" + std::to_string(tid) + ",") != std::string::npos)
      found.push_back(line);
    at += key.size();
  }
  return found;
}

uint64_t member(const std::string& line, const std::string& name) {
  const size_t at = line.find("\"" + name + "\":");
  return at == std::string::npos ? 0
                                 : std::strtoull(line.c_str() + at + name.size() + 3, nullptr, 10);
}

std::string train(RankContext& ctx) {
  std::vector<float> big(20000), small(300), bias(10);
  RANK_OK(gradex_register_tensor(ctx.engine, "fc.weight", big.size(), GRADEX_FLOAT32,
                                 GRADEX_DEVICE_CPU));
  RANK_OK(gradex_register_tensor(ctx.engine, "fc.bias", bias.size(), GRADEX_FLOAT32,
                                 GRADEX_DEVICE_CPU));
  RANK_OK(gradex_register_tensor(ctx.engine, "head \"q\"", small.size(), GRADEX_FLOAT32,
                                 GRADEX_DEVICE_CPU));
  for (int step = 0; step < kSteps; ++step) {
    for (size_t i = 0; i < big.size(); ++i)
      big[i] = static_cast<float>((i * 7 + static_cast<size_t>(ctx.rank) + step) % 101) - 50.0f;
    for (float& x : small)
      x = 1.0f;
    for (float& x : bias)
      x = 2.0f;
    gradex_handle_t h[3];
    RANK_OK(gradex_submit(ctx.engine, "fc.weight", big.data(), &h[0]));
    RANK_OK(gradex_submit(ctx.engine, "fc.bias", bias.data(), &h[1]));
    RANK_OK(gradex_submit(ctx.engine, "head \"q\"", small.data(), &h[2]));
    for (gradex_handle_t handle : h)
      RANK_OK(gradex_wait(ctx.engine, handle));
    int average_now = 0;
    RANK_OK(gradex_end_step(ctx.engine, &average_now));
  }
  return "";
}

TEST(EngineTimeline, EveryRankRecordsEveryPhaseAndPeerOfEveryStep) {
  const ScratchDir scratch("timeline");
  const std::string dir = scratch.file("nested");
  ASSERT_EQ(failures(run_ranks(kWorld,
                               {"GRADEX_TIMELINE=" + dir, "GRADEX_POLICY=fixed",
                                "GRADEX_SPARSITY=0.99", "GRADEX_WARMUP_STEPS=1"},
                               train)),
            "");
  for (int rank = 0; rank < kWorld; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::string text = read_text_file(dir + "/rank" + std::to_string(rank) + ".json");
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.substr(0, 2), "[\n");
    EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");  // closed at shutdown
    EXPECT_NE(text.find("\"origin_wall_us\":"), std::string::npos);
    EXPECT_EQ(events(text, "submit\"").size(), 3u * kSteps);
    EXPECT_EQ(events(text, "wait\"").size(), 3u * kSteps);
    EXPECT_NE(text.find("\"key\":\"head \\\"q\\\"\""), std::string::npos);  // escaped
    EXPECT_GE(events(text, "negotiate\"").size(), static_cast<size_t>(kSteps));
    // Step 0 (DGC's dense warm-up step) fuses all three tensors into one bucket; later steps send
    // the DGC tensor in a unit of its own beside the dense bucket (more units when a step's
    // submissions fall into two negotiation rounds).
    const auto encodes = events(text, "encode\"");
    const auto transfers = events(text, "transfer\"");
    const auto decodes = events(text, "decode\"");
    EXPECT_GE(transfers.size(), 2u * kSteps - 1);
    EXPECT_EQ(encodes.size(), transfers.size());
    EXPECT_EQ(decodes.size(), transfers.size());
    int sparse = 0, dense = 0;
    for (const std::string& t : transfers) {
      if (t.find("\"route\":\"sparse\"") != std::string::npos) {
        ++sparse;
        EXPECT_NE(t.find("\"codec\":\"dgc"), std::string::npos) << t;
      }
      if (t.find("\"route\":\"dense\"") != std::string::npos) ++dense;
      EXPECT_GT(member(t, "bytes_sent"), 0u) << t;
    }
    EXPECT_EQ(sparse, kSteps - 1);  // step 0 is the warm-up's dense step
    EXPECT_GE(dense, kSteps);
    EXPECT_EQ(events(text, "complete\"").size(), transfers.size());
    EXPECT_EQ(events(text, "step end\"", timeline::kWaitRow).size(), static_cast<size_t>(kSteps));
    EXPECT_GE(events(text, "framework waits on gradex\"", timeline::kWaitRow).size(), 1u);
    for (int peer = 0; peer < kWorld; ++peer) {
      SCOPED_TRACE("peer " + std::to_string(peer));
      const auto sends = events(text, "send ", timeline::send_row(peer));
      const auto recvs = events(text, "recv ", timeline::recv_row(peer));
      if (peer == rank) {
        EXPECT_TRUE(sends.empty() && recvs.empty());
        continue;
      }
      EXPECT_FALSE(events(text, "send sparse", timeline::send_row(peer)).empty());
      EXPECT_FALSE(events(text, "recv negotiation", timeline::recv_row(peer)).empty());
      uint64_t sent = 0, received = 0;
      for (const std::string& s : sends)
        sent += member(s, "bytes");
      for (const std::string& r : recvs)
        received += member(r, "bytes");
      EXPECT_GT(sent, 0u);
      EXPECT_GT(received, 0u);
    }
  }
  const timeline::Merged merged = timeline::merge_directory(dir);
  ASSERT_EQ(merged.ranks.size(), static_cast<size_t>(kWorld));
  for (const timeline::RankClock& r : merged.ranks) {
    EXPECT_GE(r.rounds_matched, r.pid == 0 ? 0u : static_cast<size_t>(kSteps)) << r.file;
    // One host: the system clocks agree; the rounds move a rank by well under a second.
    EXPECT_LT(std::abs(r.round_correction_us), 1e6) << r.file;
  }
  for (int pid = 0; pid < kWorld; ++pid)
    EXPECT_NE(merged.json.find("\"pid\":" + std::to_string(pid) + ","), std::string::npos);
}

TEST(EngineTimeline, MergeAlignsRanksOnTheirNegotiationRounds) {
  // Rank 1's clock reads 1000 us late by its system clock, and its rounds end 50 us after rank
  // 0's on that reading: the merge moves it by the rounds' median, whatever one outlier says. A
  // second engine of rank 0's process (rank0.2.json) runs rounds of its own: nothing aligns it
  // with the first engine's.
  const ScratchDir scratch("merge");
  const std::string& dir = scratch.path();
  auto write = [&](int rank, double wall, const std::vector<double>& ends, int engine = 1) {
    std::ofstream f(dir + "/rank" + std::to_string(rank) +
                    (engine > 1 ? "." + std::to_string(engine) : "") + ".json");
    const int pid = rank + (engine - 1) * 2;
    f << "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid
      << ",\"tid\":0,\"args\":{\"name\":\"rank " << rank << "\",\"engine\":" << engine
      << ",\"origin_wall_us\":" << wall << "}}";
    for (size_t k = 0; k < ends.size(); ++k)
      f << ",\n{\"name\":\"negotiate\",\"ph\":\"X\",\"ts\":" << ends[k] - 10
        << ",\"dur\":10,\"pid\":" << pid << ",\"tid\":10,\"args\":{\"round\":" << k << "}}";
    f << "\n]\n";
  };
  write(0, 5000, {100, 200, 300, 400});
  write(1, 6000, {-850, -750, -650, 5000});  // + 1000 us: 150, 250, 350 (and an outlier)
  write(0, 5000, {90000, 90100, 90200, 90300}, 2);
  const timeline::Merged m = timeline::merge_directory(dir);
  ASSERT_EQ(m.ranks.size(), 3u);
  EXPECT_EQ(m.ranks[2].engine, 2);
  EXPECT_EQ(m.ranks[2].rounds_matched, 0u);
  EXPECT_EQ(m.ranks[2].round_correction_us, 0.0);
  EXPECT_EQ(m.ranks[1].rounds_matched, 4u);
  EXPECT_NEAR(m.ranks[1].round_correction_us, -50.0, 1e-6);
  EXPECT_NEAR(m.ranks[1].offset_us - m.ranks[0].offset_us, 1000.0 - 50.0, 1e-6);
  // Rank 1's first round now ends where rank 0's does.
  EXPECT_NE(
      m.json.find("\"ts\":" + std::to_string(90 + static_cast<int>(m.ranks[0].offset_us)) + ".000"),
      std::string::npos);
  const ScratchDir empty("empty");
  EXPECT_THROW(timeline::merge_directory(empty.path()), gradex::InvalidArgument);
}

TEST(EngineTimeline, RecorderNamesFilesEscapesAndRefusesAnUnwritableDirectory) {
  const ScratchDir scratch("recorder");
  const std::string& dir = scratch.path();
  {
    timeline::Recorder first(dir, 2, 4);
    timeline::Recorder second(dir, 2, 4);
    EXPECT_EQ(first.path(), dir + "/rank2.json");
    EXPECT_EQ(second.path(), dir + "/rank2.2.json");
    const auto t = timeline::Clock::now();
    first.span(first.thread_row("caller"), "a\tb", t, t, timeline::Args().add("k", "x\"y\\z"));
  }
  const std::string text = read_text_file(dir + "/rank2.json");
  EXPECT_NE(text.find("\"name\":\"a\\tb\""), std::string::npos);
  EXPECT_NE(text.find("\"k\":\"x\\\"y\\\\z\""), std::string::npos);
  EXPECT_NE(text.find("\"name\":\"caller 1\""), std::string::npos);
  EXPECT_NE(read_text_file(dir + "/rank2.2.json").find("\"pid\":6,"), std::string::npos);
  EXPECT_THROW(timeline::Recorder("/proc/gradex-no-such-dir", 0, 1), gradex::ConfigError);
}

TEST(EngineTimeline, AnUnwritableDirectoryFailsEngineCreationNamingTheVariable) {
  const auto results = run_ranks(
      1, {"GRADEX_TIMELINE=/proc/gradex-no-such-dir"},
      [](RankContext& ctx) -> std::string {
        gradex_engine_t* engine = nullptr;
        std::string error;
        const gradex_status_t status = create_engine(ctx.rank, ctx.world, &engine, &error);
        if (engine != nullptr) gradex_engine_destroy(engine);
        RANK_REQUIRE(status == GRADEX_ERR_CONFIG, "status " << status << ": " << error);
        RANK_REQUIRE(error.find("GRADEX_TIMELINE") != std::string::npos, error);
        return "";
      },
      std::chrono::seconds(60), false);
  EXPECT_EQ(failures(results), "");
}

}  // namespace
