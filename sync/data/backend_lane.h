// One backend's queue for one pipeline stage inside the engine (BackendPath::Stage): the device
// operations of that stage on that backend go onto its stream, in order; a tensor's work passes
// between stages through its ready event, and its completion event orders it against the
// framework's stream. Also the backend-memory buffers the lane reuses across units (fusion
// buckets, a NaN source), grown only, never freed while work on them may be queued; a lane's
// buffers are used only by its own stage's thread (the progress thread's lane for the transfer).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "compress/backend/backend.h"
#include "sync/data/backend_path.h"

namespace gradex::sync {

struct BackendPath::Lane {
  explicit Lane(compress::backend::Backend& b)
      : backend(b), stream(b.create_stream()), sync(b.create_event()) {}
  compress::backend::Backend& backend;
  compress::backend::StreamPtr stream;
  compress::backend::EventPtr sync;
  compress::backend::BufferPtr f32, half, nan;

  // Waits for this lane's own work (never for the whole device).
  void synchronize() {
    sync->record(*stream);
    sync->synchronize();
  }
  float* f32_buffer(size_t n) { return grow(f32, n * 4, false)->as<float>(); }
  uint16_t* half_buffer(size_t n) { return grow(half, n * 2, false)->as<uint16_t>(); }
  // n quiet NaNs (fp32) in host staging memory, the source of GRADEX_NONFINITE=propagate's fill.
  const float* nans(size_t n) {
    const bool grew = !nan || nan->bytes() < n * 4;
    float* p = grow(nan, n * 4, true)->as<float>();
    if (grew)
      for (size_t i = 0; i < n; ++i)
        p[i] = std::numeric_limits<float>::quiet_NaN();
    return p;
  }

 private:
  compress::backend::BufferPtr& grow(compress::backend::BufferPtr& buf, size_t bytes,
                                     bool staging) {
    if (!buf || buf->bytes() < bytes) {
      if (buf) synchronize();  // queued work may still read the old buffer
      buf.reset();
      buf = staging ? backend.allocate_staging(bytes) : backend.allocate(bytes);
    }
    return buf;
  }
};

}  // namespace gradex::sync
