#include "sync/policy/policy_source.h"

namespace gradex::sync {

std::unique_ptr<PolicySource> PolicySource::create(const config::Config& config,
                                                   const EngineOptions& options, int world_size) {
  std::unique_ptr<CodecPlanner> planner = CodecPlanner::create(config, options, world_size);
  if (!planner) return std::make_unique<FixedPolicySource>(options);
  return std::make_unique<AutoPolicySource>(options, std::move(planner));
}

AppliedPolicy FixedPolicySource::on_register(const std::string& key, uint64_t numel, uint64_t,
                                             bool) {
  return choose_policy(options_, key, numel);
}

std::string FixedPolicySource::explain() const {
  return "GRADEX_POLICY=fixed: GRADEX_SPARSITY_OVERRIDES, dense below GRADEX_DENSE_THRESHOLD, "
         "else DGC at GRADEX_SPARSITY\n";
}

AppliedPolicy AutoPolicySource::on_register(const std::string& key, uint64_t numel, uint64_t rows,
                                            bool cuda) {
  AppliedPolicy p;
  if (cuda) {
    p = choose_policy(options_, key, numel);
    p.reason += " (a CUDA tensor: GRADEX_POLICY=auto keeps it fixed)";
  } else {
    p = planner_->initial_policy(key);
  }
  planner_->on_register(key, numel, rows);
  return p;
}

std::string AutoPolicySource::explain() const {
  return planner_->explain() + "current policies:\n";
}

}  // namespace gradex::sync
