// The C API: argument checks, exception -> status conversion, and the thread-local error message.
// Nothing else lives here; the engine does the work.
#include "gradex/gradex.h"

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
#include "compress/backend/backend.h"
#include "sync/delay/delay_rule.h"
#include "sync/engine/engine.h"
#include "sync/policy/policy_settings.h"

namespace {

using gradex::capi::guarded;
using gradex::capi::load_state_entry;
using gradex::capi::require;
using gradex::capi::save_state_entry;

thread_local std::string g_last_error;

gradex::sync::Engine& engine_of(gradex_engine_t* e) {
  if (e == nullptr || !e->engine) throw gradex::InvalidArgument("engine is NULL");
  return *e->engine;
}

gradex::DType dtype_of(gradex_dtype_t t) {
  if (t != GRADEX_FLOAT32 && t != GRADEX_FLOAT16 && t != GRADEX_BFLOAT16)
    throw gradex::InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(t)));
  return static_cast<gradex::DType>(t);
}

bool is_cuda(gradex_device_t d) {
  if (d != GRADEX_DEVICE_CPU && d != GRADEX_DEVICE_CUDA)
    throw gradex::InvalidArgument("unknown device type " + std::to_string(static_cast<int>(d)));
  return d == GRADEX_DEVICE_CUDA;
}

// The gradex_submit* family: the engine, the key and the handle checked, then `submit(engine)`'s
// handle written.
template <typename Submit>
gradex_status_t submit_entry(const char* function, gradex_engine_t* engine, const char* key,
                             gradex_handle_t* handle, Submit&& submit) {
  return guarded(function, [&] {
    auto& e = engine_of(engine);
    require(key, "key");
    require(handle, "handle");
    *handle = submit(e);
  });
}

void copy_out(const std::string& text, char* buffer, size_t capacity, size_t* length) {
  *length = text.size() + 1;
  if (buffer == nullptr) return;
  if (capacity < text.size() + 1)
    throw gradex::InvalidArgument("buffer of " + std::to_string(capacity) +
                                  " bytes is too small (" + std::to_string(text.size() + 1) +
                                  " needed)");
  std::memcpy(buffer, text.c_str(), text.size() + 1);
}

}  // namespace

gradex::sync::Engine& gradex::capi::engine_of(gradex_engine_t* engine) {
  return ::engine_of(engine);
}

void gradex::capi::set_last_error(const std::string& message) {
  g_last_error = message;
}

extern "C" {

uint32_t gradex_api_version(void) {
  return GRADEX_API_VERSION;
}

const char* gradex_last_error(void) {
  return g_last_error.c_str();
}

void gradex_engine_options_init(gradex_engine_options_t* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  options->api_version = GRADEX_API_VERSION;
  options->rank = -1;
  options->world_size = -1;
}

gradex_status_t gradex_engine_create(const gradex_engine_options_t* options,
                                     gradex_engine_t** engine) {
  gradex_status_t status = gradex::capi::create_entry(
      "gradex_engine_create", options, engine, "engine", "gradex/", &gradex_engine::engine,
      [](const gradex::config::Config& c) {
        gradex::sync::resolve_policy(c);
        gradex::sync::engine_options_from_config(c);
        gradex::sync::delay::check_delay_composes(c);
      },
      [](gradex_engine& handle, const std::shared_ptr<gradex::comm::Store>& store) {
        handle.lane_store = store;
      });
  if (status != GRADEX_OK) return status;
  status = guarded("gradex_engine_create", [&] {
    gradex_engine* h = *engine;
    h->lane_rank = h->engine->rank();
    h->lane_world = h->engine->world_size();
    auto make_lane = [store = h->lane_store, rank = h->lane_rank, world = h->lane_world](
                         int slot, gradex::config::Config config,
                         const gradex::sync::AgreedLink* link) {
      return std::make_unique<gradex::sync::Engine>(
          std::move(config),
          gradex::comm::make_prefix_store(store, "delay-lane" + std::to_string(slot) + "/"), rank,
          world, GRADEX_API_VERSION, link);
    };
    h->delay = std::make_unique<gradex::sync::delay::DelayLine>(*h->engine, make_lane);
  });
  if (status != GRADEX_OK) {
    gradex_engine_destroy(*engine);
    *engine = nullptr;
  }
  return status;
}

gradex_status_t gradex_engine_destroy(gradex_engine_t* engine) {
  return gradex::capi::destroy_entry("gradex_engine_destroy", engine, &gradex_engine::engine);
}

gradex_status_t gradex_engine_rank(const gradex_engine_t* engine, int32_t* rank,
                                   int32_t* world_size) {
  return guarded("gradex_engine_rank", [&] {
    auto& e = engine_of(const_cast<gradex_engine_t*>(engine));
    require(rank, "rank");
    require(world_size, "world_size");
    *rank = e.rank();
    *world_size = e.world_size();
  });
}

gradex_status_t gradex_register_tensor(gradex_engine_t* engine, const char* key, uint64_t numel,
                                       gradex_dtype_t dtype, gradex_device_t device) {
  return guarded("gradex_register_tensor", [&] {
    auto& e = engine_of(engine);
    require(key, "key");
    // The delay line first: it refuses what it cannot delay before the engine holds the tensor.
    gradex::capi::delay_of(engine).on_register(key, numel, dtype_of(dtype), is_cuda(device));
    e.register_tensor(key, numel, dtype_of(dtype), is_cuda(device));
    gradex::capi::delay_of(engine).register_on_lanes(key);
  });
}

gradex_status_t gradex_submit(gradex_engine_t* engine, const char* key, void* data,
                              gradex_handle_t* handle) {
  return submit_entry("gradex_submit", engine, key, handle, [&](gradex::sync::Engine& e) {
    return gradex::capi::delayed(engine) ? engine->delay->submit(key, data, false)
                                         : e.submit(key, data);
  });
}

gradex_status_t gradex_submit_device(gradex_engine_t* engine, const char* key, void* data,
                                     gradex_device_t device, int device_index, void* stream,
                                     gradex_handle_t* handle) {
  return submit_entry("gradex_submit_device", engine, key, handle, [&](gradex::sync::Engine& e) {
    // A CUDA tensor keeps D = 0 (DelayLine::on_register); host memory is delayed as gradex_submit.
    if (!is_cuda(device) && gradex::capi::delayed(engine))
      return engine->delay->submit(key, data, false);
    return e.submit_device(key, data, is_cuda(device), device_index, stream);
  });
}

gradex_status_t gradex_submit_absent(gradex_engine_t* engine, const char* key, void* data,
                                     gradex_handle_t* handle) {
  return submit_entry("gradex_submit_absent", engine, key, handle, [&](gradex::sync::Engine& e) {
    return gradex::capi::delayed(engine) ? engine->delay->submit(key, data, true)
                                         : e.submit_absent(key, data);
  });
}

gradex_status_t gradex_submit_device_absent(gradex_engine_t* engine, const char* key, void* data,
                                            gradex_device_t device, int device_index, void* stream,
                                            gradex_handle_t* handle) {
  return submit_entry(
      "gradex_submit_device_absent", engine, key, handle, [&](gradex::sync::Engine& e) {
        if (!is_cuda(device) && gradex::capi::delayed(engine))
          return engine->delay->submit(key, data, true);
        return e.submit_absent(key, data, true, is_cuda(device), device_index, stream);
      });
}

gradex_status_t gradex_handle_event(gradex_engine_t* engine, gradex_handle_t handle, void* stream) {
  return guarded("gradex_handle_event", [&] {
    auto& e = engine_of(engine);
    if (gradex::sync::delay::DelayLine::owns(handle)) return;  // host memory: nothing to order
    e.handle_event(handle, stream);
  });
}

gradex_status_t gradex_device_available(gradex_device_t device, int device_index, int* available) {
  return guarded("gradex_device_available", [&] {
    require(available, "available");
    if (!is_cuda(device)) {
      *available = 1;
      return;
    }
    try {
      gradex::compress::backend::get_backend(gradex::compress::backend::DeviceType::kCuda,
                                             device_index);
      *available = 1;
    } catch (const gradex::InvalidArgument& e) {
      g_last_error = std::string("gradex_device_available: ") + e.what();
      *available = 0;
    }
  });
}

gradex_status_t gradex_get_staged_bytes(gradex_engine_t* engine, int last_step, uint64_t* bytes) {
  return guarded("gradex_get_staged_bytes", [&] {
    require(bytes, "bytes");
    *bytes = gradex::capi::delay_of(engine).stats(last_step != 0).staged_bytes;
  });
}

gradex_status_t gradex_get_step_report(gradex_engine_t* engine, int last_step,
                                       double* exposed_seconds, uint64_t* policy_switches) {
  return guarded("gradex_get_step_report", [&] {
    require(exposed_seconds, "exposed_seconds");
    require(policy_switches, "policy_switches");
    const gradex::sync::Stats s = gradex::capi::delay_of(engine).stats(last_step != 0);
    *exposed_seconds = s.exposed_seconds;
    *policy_switches = s.policy_switches;
  });
}

gradex_status_t gradex_average(gradex_engine_t* engine, const char* key, void* data,
                               gradex_handle_t* handle) {
  return guarded("gradex_average", [&] {
    auto& e = engine_of(engine);
    require(key, "key");
    require(handle, "handle");
    *handle = e.average(key, data);
  });
}

gradex_status_t gradex_wait(gradex_engine_t* engine, gradex_handle_t handle) {
  return guarded("gradex_wait", [&] {
    auto& e = engine_of(engine);
    if (gradex::sync::delay::DelayLine::owns(handle))
      engine->delay->release(handle);  // complete since its submission
    else
      e.wait(handle);
  });
}

gradex_status_t gradex_test(gradex_engine_t* engine, gradex_handle_t handle, int* done) {
  return guarded("gradex_test", [&] {
    auto& e = engine_of(engine);
    require(done, "done");
    const bool owned = gradex::sync::delay::DelayLine::owns(handle);
    if (owned) engine->delay->release(handle);
    bool finished = owned || e.test(handle);
    *done = finished ? 1 : 0;
  });
}

gradex_status_t gradex_set_gradient_norm(gradex_engine_t* engine, double norm) {
  return guarded("gradex_set_gradient_norm",
                 [&] { gradex::capi::delay_of(engine).set_gradient_norm(norm); });
}

gradex_status_t gradex_set_policy_horizon(gradex_engine_t* engine, uint64_t steps) {
  return guarded("gradex_set_policy_horizon", [&] { engine_of(engine).set_policy_horizon(steps); });
}

gradex_status_t gradex_end_step(gradex_engine_t* engine, int* average_now) {
  return guarded("gradex_end_step", [&] {
    auto& e = engine_of(engine);
    bool average = e.end_step();
    gradex::capi::delay_of(engine).on_end_step();
    if (average_now) *average_now = average ? 1 : 0;
  });
}

gradex_status_t gradex_exchanges_gradients(gradex_engine_t* engine, int* exchanges) {
  return guarded("gradex_exchanges_gradients", [&] {
    auto& e = engine_of(engine);
    require(exchanges, "exchanges");
    *exchanges = e.exchanges_gradients() ? 1 : 0;
  });
}

gradex_status_t gradex_get_stats(gradex_engine_t* engine, int last_step, gradex_stats_t* stats) {
  return guarded("gradex_get_stats", [&] {
    require(stats, "stats");
    gradex::sync::Stats s = gradex::capi::delay_of(engine).stats(last_step != 0);
    gradex_stats_t out = gradex::capi::common_stats(s);
    out.tensors = s.tensors;
    out.sparse_exchanges = s.sparse_exchanges;
    out.dense_fallbacks = s.dense_fallbacks;
    out.saturated = s.saturated;
    out.parameter_averages = s.parameter_averages;
    out.compress_seconds = s.compress_seconds;
    out.decode_seconds = s.decode_seconds;
    out.compression_ratio = s.compression_ratio();
    out.control_bytes = s.control_bytes;
    *stats = out;
  });
}

gradex_status_t gradex_save_state(gradex_engine_t* engine, void* buffer, size_t capacity,
                                  size_t* length) {
  return save_state_entry("gradex_save_state", engine, gradex::capi::delay_of,
                          &gradex::sync::delay::DelayLine::save_state, buffer, capacity, length);
}

gradex_status_t gradex_load_state(gradex_engine_t* engine, const void* buffer, size_t length) {
  return load_state_entry("gradex_load_state", engine, gradex::capi::delay_of,
                          &gradex::sync::delay::DelayLine::load_state, buffer, length);
}

gradex_status_t gradex_register_tensor_rows(gradex_engine_t* engine, const char* key,
                                            uint64_t numel, gradex_dtype_t dtype,
                                            gradex_device_t device, uint64_t rows) {
  return guarded("gradex_register_tensor_rows", [&] {
    auto& e = engine_of(engine);
    require(key, "key");
    // The delay line first: it refuses what it cannot delay before the engine holds the tensor.
    gradex::capi::delay_of(engine).on_register(key, numel, dtype_of(dtype), is_cuda(device), rows);
    e.register_tensor(key, numel, dtype_of(dtype), is_cuda(device), rows);
    gradex::capi::delay_of(engine).register_on_lanes(key);
  });
}

gradex_status_t gradex_explain(gradex_engine_t* engine, char* buffer, size_t capacity,
                               size_t* length) {
  return guarded("gradex_explain", [&] {
    require(length, "length");
    auto& e = engine_of(engine);
    copy_out(e.explain() + "\n" + gradex::capi::delay_of(engine).explain(), buffer, capacity,
             length);
  });
}

gradex_status_t gradex_describe_config(gradex_engine_t* engine, char* buffer, size_t capacity,
                                       size_t* length) {
  return guarded("gradex_describe_config", [&] {
    require(length, "length");
    std::string text = engine ? engine_of(engine).config().describe()
                              : gradex::config::Config::from_environment().describe();
    copy_out(text, buffer, capacity, length);
  });
}

}  // extern "C"
