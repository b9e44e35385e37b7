// Engine::explain: each tensor's codec and why (gradex_explain, gradex-bench plan).
#include <cstdio>

#include "sync/engine/engine.h"

namespace gradex::sync {

void Engine::set_policy_horizon(uint64_t steps) {
  policy_->set_horizon(steps);
}

std::string Engine::explain() const {
  std::string out = policy_->explain();
  std::lock_guard<std::mutex> lock(mutex_);
  char line[512];
  for (const auto& [key, t] : table_.tensors) {
    const Rung& r = t.policy.rung;
    std::string codec = codec_name(r.codec);
    if (is_sparse(r.codec)) codec += " " + std::to_string(r.sparsity * 100.0).substr(0, 6) + "%";
    std::snprintf(line, sizeof line, "  %-32s %12llu %-12s %s\n", key.c_str(),
                  static_cast<unsigned long long>(t.numel), codec.c_str(), t.policy.reason.c_str());
    out += line;
  }
  return out;
}

}  // namespace gradex::sync
