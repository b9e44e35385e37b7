#include "sync/delay/delay_arithmetic.h"

#include <cstring>

#include "base/half.h"

namespace gradex::sync::delay {

namespace {

float load(const uint8_t* p, DType t, uint64_t i) {
  if (t == DType::kFloat32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return t == DType::kFloat16 ? half_to_float(h) : bf16_to_float(h);
}

void store(uint8_t* p, DType t, uint64_t i, float v) {
  if (t == DType::kFloat32) {
    std::memcpy(p + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t == DType::kFloat16 ? float_to_half(v) : float_to_bf16(v);
  std::memcpy(p + 2 * i, &h, 2);
}

template <bool kMomentum, bool kNesterov, bool kCarry>
void make_x_and_correct_loop(float* data, float* local, float* exchanged, uint64_t n, float* u,
                             float m, const float* carry, const float* avg, const float* old) {
  for (uint64_t i = 0; i < n; ++i) {
    const float g = data[i];
    float x = g;
    if (kMomentum) {
      u[i] = m * u[i] + g;
      x = kNesterov ? g + m * u[i] : u[i];
    }
    if (kCarry) x += carry[i];
    local[i] = x;
    exchanged[i] = x;
    data[i] = x + (avg[i] - old[i]);
  }
}

}  // namespace

void correct(uint8_t* out, const uint8_t* avg, const uint8_t* old, DType t, uint64_t n,
             bool stale) {
  if (stale) {
    std::memcpy(out, avg, n * dtype_size(t));
    return;
  }
  if (t == DType::kFloat32) {
    float* o = reinterpret_cast<float*>(out);
    const float* a = reinterpret_cast<const float*>(avg);
    const float* g = reinterpret_cast<const float*>(old);
    for (uint64_t i = 0; i < n; ++i)
      o[i] = o[i] + (a[i] - g[i]);
    return;
  }
  for (uint64_t i = 0; i < n; ++i)
    store(out, t, i, load(out, t, i) + (load(avg, t, i) - load(old, t, i)));
}

void make_x(const uint8_t* g, uint8_t* x, DType t, uint64_t n, float* u, float m, bool nesterov,
            const float* carry) {
  if (t == DType::kFloat32) {
    const float* gf = reinterpret_cast<const float*>(g);
    float* xf = reinterpret_cast<float*>(x);
    if (u == nullptr) {
      if (carry == nullptr) {
        std::memcpy(xf, gf, n * sizeof(float));
      } else {
        for (uint64_t i = 0; i < n; ++i)
          xf[i] = gf[i] + carry[i];
      }
    } else if (!nesterov) {
      for (uint64_t i = 0; i < n; ++i) {
        u[i] = m * u[i] + gf[i];
        xf[i] = u[i];
      }
    } else {
      for (uint64_t i = 0; i < n; ++i) {
        u[i] = m * u[i] + gf[i];
        xf[i] = gf[i] + m * u[i];
      }
    }
    if (u != nullptr && carry != nullptr) {
      for (uint64_t i = 0; i < n; ++i)
        xf[i] += carry[i];
    }
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    const float gi = load(g, t, i);
    float xi = gi;
    if (u != nullptr) {
      u[i] = m * u[i] + gi;
      xi = nesterov ? gi + m * u[i] : u[i];
    }
    if (carry != nullptr) xi += carry[i];
    store(x, t, i, xi);
  }
}

void make_x_and_correct(float* data, float* local, float* exchanged, uint64_t n, float* u, float m,
                        bool nesterov, const float* carry, const float* avg, const float* old) {
  const bool c = carry != nullptr;
  if (u == nullptr) {
    (c ? make_x_and_correct_loop<false, false, true>
       : make_x_and_correct_loop<false, false, false>)(data, local, exchanged, n, u, m, carry, avg,
                                                       old);
  } else if (!nesterov) {
    (c ? make_x_and_correct_loop<true, false, true>
       : make_x_and_correct_loop<true, false, false>)(data, local, exchanged, n, u, m, carry, avg,
                                                      old);
  } else {
    (c ? make_x_and_correct_loop<true, true, true>
       : make_x_and_correct_loop<true, true, false>)(data, local, exchanged, n, u, m, carry, avg,
                                                     old);
  }
}

}  // namespace gradex::sync::delay
