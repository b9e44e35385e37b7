#include "sync/engine/stats_report.h"

#include <cstdio>

#include "base/log.h"

namespace gradex::sync {
namespace {

std::string tensor_name(const std::string& key) {
  return key.empty() ? std::string("a tensor of a fused bucket") : "tensor '" + key + "'";
}

}  // namespace

std::string StatsReporter::window_line(const Stats& w, uint64_t first_step, uint64_t last_step) {
  const double exchange_ms =
      (w.compress_seconds + w.communicate_seconds + w.decode_seconds) * 1000.0;
  const uint64_t steps = w.steps == 0 ? 1 : w.steps;
  char line[320];
  std::snprintf(
      line, sizeof(line),
      "stats steps %llu-%llu: compression %.1fx, %.2f MB sent (%.3f MB/step), exchange "
      "%.1f ms/step, saturated %llu, non-finite %llu",
      static_cast<unsigned long long>(first_step), static_cast<unsigned long long>(last_step),
      w.compression_ratio(), static_cast<double>(w.bytes_sent) / 1e6,
      static_cast<double>(w.bytes_sent) / 1e6 / static_cast<double>(steps),
      exchange_ms / static_cast<double>(steps), static_cast<unsigned long long>(w.saturated),
      static_cast<unsigned long long>(w.nonfinite));
  return line;
}

void StatsReporter::after_step(const config::Config& config, int rank, const Stats& total) {
  if (!warned_saturated_ && total.saturated > 0) {
    warned_saturated_ = true;
    GX_LOG(kWarn) << "values of " << tensor_name(total.first_saturated_tensor)
                  << " were clamped to the 16-bit wire type's range (" << total.saturated
                  << " so far; shown once). With a loss scaler pass it to gradex (scaler=) so that "
                     "gradients are unscaled before the cast; else consider GRADEX_HALF_TYPE=bf16 "
                     "or GRADEX_FP16=0.";
  }
  if (!warned_nonfinite_ && total.nonfinite > 0) {
    warned_nonfinite_ = true;
    GX_LOG(kWarn) << tensor_name(total.first_nonfinite_tensor)
                  << " held NaN/Inf values in a submitted gradient (" << total.nonfinite
                  << " so far; shown once; GRADEX_NONFINITE says what gradex does with them).";
  }
  const int64_t every = config.get_int("GRADEX_STATS_EVERY");
  if (every <= 0 || total.steps % static_cast<uint64_t>(every) != 0) return;
  const Stats window = total.minus(at_last_report_);
  const uint64_t first_step = at_last_report_.steps + 1;
  at_last_report_ = total;
  // Rank 0 speaks for the job; at info level whatever GRADEX_LOG_LEVEL says, since it was asked
  // for.
  if (rank == 0) log::write(log::Level::kInfo, window_line(window, first_step, total.steps));
}

}  // namespace gradex::sync
