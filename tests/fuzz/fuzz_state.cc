// libFuzzer target for the saved-state loader, through the C API (gradex_load_state) of a
// one-rank engine that has a dense tensor, a DGC tensor and a 16-bit tensor registered. Any input
// must either load or be refused with a status (GRADEX_ERROR_STATE / CORRUPT); a crash, a sanitizer
// report or an escaping exception is a bug. After a refused load the engine must still save a
// state that loads again (it stays usable).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gradex/gradex.h"

namespace {

gradex_engine_t* engine = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // UCX's memory hooks and ASan both want malloc: leave it to ASan.
  setenv("UCX_MEM_MALLOC_HOOKS", "no", 1);
  setenv("UCX_MEM_EVENTS", "no", 1);
  gradex_engine_options_t o;
  gradex_engine_options_init(&o);
  o.rank = 0;
  o.world_size = 1;
  const char* names[] = {"GRADEX_LOG_LEVEL", "GRADEX_DENSE_THRESHOLD"};
  const char* values[] = {"error", "1000"};
  o.config_count = 2;
  o.config_names = names;
  o.config_values = values;
  if (gradex_engine_create(&o, &engine) != GRADEX_OK ||
      gradex_register_tensor(engine, "dense", 100, GRADEX_FLOAT32, GRADEX_DEVICE_CPU) !=
          GRADEX_OK ||
      gradex_register_tensor(engine, "sparse", 1200, GRADEX_FLOAT32, GRADEX_DEVICE_CPU) !=
          GRADEX_OK ||
      gradex_register_tensor(engine, "half", 300, GRADEX_FLOAT16, GRADEX_DEVICE_CPU) != GRADEX_OK)
    std::abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (gradex_load_state(engine, data, size) == GRADEX_OK) return 0;
  size_t length = 0;
  static std::vector<uint8_t> saved(1 << 20);
  if (gradex_save_state(engine, saved.data(), saved.size(), &length) != GRADEX_OK) std::abort();
  if (gradex_load_state(engine, saved.data(), length) != GRADEX_OK) std::abort();
  return 0;
}
