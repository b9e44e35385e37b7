// Verifies an exchanged gradient against the exact average computed locally: every rank's
// gradients are deterministic (gradient_gen.h), so any rank can regenerate its peers' tensors and
// average them in double precision. Only a few tensors are checked per call (the first, the middle,
// the last and the largest) to keep the check cheap next to a step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bench/gradient_gen.h"

namespace gradex::bench {

// Per element, an exchanged gradient may differ from the exact fp32 average by at most
// relative * mean_over_ranks(|g_r|) + absolute.
struct Tolerance {
  double relative = 0;
  double absolute = 0;
};

class AverageChecker {
 public:
  AverageChecker(const ModelProfile& model, int world_size, GradientOptions options);

  // Compares the checked tensors of `result` (the flat buffer after the exchange of `step`) with
  // the exact average. Throws InternalError naming the mode, step, tensor, element, both values and
  // the tolerance at the first element outside it. Returns the largest |got - want| seen, in units
  // of the per-element tolerance (<= 1 means inside; a figure for the report).
  double check(const std::string& mode, int64_t step, const float* result,
               const Tolerance& tolerance) const;

  // Indices of the tensors check() looks at.
  const std::vector<size_t>& checked_tensors() const { return checked_; }

 private:
  std::vector<std::unique_ptr<GradientGenerator>> ranks_;
  std::vector<size_t> checked_;
};

}  // namespace gradex::bench
