// get_backend(): one backend per (device type, index), created on first use. The CUDA backend is a
// shared library of its own (libgradex_backend_cuda.so, linked against the CUDA runtime) that is
// dlopen'ed only here, so that CPU-only installs never load a CUDA runtime.
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "compress/backend/backend.h"
#include "compress/backend/cpu_backend.h"
#if defined(GRADEX_HAVE_THRUST_OMP)
#include "compress/thrust/omp_backend.h"
#endif

namespace gradex::compress::backend {
namespace {

constexpr const char* kCudaLibrary = "libgradex_backend_cuda.so";

// Candidate paths of the CUDA library: beside the module that holds this code (libgradex.so or
// a test executable), in ../lib from it (build trees put executables in bin/, libraries in lib/),
// then the bare name (rpath, LD_LIBRARY_PATH, the system's search path).
std::vector<std::string> cuda_library_candidates() {
  std::vector<std::string> out;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuda_library_candidates), &info) && info.dli_fname) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) {
      const std::string dir = self.substr(0, slash);
      out.push_back(dir + "/" + kCudaLibrary);
      out.push_back(dir + "/../lib/" + kCudaLibrary);
    }
  }
  out.push_back(kCudaLibrary);
  return out;
}

using AbiFn = int (*)();
using CreateFn = Backend* (*)(int, char*, size_t);

// The library stays loaded for the life of the process (backends created from it live in a
// static map and their code must outlive them).
void* open_cuda_library() {
  static std::mutex mu;
  static void* handle = nullptr;
  static std::string failure;
  std::lock_guard<std::mutex> lock(mu);
  if (handle) return handle;
  if (!failure.empty()) throw InvalidArgument(failure);
  std::string tried;
  for (const std::string& path : cuda_library_candidates()) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) break;
    const char* why = dlerror();
    tried += "\n  " + path + ": " + (why ? why : "unknown error");
  }
  if (!handle) {
    failure = std::string("CUDA backend unavailable: ") + kCudaLibrary +
              " could not be loaded (this gradex was built without CUDA, or the CUDA runtime is "
              "not installed); tried:" +
              tried;
    throw InvalidArgument(failure);
  }
  auto abi = reinterpret_cast<AbiFn>(dlsym(handle, "gradex_backend_cuda_abi"));
  if (!abi || abi() != kCudaBackendAbi) {
    failure = std::string("CUDA backend unavailable: ") + kCudaLibrary + " has backend ABI " +
              (abi ? std::to_string(abi()) : std::string("(none)")) + ", this gradex needs " +
              std::to_string(kCudaBackendAbi) + " (mixed installs?)";
    handle = nullptr;
    throw InvalidArgument(failure);
  }
  return handle;
}

BackendPtr create(DeviceType type, int index) {
  switch (type) {
    case DeviceType::kCpu:
      return make_cpu_backend();
    case DeviceType::kThrustOmp:
#if defined(GRADEX_HAVE_THRUST_OMP)
      return make_thrust_omp_backend();
#else
      throw InvalidArgument(
          "thrust-omp backend unavailable: this gradex was built without the Thrust headers or "
          "OpenMP");
#endif
    case DeviceType::kCuda: {
      auto make =
          reinterpret_cast<CreateFn>(dlsym(open_cuda_library(), "gradex_backend_cuda_create"));
      if (!make) throw InvalidArgument("CUDA backend library lacks gradex_backend_cuda_create");
      char err[512] = {0};
      Backend* b = make(index, err, sizeof(err));
      if (!b)
        throw InvalidArgument(std::string("CUDA backend for device ") + std::to_string(index) +
                              " unavailable: " + err);
      return BackendPtr(b);
    }
  }
  throw InvalidArgument("get_backend: unknown device type " +
                        std::to_string(static_cast<int>(type)));
}

}  // namespace

BackendPtr get_backend(DeviceType type, int device_index) {
  if (device_index < 0)
    throw InvalidArgument("get_backend: device index " + std::to_string(device_index) +
                          " is negative");
  if (type != DeviceType::kCuda && device_index != 0)
    throw InvalidArgument(std::string("get_backend: the ") + device_type_name(type) +
                          " backend has only device 0, asked for " + std::to_string(device_index));
  static std::mutex mu;
  static std::map<std::pair<int, int>, BackendPtr> backends;
  std::lock_guard<std::mutex> lock(mu);
  BackendPtr& slot = backends[{static_cast<int>(type), device_index}];
  if (!slot) slot = create(type, device_index);
  return slot;
}

bool backend_available(DeviceType type) {
  try {
    return get_backend(type, 0) != nullptr;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace gradex::compress::backend
