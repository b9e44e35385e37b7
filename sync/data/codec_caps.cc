// The fidelity caps of GRADEX_POLICY=auto's choice (contracts in sync/policy/codec_choice.h: "Early
// training" and "The end of training"): the most sparsity the ramp and the horizon rule allow at an
// agreed step, the steps where they change, and the ladder and 8-bit rung they leave. Pure
// functions of the shared options and the step, so every rank applies the same caps.
#include <algorithm>
#include <cmath>

#include "compress/dgc/schedule.h"
#include "sync/policy/codec_choice.h"

namespace gradex::sync::cost {

double ramp_cap(const ChoiceOptions& o, uint64_t step) {
  if (o.ramp_steps == 0 || step >= o.ramp_steps || o.ladder.empty()) return 1.0;
  compress::DgcOptions ramp;
  ramp.sparsity = o.ladder.back();
  ramp.warmup_steps = static_cast<int64_t>(o.ramp_steps);
  return compress::dgc::sparsity_at(ramp, step);
}

std::vector<uint64_t> ramp_stage_starts(const ChoiceOptions& o) {
  std::vector<uint64_t> starts;
  if (o.ramp_steps == 0) return starts;
  // sparsity_at's stage is step * 4 / ramp_steps: quarter q starts at ceil(q * ramp_steps / 4).
  for (uint64_t q = 1; q <= 4; ++q) {
    const uint64_t s = (q * o.ramp_steps + 3) / 4;
    if (s > 0 && (starts.empty() || s > starts.back())) starts.push_back(s);
  }
  return starts;
}

double horizon_cap(const ChoiceOptions& o, uint64_t step) {
  if (o.horizon_steps == 0 || step >= o.horizon_steps) return 1.0;
  const double left = static_cast<double>(o.horizon_steps - step);
  return std::max(0.0, 1.0 - kHorizonDrains / left);
}

std::vector<uint64_t> horizon_stage_starts(const ChoiceOptions& o) {
  std::vector<uint64_t> starts;
  if (o.horizon_steps == 0) return starts;
  // Sparsity s is allowed while horizon - step >= kHorizonDrains / (1 - s): the first step past
  // that is where a plan must drop below s. The densities: every ladder rung's and 1/(2P).
  std::vector<double> densities;
  for (double s : o.ladder)
    densities.push_back(1.0 - s);
  for (double d : densities) {
    // Allowed while horizon - step >= ceil(kHorizonDrains / d).
    // (less a rounding margin: 1 - 0.9 is a hair under 0.1 in binary)
    const double need = std::ceil(kHorizonDrains / d - 1e-9);
    if (need <= static_cast<double>(o.horizon_steps))
      starts.push_back(o.horizon_steps - static_cast<uint64_t>(need) + 1);
  }
  // Every DGC rung is denser than 1/(2P) once horizon - step <= kHorizonDrains * 2P: dense.
  const double dense_left = std::floor(kHorizonDrains * 2.0 * std::max(o.world_size, 1));
  if (dense_left < static_cast<double>(o.horizon_steps))
    starts.push_back(o.horizon_steps - static_cast<uint64_t>(dense_left));
  starts.push_back(o.horizon_steps);  // past the horizon: no cap
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  starts.erase(std::remove(starts.begin(), starts.end(), uint64_t{0}), starts.end());
  return starts;
}

double sparsity_cap(const ChoiceOptions& o, uint64_t step) {
  return std::min(ramp_cap(o, step), horizon_cap(o, step));
}

std::vector<double> ramped_ladder(const ChoiceOptions& o, uint64_t step) {
  const double cap = sparsity_cap(o, step);
  std::vector<double> ladder;
  for (double s : o.ladder) {
    const double r = std::min(s, cap);
    if (r <= 0) continue;
    if (ladder.empty() || r > ladder.back()) ladder.push_back(r);
  }
  return ladder;
}

bool int8_allowed(const ChoiceOptions& o, uint64_t step) {
  if (o.int8_available) return true;
  if (!o.fidelity_int8 || o.ladder.empty() || !(sparsity_cap(o, step) < o.ladder.back()))
    return false;
  // Only where the cap leaves no sparse rung that sends less than the 16-bit ring.
  for (double s : ramped_ladder(o, step))
    if ((1.0 - s) * 2.0 * o.world_size < 1.0) return false;
  return true;
}

}  // namespace gradex::sync::cost
