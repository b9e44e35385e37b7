// The C API of DiLoCo's outer optimization (gradex_outer_*): argument checks and exception ->
// status conversion around outer/OuterOptimizer.
#include <cstring>
#include <memory>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "capi/callback_store.h"
#include "capi/engine_access.h"
#include "capi/guarded.h"
#include "capi/options_config.h"
#include "comm/rendezvous/launch.h"
#include "gradex/gradex.h"
#include "outer/outer.h"
#include "sync/delay/delay_rule.h"

struct gradex_outer {
  std::unique_ptr<gradex::outer::OuterOptimizer> outer;
  // As gradex_engine's: the store a reconfiguration may reuse, the current membership's prefix.
  std::shared_ptr<gradex::comm::Store> store;
  std::string prefix;
};

namespace {

using gradex::capi::guarded;
using gradex::capi::load_state_entry;
using gradex::capi::require;
using gradex::capi::save_state_entry;
using gradex::outer::OuterOptimizer;

OuterOptimizer& outer_of(gradex_outer_t* o) {
  if (o == nullptr || !o->outer) throw gradex::InvalidArgument("outer is NULL");
  return *o->outer;
}

constexpr const char* kDefaultPrefix = "gradex/outer/";

}  // namespace

extern "C" {

gradex_status_t gradex_outer_create(const gradex_engine_options_t* options,
                                    gradex_outer_t** outer) {
  return gradex::capi::create_entry(
      "gradex_outer_create", options, outer, "outer", kDefaultPrefix, &gradex_outer::outer,
      [](const gradex::config::Config& c) { gradex::sync::delay::refuse_under_outer(c); });
}

gradex_status_t gradex_outer_reconfigure(gradex_outer_t* outer,
                                         const gradex_engine_options_t* options) {
  return guarded("gradex_outer_reconfigure", [&] {
    auto& o = outer_of(outer);
    require(options, "options");
    std::shared_ptr<gradex::comm::Store> store;
    std::string prefix;
    gradex::capi::membership_of(*options, o.config(), outer->store, outer->prefix, kDefaultPrefix,
                                &store, &prefix);
    outer->store = store;
    outer->prefix = prefix;
    o.reconfigure(gradex::comm::make_prefix_store(store, prefix), options->rank,
                  options->world_size);
  });
}

gradex_status_t gradex_outer_destroy(gradex_outer_t* outer) {
  return gradex::capi::destroy_entry("gradex_outer_destroy", outer, &gradex_outer::outer);
}

gradex_status_t gradex_outer_add_tensor(gradex_outer_t* outer, const char* key, float* data,
                                        uint64_t numel, int is_buffer) {
  return guarded("gradex_outer_add_tensor", [&] {
    require(key, "key");
    outer_of(outer).add_tensor(key, data, numel, is_buffer != 0);
  });
}

gradex_status_t gradex_outer_start(gradex_outer_t* outer) {
  return guarded("gradex_outer_start", [&] { outer_of(outer).start(); });
}

gradex_status_t gradex_outer_start_local(gradex_outer_t* outer, uint64_t step) {
  return guarded("gradex_outer_start_local", [&] { outer_of(outer).start_local(step); });
}

gradex_status_t gradex_outer_step_count(gradex_outer_t* outer, uint64_t* step) {
  return guarded("gradex_outer_step_count", [&] {
    auto& o = outer_of(outer);
    require(step, "step");
    *step = o.step_count();
  });
}

gradex_status_t gradex_outer_step(gradex_outer_t* outer, int* merged) {
  return guarded("gradex_outer_step", [&] {
    int n = outer_of(outer).step();
    if (merged) *merged = n;
  });
}

gradex_status_t gradex_outer_synchronize(gradex_outer_t* outer) {
  return guarded("gradex_outer_synchronize", [&] { outer_of(outer).synchronize(); });
}

gradex_status_t gradex_outer_synchronize_all(gradex_outer_t* outer, int* exchanged) {
  return guarded("gradex_outer_synchronize_all", [&] {
    int n = outer_of(outer).synchronize_all();
    if (exchanged) *exchanged = n;
  });
}

gradex_status_t gradex_outer_get_stats(gradex_outer_t* outer, int last_step,
                                       gradex_stats_t* stats) {
  return guarded("gradex_outer_get_stats", [&] {
    auto& o = outer_of(outer);
    require(stats, "stats");
    if (last_step != 0)
      throw gradex::InvalidArgument("per-step statistics are not kept for DiLoCo (last_step=0)");
    auto s = o.stats();
    gradex_stats_t out = gradex::capi::common_stats(s);
    out.parameter_averages = s.syncs;
    out.decode_seconds = s.wait_seconds;
    out.compression_ratio =
        s.bytes_sent ? static_cast<double>(s.dense_bytes) / static_cast<double>(s.bytes_sent) : 0;
    *stats = out;
  });
}

gradex_status_t gradex_outer_global(gradex_outer_t* outer, const char* key, float* out,
                                    uint64_t numel) {
  return guarded("gradex_outer_global", [&] {
    auto& o = outer_of(outer);
    require(key, "key");
    require(out, "out");
    auto g = o.global_of(key);
    if (g.size() != numel)
      throw gradex::InvalidArgument(std::string("tensor '") + key + "' has " +
                                    std::to_string(g.size()) + " elements, not " +
                                    std::to_string(numel));
    std::memcpy(out, g.data(), 4 * g.size());
  });
}

gradex_status_t gradex_outer_last_merges(gradex_outer_t* outer, uint64_t* steps, size_t capacity,
                                         size_t* count) {
  return guarded("gradex_outer_last_merges", [&] {
    auto& o = outer_of(outer);
    require(count, "count");
    auto m = o.last_merge_steps();
    if (steps != nullptr) {
      if (capacity < m.size())
        throw gradex::InvalidArgument("capacity " + std::to_string(capacity) + " < " +
                                      std::to_string(m.size()) + " fragments");
      std::memcpy(steps, m.data(), 8 * m.size());
    }
    *count = m.size();
  });
}

gradex_status_t gradex_outer_fragment_of(gradex_outer_t* outer, const char* key,
                                         int64_t* fragment) {
  return guarded("gradex_outer_fragment_of", [&] {
    auto& o = outer_of(outer);
    require(key, "key");
    require(fragment, "fragment");
    *fragment = o.fragment_of(key);
  });
}

gradex_status_t gradex_outer_save_state(gradex_outer_t* outer, void* buffer, size_t capacity,
                                        size_t* length) {
  return save_state_entry("gradex_outer_save_state", outer, outer_of, &OuterOptimizer::save_state,
                          buffer, capacity, length);
}

gradex_status_t gradex_outer_load_state(gradex_outer_t* outer, const void* buffer, size_t length) {
  return load_state_entry("gradex_outer_load_state", outer, outer_of, &OuterOptimizer::load_state,
                          buffer, length);
}

gradex_status_t gradex_outer_save_shared_state(gradex_outer_t* outer, void* buffer, size_t capacity,
                                               size_t* length) {
  return save_state_entry("gradex_outer_save_shared_state", outer, outer_of,
                          &OuterOptimizer::save_shared_state, buffer, capacity, length);
}

gradex_status_t gradex_outer_load_shared_state(gradex_outer_t* outer, const void* buffer,
                                               size_t length) {
  return load_state_entry("gradex_outer_load_shared_state", outer, outer_of,
                          &OuterOptimizer::load_shared_state, buffer, length);
}

}  // extern "C"
