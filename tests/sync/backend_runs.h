// Running one training scenario under several GRADEX_BACKEND values and comparing what the ranks
// saw: each rank appends its results to files in a scratch directory (one per backend, kind and
// rank), and the test compares the files bit for bit after the ranks exited.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "compress/backend/backend.h"
#include "process_ranks.h"

namespace gradex::test {

// The backends this build can run host tensors on (GRADEX_BACKEND values), cpu first.
inline std::vector<std::string> engine_backends() {
  std::vector<std::string> out = {"cpu"};
  if (compress::backend::backend_available(compress::backend::DeviceType::kThrustOmp))
    out.push_back("thrust-omp");
  return out;
}

inline void append_bytes(const std::string& file, const void* data, size_t bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::app);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}
inline void append_floats(const std::string& file, const std::vector<float>& v) {
  append_bytes(file, v.data(), v.size() * sizeof(float));
}
inline std::vector<uint8_t> read_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
inline std::vector<float> read_floats(const std::string& file) {
  std::vector<uint8_t> b = read_bytes(file);
  std::vector<float> v(b.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

// Index of the first element where a and b differ bitwise (NaNs with the same bits are equal);
// -1 when identical, the shorter size when the sizes differ.
inline int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

}  // namespace gradex::test
