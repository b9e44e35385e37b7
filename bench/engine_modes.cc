// Exchange modes driven through the sync engine (the path a framework plugin takes): each mode
// opens its own engine with a few GRADEX_* settings on top of the environment's, registers the
// model's tensors by name and submits them every step, as a plugin would after backward.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.h"
#include "bench/exchange_modes.h"
#include "comm/rendezvous/store.h"
#include "sync/engine/engine.h"

namespace gradex::bench {
namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

class EngineMode : public ExchangeMode {
 public:
  // `settings` override the environment; `defaults` apply where the environment is silent.
  // `averages16`: the mode's output is the average through a 16-bit wire (checked by the harness
  // at dense_fp16's tolerance); otherwise it is not the average and is not checked.
  EngineMode(ModeContext& ctx, const Settings& settings, const Settings& defaults, bool averages16)
      : model_(ctx.model),
        world_(ctx.comm.size()),
        averages16_(averages16),
        groups_(std::max(1, ctx.submit_groups)),
        group_gap_(std::chrono::duration<double, std::milli>(ctx.group_gap_ms)),
        skew_(std::chrono::duration<double, std::milli>(ctx.skew_ms * ctx.comm.rank())) {
    config::Config config = ctx.config;
    for (const auto& [name, value] : settings)
      config.set(name, value);
    for (const auto& [name, value] : defaults)
      if (config.source_of(name) == config::Source::kDefault) config.set(name, value);
    local_sgd_ = config.get_int("GRADEX_LOCALSGD_PERIOD") > 0;
    engine_ = std::make_unique<sync::Engine>(
        std::move(config), comm::make_prefix_store(ctx.store, "engine/" + ctx.name + "/"),
        ctx.comm.rank(), ctx.comm.size());
    for (const TensorSpec& t : model_.tensors)
      engine_->register_tensor(t.name, static_cast<uint64_t>(t.numel), DType::kFloat32);
  }

  // LocalSGD: local steps exchange nothing; every H steps the parameters are averaged. The buffer
  // averaged here is this step's gradient buffer, which costs the same as real parameters would
  // (same size, same fp32 anchor round then 16-bit deltas) without timing an optimizer update that
  // the other modes do not pay either.
  void step(float* grads, size_t count) override {
    exchange(grads, /*average=*/false);
    if (engine_->end_step() && local_sgd_) exchange(grads, /*average=*/true);
  }

  std::optional<Tolerance> tolerance() const override {
    if (!averages16_) return std::nullopt;
    const double p = world_;
    return Tolerance{std::ldexp(1.0, -11) * (p + 2), std::ldexp(1.0, -24) * (p + 2)};
  }

  std::optional<uint64_t> bytes_sent() const override {
    sync::Stats s = engine_->stats(false);
    return s.bytes_sent + s.control_bytes;
  }

  std::optional<uint64_t> control_bytes() const override {
    return engine_->stats(false).control_bytes;
  }

  std::string codec_mix() const override { return codec_mix_of_plan(engine_->explain()); }

 private:
  // Submits every tensor (in profile order, as backward would hand them over; gradients in
  // groups_ groups of consecutive tensors, group_gap_ apart, the first skew_ after the call),
  // then waits for all.
  void exchange(float* base, bool average) {
    handles_.clear();
    if (!average && skew_.count() > 0) std::this_thread::sleep_for(skew_);
    int64_t offset = 0;
    const size_t n = model_.tensors.size();
    for (size_t i = 0; i < n; ++i) {
      const TensorSpec& t = model_.tensors[i];
      const size_t group = i * static_cast<size_t>(groups_) / n;
      if (!average && i > 0 && group != (i - 1) * static_cast<size_t>(groups_) / n)
        std::this_thread::sleep_for(group_gap_);
      float* data = base + offset;
      handles_.push_back(average ? engine_->average(t.name, data) : engine_->submit(t.name, data));
      offset += t.numel;
    }
    for (uint64_t h : handles_)
      engine_->wait(h);
  }

  const ModelProfile& model_;
  const int world_;
  const bool averages16_;
  const int groups_;
  const std::chrono::duration<double, std::milli> group_gap_;
  const std::chrono::duration<double, std::milli> skew_;
  std::unique_ptr<sync::Engine> engine_;
  bool local_sgd_ = false;
  std::vector<uint64_t> handles_;
};

std::function<std::unique_ptr<ExchangeMode>(ModeContext&)> engine_factory(Settings settings,
                                                                          Settings defaults = {},
                                                                          bool averages16 = false) {
  return [settings, defaults, averages16](ModeContext& ctx) {
    return std::make_unique<EngineMode>(ctx, settings, defaults, averages16);
  };
}

}  // namespace

std::string codec_mix_of_plan(const std::string& text) {
  if (text.rfind("GRADEX_POLICY=auto", 0) != 0) return "";
  std::istringstream lines(text);
  std::string line;
  bool in_table = false;
  struct Mix {
    int tensors = 0;
    double values = 0;
    int floored = 0;   // dense because every sparse rung would keep too few values (its floor)
    int by_model = 0;  // dense by the cost model's choice
  };
  std::map<std::string, Mix> mix;  // codec -> its tensors
  while (std::getline(lines, line)) {
    if (line.rfind("tensor ", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    std::istringstream fields(line);
    std::string name, codec, sparsity;
    double elements = 0;
    if (!(fields >> name >> elements >> codec)) break;  // the table ends at its first non-row
    const bool sparse = codec == "dgc" || codec == "adam";
    if (sparse && fields >> sparsity) codec += " " + sparsity;
    Mix& m = mix[codec];
    ++m.tensors;
    m.values += elements;
    // The row's reason (sync/policy/codec_choice.cc: allowed_rungs) says when the floor of values a
    // sparse rung keeps, not the cost model, kept the tensor off every sparse rung.
    if (sparse) continue;
    if (line.find("too small for any sparse rung") != std::string::npos)
      ++m.floored;
    else
      ++m.by_model;  // the cost model's: hidden, no cheaper rung, or as far as the link needs
  }
  std::ostringstream out;
  out.precision(3);
  for (const auto& [codec, m] : mix) {
    out << (out.tellp() > 0 ? ", " : "") << codec << " " << m.tensors << " tensors ("
        << m.values / 1e6 << " M values";
    if (m.floored > 0) out << "; " << m.floored << " too small for any sparse rung";
    if (m.by_model > 0)
      out << "; " << m.by_model << " left dense by the cost model (the link needs no more)";
    out << ")";
  }
  return out.str();
}

// The settings of the modes that others vary (dgc999's two-round and sealed forms, engine16's
// sealed forms), and a mode's settings with more on top. Functions, not globals: the mode table may
// be built during another file's static initialization, before this file's globals would be.
Settings dgc999_settings() {
  return {{"GRADEX_POLICY", "fixed"}, {"GRADEX_SPARSITY", "0.999"}, {"GRADEX_MOMENTUM", "0.9"}};
}
Settings engine16_settings() {
  return {{"GRADEX_POLICY", "fixed"},
          {"GRADEX_SPARSITY_OVERRIDES", "*:dense"},
          {"GRADEX_FP16", "1"},
          {"GRADEX_MOMENTUM", "0"}};
}
Settings plus(Settings base, const Settings& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

std::vector<ModeSpec> engine_modes() {
  return {
      // DGC as the paper runs it: momentum correction at 0.9 (GRADEX_MOMENTUM's default is 0, which
      // the plugins change only for an SGD optimizer with momentum); the same for auto, so that
      // auto and the fixed modes compare like with like.
      // The default policy twice: in its steady state (what every step after the early-training
      // ramp runs: the ramp lifted unless the environment sets one), and inside the ramp's first
      // quarter, where the measured steps of a short run fall (DGC capped at 75%, which at a few
      // ranks sends more than a dense 16-bit ring, so the cost model sends 16-bit there).
      {"auto",
       "GRADEX_POLICY=auto (the default) in its steady state, past the early-training ramp "
       "(GRADEX_POLICY_RAMP_STEPS=0 unless set): per-tensor codec from the cost model, momentum "
       "0.9",
       engine_factory({{"GRADEX_POLICY", "auto"}, {"GRADEX_MOMENTUM", "0.9"}},
                      {{"GRADEX_POLICY_RAMP_STEPS", "0"}})},
      {"auto_ramp",
       "GRADEX_POLICY=auto (the default) inside the first quarter of its early-training ramp "
       "(GRADEX_POLICY_RAMP_STEPS' default: DGC capped at 75% for its first 25 steps), momentum "
       "0.9",
       engine_factory({{"GRADEX_POLICY", "auto"}, {"GRADEX_MOMENTUM", "0.9"}})},
      {"fixed",
       "GRADEX_POLICY=fixed: DGC 99.9% for large tensors, fused fp16 for small, "
       "momentum 0.9",
       engine_factory({{"GRADEX_POLICY", "fixed"}, {"GRADEX_MOMENTUM", "0.9"}})},
      {"dgc99", "engine, DGC at 99% sparsity for tensors >= GRADEX_DENSE_THRESHOLD, momentum 0.9",
       engine_factory(
           {{"GRADEX_POLICY", "fixed"}, {"GRADEX_SPARSITY", "0.99"}, {"GRADEX_MOMENTUM", "0.9"}})},
      {"dgc999",
       "engine, DGC at 99.9% sparsity for tensors >= GRADEX_DENSE_THRESHOLD, momentum 0.9",
       engine_factory(dgc999_settings())},
      // dgc999 with every allgatherv in two rounds (sizes, then payloads): what the engine did
      // before one-round allgathervs, with the direct exchange (auto below 8 ranks then) and with
      // the ring (auto from 8 ranks then); negotiation in two rounds too.
      {"dgc999_2round", "dgc999 with two-round allgathervs (GRADEX_ALLGATHER_INLINE_KB=0), direct",
       engine_factory(plus(dgc999_settings(), {{"GRADEX_ALLGATHER_INLINE_KB", "0"},
                                               {"GRADEX_SPARSE_COLLECTIVE", "direct"}})),
       /*in_all=*/false},
      {"dgc999_2round_ring",
       "dgc999 with two-round allgathervs (GRADEX_ALLGATHER_INLINE_KB=0), ring",
       engine_factory(plus(dgc999_settings(), {{"GRADEX_ALLGATHER_INLINE_KB", "0"},
                                               {"GRADEX_SPARSE_COLLECTIVE", "ring"}})),
       /*in_all=*/false},
      // The engine's dense route for every tensor: the exchange the hierarchical layouts (hosts or
      // regions as groups, GRADEX_HIERARCHICAL) apply to, where dense_fp16 bypasses the engine.
      {"engine16",
       "engine, every tensor dense on the 16-bit wire (GRADEX_SPARSITY_OVERRIDES=*:dense, "
       "GRADEX_FP16=1), no momentum: the average, through the engine's (hierarchical) layout",
       engine_factory(engine16_settings(), {}, /*averages16=*/true),
       /*in_all=*/false},
      // The sealed data plane's cost, side by side (--interleave) under one job secret: the same
      // engine sealed (GRADEX_SEAL=on) and in clear (off). Without a secret the sealed ones stop at
      // start-up naming GRADEX_SEAL and GRADEX_JOB_SECRET.
      {"dgc999_sealed",
       "dgc999 with every message sealed (GRADEX_SEAL=on; needs GRADEX_JOB_SECRET)",
       engine_factory(plus(dgc999_settings(), {{"GRADEX_SEAL", "on"}})),
       /*in_all=*/false},
      {"dgc999_clear", "dgc999 in clear even with a job secret (GRADEX_SEAL=off)",
       engine_factory(plus(dgc999_settings(), {{"GRADEX_SEAL", "off"}})),
       /*in_all=*/false},
      {"engine16_sealed", "engine16 with every message sealed (GRADEX_SEAL=on; needs a secret)",
       engine_factory(plus(engine16_settings(), {{"GRADEX_SEAL", "on"}}), {}, /*averages16=*/true),
       /*in_all=*/false},
      {"engine16_clear", "engine16 in clear even with a job secret (GRADEX_SEAL=off)",
       engine_factory(plus(engine16_settings(), {{"GRADEX_SEAL", "off"}}), {}, /*averages16=*/true),
       /*in_all=*/false},
      {"int8",
       "engine, every tensor on the dense 8-bit route (GRADEX_SPARSITY_OVERRIDES=*:int8), "
       "momentum 0.9",
       engine_factory({{"GRADEX_POLICY", "fixed"},
                       {"GRADEX_SPARSITY_OVERRIDES", "*:int8"},
                       {"GRADEX_MOMENTUM", "0.9"}})},
      {"int4",
       "engine, every tensor on the dense 4-bit route (GRADEX_SPARSITY_OVERRIDES=*:int4), "
       "momentum 0.9",
       engine_factory({{"GRADEX_POLICY", "fixed"},
                       {"GRADEX_SPARSITY_OVERRIDES", "*:int4"},
                       {"GRADEX_MOMENTUM", "0.9"}}),
       /*in_all=*/false},
      {"localsgd4", "engine, LocalSGD: parameters averaged every 4 steps, no gradient traffic",
       engine_factory({{"GRADEX_LOCALSGD_PERIOD", "4"}})},
      {"localsgd8", "engine, LocalSGD: parameters averaged every 8 steps, no gradient traffic",
       engine_factory({{"GRADEX_LOCALSGD_PERIOD", "8"}})},
  };
}

}  // namespace gradex::bench
