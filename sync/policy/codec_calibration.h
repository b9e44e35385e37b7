// The auto policy's start-up calibration: what each codec, each ring's sum and the transport cost
// on this machine, measured alone before the first plan (the units' measured times correct them
// later: CodecPlanner::observe_unit, cost::Snapshot::codec_factor). Codecs are built through the
// engine's own factory (sync/data/codec_factory.h), so the measured codec is the one the engine
// runs.
#pragma once

#include "base/config.h"
#include "sync/engine/options.h"
#include "sync/policy/cost_model.h"
#include "sync/policy/link_probe.h"

namespace gradex::sync {

struct CalibrationSettings {
  const config::Config& config;
  const EngineOptions& options;
  int world_size = 1;
  double dgc_sparsity = 0.999;  // the sparse rung DGC is priced at (the ladder's top)
  double adam_sparsity = 0.98;  // the Adam codec's rung (GRADEX_OPTIMIZER=adam)
};

// Per-element costs of the dense codecs (fp32 bucket copies, the 16-bit casts, the 8-bit codec),
// the rings' sums, gradex's momentum and DGC's encode and decode, into `model`.
void calibrate_codecs(cost::CostModel& model, const CalibrationSettings& settings);
// The Adam codec's encode and decode costs and its bytes per value, into `model`.
void calibrate_adam_codec(cost::CostModel& model, const CalibrationSettings& settings);
// The transport's CPU per byte (cost::CodecCosts::transport_s_per_byte): from the link probe's
// round trips when it ran (`probe`), else from a loopback connection (sync/policy/transport_cpu.h).
void calibrate_transport(cost::CostModel& model, const cost::ProbeResult* probe);

}  // namespace gradex::sync
