// Never silently wrong, with real processes over real UCX:
//   - ranks started with different values of any variable that must agree fail at start-up, on
//     every rank, with a ConfigError naming the variable, both values and the ranks (one test per
//     variable, generated from the registry's declarations);
//   - one rank's own failure reaches every other rank (naming it and carrying its message) at once,
//     even a rank asleep with nothing to do; save_state then refuses;
//   - a rank whose first announcement of a key races rank 0's timeout abort of it fails with the
//     others and keeps no entry behind (the next exchange of the key waits for it, as it should);
//   - a rank waiting for stopped peers to start the next round fails after the timeout, naming
//   them.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "process_ranks.h"
#include "rank_checks.h"

using namespace gradex::test;
namespace config = gradex::config;

namespace {

double monotonic_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // one clock for every process of the machine
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

bool valid(const std::string& name, const std::string& value) {
  try {
    config::Config c;
    c.set(name, value);
    return true;
  } catch (const gradex::ConfigError&) {
    return false;
  }
}

std::string canonical(const std::string& name, const std::string& value) {
  config::Config c;
  c.set(name, value);
  return c.canonical_text(name);
}

// A valid value other than the default, for any declared variable.
std::string other_value(const config::VarSpec& s) {
  const std::string def = s.default_value;
  std::vector<std::string> candidates;
  switch (s.type) {
    case config::VarType::kBool:
      candidates = {def == "1" ? "0" : "1"};
      break;
    case config::VarType::kChoice: {
      // GRADEX_SEAL=on without a job secret is refused on its own, before any agreement: off
      // differs from the default auto and, without a secret, connects.
      if (std::string(s.name) == "GRADEX_SEAL") {
        candidates.push_back("off");
        break;
      }
      std::string choices = s.choices;
      for (size_t at = 0; at <= choices.size();) {
        size_t bar = choices.find('|', at);
        if (bar == std::string::npos) bar = choices.size();
        candidates.push_back(choices.substr(at, bar - at));
        at = bar + 1;
      }
      break;
    }
    case config::VarType::kString:
      // The ladder is parsed when the engine starts under auto: it needs a ladder's syntax.
      candidates = std::string(s.name) == "GRADEX_POLICY_LADDER"
                       ? std::vector<std::string>{"0.9,0.99"}
                       : std::vector<std::string>{"fc:dense", "other"};
      break;
    default: {
      const double d = std::strtod(def.c_str(), nullptr);
      for (double v : {d * 2, d + 1, s.min, (s.min + s.max) / 2}) {
        char buf[64];
        std::snprintf(buf, sizeof buf, s.type == config::VarType::kInt ? "%.0f" : "%g", v);
        candidates.push_back(buf);
      }
    }
  }
  for (const std::string& c : candidates)
    if (valid(s.name, c) && canonical(s.name, c) != canonical(s.name, def)) return c;
  return "";
}

std::vector<std::string> agreed_names(config::Agreement scope) {
  std::vector<std::string> names;
  for (const config::VarSpec& s : config::registry())
    if (config::agrees_in(s.agree, scope)) names.push_back(s.name);
  return names;
}

std::string param_name(const testing::TestParamInfo<std::string>& info) {
  return info.param.substr(std::string("GRADEX_").size());
}

// Rank 0 runs with the default, rank 1 with another value. Returns each rank's failure report.
std::vector<std::string> start_with_different(const std::string& name, bool outer) {
  const config::VarSpec& s = config::spec(name);
  const std::string other = other_value(s);
  if (other.empty()) return {"no other valid value for " + name};
  const std::string want = name + ": '" + canonical(name, s.default_value) + "' on ranks [0], '" +
                           canonical(name, other) + "' on ranks [1]";
  return run_ranks(
      2, {"GRADEX_TIMEOUT_S=30"},
      [&](RankContext& ctx) -> std::string {
        // Rank 0 states the default: the harness may set some variables (GRADEX_POLICY=fixed).
        ::setenv(name.c_str(), ctx.rank == 1 ? other.c_str() : s.default_value, 1);
        // An auto-only setting under the harness's fixed policy is a contradiction on its own
        // (sync/policy/policy_settings.h): the auto policy, which reads it, runs instead.
        if (name.rfind("GRADEX_POLICY_", 0) == 0) ::setenv("GRADEX_POLICY", "auto", 1);
        const auto t0 = std::chrono::steady_clock::now();
        gradex_engine_options_t options;
        gradex_engine_options_init(&options);
        options.rank = ctx.rank;
        options.world_size = ctx.world;
        gradex_status_t st;
        if (outer) {
          gradex_outer_t* o = nullptr;
          st = gradex_outer_create(&options, &o);
          if (st == GRADEX_OK) gradex_outer_destroy(o);
        } else {
          st = gradex_engine_create(&options, &ctx.engine);
        }
        const std::string error = st == GRADEX_OK ? "" : gradex_last_error();
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "rank %d: %s refused after %.3f s (bootstrap included)\n", ctx.rank,
                     name.c_str(), seconds);
        RANK_REQUIRE(st == GRADEX_ERR_CONFIG, "status " << st << ": " << error);
        RANK_REQUIRE(error.find(want) != std::string::npos, "want \"" << want << "\" in " << error);
        // Generous: the timeout is 30 s, and start-up includes UCX's bootstrap.
        RANK_REQUIRE(seconds < 15, "refused only after " << seconds << " s");
        return "";
      },
      std::chrono::seconds(60), /*create_engine=*/false);
}

class EngineVariableAgreement : public testing::TestWithParam<std::string> {};
TEST_P(EngineVariableAgreement, DifferentValuesAreAConfigErrorOnEveryRank) {
  EXPECT_EQ(failures(start_with_different(GetParam(), false)), "");
}
INSTANTIATE_TEST_SUITE_P(Registry, EngineVariableAgreement,
                         testing::ValuesIn(agreed_names(config::Agreement::kEngine)), param_name);

class OuterVariableAgreement : public testing::TestWithParam<std::string> {};
TEST_P(OuterVariableAgreement, DifferentValuesAreAConfigErrorOnEveryRank) {
  EXPECT_EQ(failures(start_with_different(GetParam(), true)), "");
}
INSTANTIATE_TEST_SUITE_P(Registry, OuterVariableAgreement,
                         testing::ValuesIn(agreed_names(config::Agreement::kOuter)), param_name);

// Variables that may differ do not stop a job.
TEST(EngineAgreementScope, PerRankVariablesMayDiffer) {
  auto results = run_ranks(
      2, {"GRADEX_TIMEOUT_S=30"},
      [&](RankContext& ctx) -> std::string {
        if (ctx.rank == 1) {
          ::setenv("GRADEX_THREADS", "2", 1);
          ::setenv("GRADEX_LOG_LEVEL", "error", 1);
          ::setenv("GRADEX_STALL_WARN_S", "5", 1);
          ::setenv("GRADEX_ZSTD_LEVEL", "3", 1);
        }
        std::string error;
        RANK_REQUIRE(create_engine(ctx.rank, ctx.world, &ctx.engine, &error) == GRADEX_OK, error);
        return "";
      },
      std::chrono::seconds(60), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}

// Rank 1 fails on its own (GRADEX_TEST_FAIL_ROUND=1: before its first negotiation round, which
// its submission starts) while rank 0 sleeps with nothing to do. Rank 0 learns it without any call
// of its own into a collective: save_state refuses, then a submission fails, both naming rank 1
// and its message. The time from rank 1's submission to rank 0's refusal is printed.
TEST(EngineAbort, SleepingRankLearnsOfAnotherRanksFailureAtOnce) {
  const std::string stamp = "/tmp/gradex_abort_test_" + std::to_string(::getpid());
  auto results = run_ranks(
      2, {"GRADEX_TIMEOUT_S=60", "GRADEX_SPARSITY=0"},
      [&](RankContext& ctx) -> std::string {
        if (ctx.rank == 1) ::setenv("GRADEX_TEST_FAIL_ROUND", "1", 1);
        std::string error;
        RANK_REQUIRE(create_engine(ctx.rank, ctx.world, &ctx.engine, &error) == GRADEX_OK, error);
        RANK_OK(gradex_register_tensor(ctx.engine, "w", 100, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<float> g(100, 1.0f);
        gradex_handle_t h;
        if (ctx.rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is asleep
          { std::ofstream(stamp) << std::to_string(monotonic_seconds()) << "\n"; }
          RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
          const gradex_status_t st = gradex_wait(ctx.engine, h);
          const std::string what = gradex_last_error();
          RANK_REQUIRE(
              st == GRADEX_ERR_INTERNAL && what.find("GRADEX_TEST_FAIL_ROUND") != std::string::npos,
              "status " << st << ": " << what);
          size_t length = 0;
          RANK_REQUIRE(gradex_save_state(ctx.engine, nullptr, 0, &length) == GRADEX_ERR_STATE,
                       "save_state after the failure: " << gradex_last_error());
          return "";
        }
        // Rank 0: polls save_state (which starts no round) until it refuses.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        size_t length = 0;
        gradex_status_t st = GRADEX_OK;
        while ((st = gradex_save_state(ctx.engine, nullptr, 0, &length)) == GRADEX_OK &&
               std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const double learned = monotonic_seconds();
        const std::string refusal = gradex_last_error();
        double failed_at = 0;
        { std::ifstream(stamp) >> failed_at; }
        std::fprintf(stderr, "rank 0 refused save_state %.3f s after rank 1 submitted\n",
                     learned - failed_at);
        RANK_REQUIRE(st == GRADEX_ERR_STATE, "status " << st << ": " << refusal);
        RANK_REQUIRE(refusal.find("rank 1 failed") != std::string::npos &&
                         refusal.find("GRADEX_TEST_FAIL_ROUND") != std::string::npos,
                     refusal);
        RANK_REQUIRE(failed_at > 0 && learned - failed_at < 10,
                     "learned after " << learned - failed_at << " s");
        const gradex_status_t sub = gradex_submit(ctx.engine, "w", g.data(), &h);
        const std::string what = gradex_last_error();
        RANK_REQUIRE(sub == GRADEX_ERR_INTERNAL && what.find("rank 1 failed") != std::string::npos,
                     "status " << sub << ": " << what);
        return "";
      },
      std::chrono::seconds(90), /*create_engine=*/false);
  ::unlink(stamp.c_str());
  EXPECT_EQ(failures(results), "");
}

// A rank whose work waits for the others to start the next round, while those others have stopped
// (SIGSTOP: alive to the kernel, silent to gradex, as a hung or cut-off host), fails after
// GRADEX_TIMEOUT_S naming them: it probes its peers when no round has started for the timeout.
// Rank 2 announces "w" in a round the others join with nothing; then ranks 0 and 1 stop before rank
// 0's own deadline for "w" could abort it. Without the probe rank 2 waited for ever (the
// watchdog's kill).
TEST(EngineAbort, ARankWaitingOnSilentPeersFailsNamingThemAfterTheTimeout) {
  const std::string stem = "/tmp/gradex_passive_wait_" + std::to_string(::getpid()) + "_";
  auto results = run_ranks(
      3, {"GRADEX_TIMEOUT_S=4", "GRADEX_SPARSITY=0"},
      [&](RankContext& ctx) -> std::string {
        { std::ofstream(stem + std::to_string(ctx.rank)) << ::getpid() << "\n"; }
        RANK_OK(gradex_register_tensor(ctx.engine, "w", 100, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        if (ctx.rank != 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // rank 2's round is over
          ::raise(SIGSTOP);
          return "";  // resumed by rank 2 once it has failed; its abort notice ends this engine
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        std::vector<float> g(100, 1.0f);
        gradex_handle_t h;
        const double from = monotonic_seconds();
        RANK_OK(gradex_submit(ctx.engine, "w", g.data(), &h));
        const gradex_status_t st = gradex_wait(ctx.engine, h);
        const double waited = monotonic_seconds() - from;
        const std::string what = gradex_last_error();
        for (int r = 0; r < 2; ++r) {
          pid_t pid = 0;
          { std::ifstream(stem + std::to_string(r)) >> pid; }
          if (pid > 0) ::kill(pid, SIGCONT);
        }
        std::fprintf(stderr, "rank 2 failed %.2f s after submitting: %s\n", waited, what.c_str());
        RANK_REQUIRE(st == GRADEX_ERR_TIMEOUT, "status " << st << ": " << what);
        RANK_REQUIRE(what.find("not answering a liveness probe (stopped, hung or dead): 0 1") !=
                         std::string::npos,
                     what);
        RANK_REQUIRE(waited < 4 + 10, "failed after " << waited << " s");
        return "";
      },
      std::chrono::seconds(60));
  for (int r = 0; r < 3; ++r)
    ::unlink((stem + std::to_string(r)).c_str());
  EXPECT_EQ(failures(results), "");
}

// Four ranks exchanging steadily; rank 2 fails on its own in its third round, in the middle of the
// others' exchanges. Every rank's step fails, the others' naming rank 2 and its message.
TEST(EngineAbort, InjectedFailureOnOneRankReachesEveryRank) {
  auto results = run_ranks(
      4, {"GRADEX_TIMEOUT_S=60", "GRADEX_SPARSITY=0", "GRADEX_DENSE_THRESHOLD=1000"},
      [&](RankContext& ctx) -> std::string {
        if (ctx.rank == 2) ::setenv("GRADEX_TEST_FAIL_ROUND", "3", 1);
        std::string error;
        RANK_REQUIRE(create_engine(ctx.rank, ctx.world, &ctx.engine, &error) == GRADEX_OK, error);
        RANK_OK(gradex_register_tensor(ctx.engine, "a", 500, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "b", 5000, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        std::vector<float> a(500, 1.0f), b(5000, 1.0f);
        const auto t0 = std::chrono::steady_clock::now();
        for (int step = 0; step < 50; ++step) {
          gradex_handle_t ha, hb;
          gradex_status_t st = gradex_submit(ctx.engine, "a", a.data(), &ha);
          if (st == GRADEX_OK) {
            st = gradex_submit(ctx.engine, "b", b.data(), &hb);
            const gradex_status_t wa = gradex_wait(ctx.engine, ha);
            if (st == GRADEX_OK) st = gradex_wait(ctx.engine, hb);
            if (wa != GRADEX_OK) st = wa;
          }
          if (st == GRADEX_OK) {
            RANK_OK(gradex_end_step(ctx.engine, nullptr));
            continue;
          }
          const std::string what = gradex_last_error();
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::fprintf(stderr, "rank %d failed at step %d after %.3f s: %s\n", ctx.rank, step,
                       seconds, what.c_str());
          RANK_REQUIRE(st == GRADEX_ERR_INTERNAL, "status " << st << ": " << what);
          RANK_REQUIRE(what.find("GRADEX_TEST_FAIL_ROUND") != std::string::npos, what);
          if (ctx.rank != 2) RANK_REQUIRE(what.find("rank 2 failed") != std::string::npos, what);
          RANK_REQUIRE(seconds < 30, "failed only after " << seconds << " s");
          return "";
        }
        return "no rank failed";
      },
      std::chrono::seconds(90), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}

// GRADEX_TIMEOUT_S=1 on rank 0 (whose clock alone aborts keys; rank 1 waits up to 30 s): rank 0
// submits "k" and aborts it after 1 s; rank 1 submits
// "k" around that moment (a sweep of delays, so that its first announcement falls before, into and
// after the abort's round). Whatever the timing, both ranks then exchange "k" again correctly,
// rank 1 resubmitting it late: a stale entry left by the race would make the key ready while rank
// 1 has no handle for it (a failed check on rank 1).
TEST(EngineAbort, AnnouncementRacingRankZerosTimeoutAbortLeavesNothingBehind) {
  auto results = run_ranks(
      2, {"GRADEX_SPARSITY=0", "GRADEX_FP16=0", "GRADEX_MOMENTUM=0"},
      [&](RankContext& ctx) -> std::string {
        ::setenv("GRADEX_TIMEOUT_S", ctx.rank == 0 ? "1" : "30", 1);
        std::string error;
        RANK_REQUIRE(create_engine(ctx.rank, ctx.world, &ctx.engine, &error) == GRADEX_OK, error);
        RANK_OK(gradex_register_tensor(ctx.engine, "k", 64, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        RANK_OK(gradex_register_tensor(ctx.engine, "sync", 1, GRADEX_FLOAT32, GRADEX_DEVICE_CPU));
        for (int delay_ms : {950, 1000, 1020, 1050, 1100}) {
          std::vector<float> k(64, static_cast<float>(ctx.rank + 1)), s(1, 1.0f);
          gradex_handle_t h;
          // Line the ranks up.
          RANK_OK(gradex_submit(ctx.engine, "sync", s.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          if (ctx.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
          RANK_OK(gradex_submit(ctx.engine, "k", k.data(), &h));
          const gradex_status_t first = gradex_wait(ctx.engine, h);  // either outcome is fine
          // Rank 1 is done by delay + 1 s at the latest (its own entry aborted by rank 0's clock);
          // rank 0 (done at ~1 s) waits so that both reach the next key within its 1 s.
          if (ctx.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(550));
          // Again, rank 1 late (but within the timeout).
          std::fill(k.begin(), k.end(), static_cast<float>(ctx.rank + 1));
          RANK_OK(gradex_submit(ctx.engine, "sync", s.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          if (ctx.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
          RANK_OK(gradex_submit(ctx.engine, "k", k.data(), &h));
          RANK_OK(gradex_wait(ctx.engine, h));
          RANK_REQUIRE(k[0] == 1.5f && k[63] == 1.5f, "delay " << delay_ms
                                                               << " ms (first exchange: status "
                                                               << first << "): average " << k[0]);
        }
        return "";
      },
      std::chrono::seconds(120), /*create_engine=*/false);
  EXPECT_EQ(failures(results), "");
}

}  // namespace
