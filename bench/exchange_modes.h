// The gradient-exchange modes that `gradex-bench exchange` compares. A mode turns each rank's flat
// gradient buffer into the averaged gradient the optimizer would see, the way one exchange
// strategy would (dense fp32 allreduce, fp16 on the wire, later DGC and LocalSGD through the sync
// engine). Adding a mode = one factory in the table of exchange_modes.cc; the harness times it,
// counts its bytes on the wire and verifies its output generically.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/config.h"
#include "bench/average_check.h"
#include "bench/model_profile.h"
#include "comm/communicator.h"

namespace gradex::bench {

struct ModeContext {
  comm::Communicator& comm;
  const ModelProfile& model;
  const config::Config& config;
  std::shared_ptr<comm::Store> store;  // for modes that bootstrap their own engine
  std::string name;                    // the mode's name (a store namespace of its own)
  // The engine's modes hand a step's tensors over in this many groups of consecutive tensors
  // (as a framework's buckets come out of the backward pass), `group_gap_ms` apart.
  int submit_groups = 1;
  double group_gap_ms = 0;
  // Rank r hands a step's gradients over r * skew_ms after rank 0 does.
  double skew_ms = 0;
};

class ExchangeMode {
 public:
  virtual ~ExchangeMode() = default;
  // One training step's exchange, timed by the harness: `grads` holds this rank's gradients
  // (model.total_numel floats, tensors back to back in profile order) and is replaced by what the
  // optimizer would receive. Every rank calls step() the same number of times.
  virtual void step(float* grads, size_t count) = 0;
  // How close step()'s output is to the exact average. nullopt for modes whose output is not meant
  // to be the average (sparsified or periodic modes), which then verify themselves in step().
  virtual std::optional<Tolerance> tolerance() const = 0;
  // Bytes this rank has sent so far, for modes that send through their own communicator (the sync
  // engine); nullopt: the harness reads the shared communicator's counter.
  virtual std::optional<uint64_t> bytes_sent() const { return std::nullopt; }
  // Bytes of negotiation messages this rank has sent so far (included in bytes_sent()), for modes
  // that negotiate (the sync engine); nullopt for the others.
  virtual std::optional<uint64_t> control_bytes() const { return std::nullopt; }
  // Under GRADEX_POLICY=auto, the codecs the newest plan chose ("16-bit 120 tensors (3.1 M values),
  // dgc 99.9% 41 (22.0 M)"); "" for the other modes.
  virtual std::string codec_mix() const { return ""; }
};

// codec_mix()'s line from gradex_explain's text ("" when it is not an auto plan).
std::string codec_mix_of_plan(const std::string& explain_text);

struct ModeSpec {
  std::string name;         // RESULT keys are "<name>_step_ms" etc.: [a-z0-9_]
  std::string description;  // one line for --help and the report
  std::function<std::unique_ptr<ExchangeMode>(ModeContext&)> create;
  // False for comparison modes that run only when named in --modes (not in "all", nor in the
  // suites that run every listed mode).
  bool in_all = true;
};

// The modes driven through the sync engine (bench/engine_modes.cc), in report order.
std::vector<ModeSpec> engine_modes();

// Every available mode, in report order.
const std::vector<ModeSpec>& exchange_modes();

// The modes named in a comma-separated list ("all" for every mode), in list order.
// InvalidArgument naming the available modes for an unknown or repeated name.
std::vector<const ModeSpec*> select_modes(const std::string& list);

}  // namespace gradex::bench
