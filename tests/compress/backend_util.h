// Helpers of the backend tests: the backends this build can run (the CPU reference first), and
// moving test data in and out of backend memory through the backend's own copies, so that the same
// test code runs over host and device backends.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "compress/backend/backend.h"

namespace gradex::compress::test {

// cpu and thrust-omp always (this test target is built only with the Thrust-on-OpenMP backend);
// cuda as well when a CUDA device and libgradex_backend_cuda.so are present.
inline std::vector<backend::DeviceType> test_backends() {
  std::vector<backend::DeviceType> out = {backend::DeviceType::kCpu,
                                          backend::DeviceType::kThrustOmp};
  if (backend::backend_available(backend::DeviceType::kCuda))
    out.push_back(backend::DeviceType::kCuda);
  return out;
}

inline std::string backend_param_name(const ::testing::TestParamInfo<backend::DeviceType>& info) {
  std::string s = backend::device_type_name(info.param);
  for (char& c : s)
    if (c == '-') c = '_';
  return s;
}

// Backend memory holding a copy of host data, and back.
struct Device {
  backend::Backend& b;
  backend::StreamPtr stream = b.create_stream();

  template <typename T>
  backend::BufferPtr upload(const std::vector<T>& host) {
    backend::BufferPtr buf = b.allocate(host.size() * sizeof(T));
    b.copy(buf->data(), host.data(), host.size() * sizeof(T), *stream);
    sync();
    return buf;
  }
  template <typename T>
  std::vector<T> download(const T* dev, size_t n) {
    std::vector<T> host(n);
    b.copy(host.data(), dev, n * sizeof(T), *stream);
    sync();
    return host;
  }
  void sync() {
    backend::EventPtr e = b.create_event();
    e->record(*stream);
    e->synchronize();
  }
};

inline bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace gradex::compress::test
