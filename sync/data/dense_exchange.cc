// The dense unit's stage work (BackendPath::stage_dense, unstage_dense): the dense route's unit is
// one fusion bucket (route::pack, sync/route/select.cc), each run of consecutive tensors on one
// backend gathered and cast to the wire type in backend memory, only the wire bucket copied to
// host staging memory for the route's allreduce (sync/route/dense_bucket.cc; nothing is copied on
// host backends), then copied back, widened and scattered.
// Parameter averages of the same unit (host memory, any dtype) run on the CPU backend through an
// fp32 copy, so a unit is laid out the same whatever any rank keeps on a device. (A DGC unit's
// payloads are host bytes: BackendPath::prepare and finish, framed by the engine's stages.)
#include <algorithm>
#include <chrono>
#include <cstring>

#include "base/check.h"
#include "base/error.h"
#include "base/wall_time.h"
#include "sync/data/backend_lane.h"
#include "sync/data/backend_path.h"
#include "sync/data/backend_tensor.h"
#include "sync/engine/engine_internal.h"

namespace gradex::sync {
namespace {

namespace be = compress::backend;
using Clock = std::chrono::steady_clock;

// Calls fn(backend, values, bucket position, run_begin, run_end) for each run [run_begin, run_end)
// of consecutive views on one backend, with `entries` holding that run's fusion entries; the runs
// lie back to back in the bucket at `stage` (`elem` bytes a value). Staging and unstaging walk the
// same runs.
template <typename Fn>
void for_each_backend_run(const std::vector<DenseView>& views, size_t begin, size_t end,
                          uint8_t* stage, size_t elem, std::vector<be::FusionEntry>& entries,
                          Fn&& fn) {
  size_t run_begin = begin, offset = 0;
  while (run_begin < end) {
    size_t run_end = run_begin, n = 0;
    entries.clear();
    while (run_end < end && views[run_end].backend == views[run_begin].backend) {
      entries.push_back({views[run_end].data, views[run_end].numel, n});
      n += views[run_end].numel;
      ++run_end;
    }
    fn(*views[run_begin].backend, n, stage + offset * elem, run_begin, run_end);
    offset += n;
    run_begin = run_end;
  }
}

}  // namespace

DenseBucket BackendPath::stage_dense(std::vector<DenseItem>& items,
                                     const std::vector<TensorState*>& tensor, int world,
                                     const DenseExchangeOptions& options, DenseCounters& counters) {
  GX_CHECK_EQ(tensor.size(), items.size());
  DenseBucket bucket;
  bucket.world = world;
  const DType wire = options.half_on_wire ? options.half_type : DType::kFloat32;
  const size_t elem = dtype_size(wire);
  // 16-bit: divide before the cast so the ring's partial sums stay in range.
  const float scale = wire == DType::kFloat32 ? 1.0f : 1.0f / static_cast<float>(world);
  be::Backend& cpu = *be::get_backend(be::DeviceType::kCpu);

  // fp32 views; 16-bit parameter averages go through host_scratch_ (sized once, before any pointer
  // into it is taken).
  size_t scratch = 0;
  for (size_t i = 0; i < items.size(); ++i)
    if (!tensor[i] && items[i].dtype != DType::kFloat32) scratch += items[i].numel;
  if (host_scratch_.size() < scratch) host_scratch_.resize(scratch);
  std::vector<DenseView>& views = bucket.views;
  views.assign(items.size(), DenseView{});
  be::Backend* pinned_from = nullptr;
  size_t at = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (TensorState* t = tensor[i]) {
      views[i] = {t->backend->backend.get(), static_cast<float*>(items[i].data), items[i].numel};
      if (!views[i].backend->host_accessible()) pinned_from = views[i].backend;
      wait_ready(*t, lane(*views[i].backend));  // the prepare stage's work on it
    } else if (items[i].dtype == DType::kFloat32) {
      views[i] = {&cpu, static_cast<float*>(items[i].data), items[i].numel};
    } else {
      float* f = host_scratch_.data() + at;
      at += items[i].numel;
      detail::to_float(items[i].data, items[i].dtype, items[i].numel, f);
      views[i] = {&cpu, f, items[i].numel};
    }
  }

  std::vector<be::FusionEntry> entries;
  {
    // The whole unit, one bucket.
    const size_t begin = 0, end = items.size();
    size_t bytes = 0;
    for (const DenseItem& item : items)
      bytes += item.numel * elem;
    // Host memory the ring reads and writes: pinned when a device backend copies into it.
    if (!staging_ || staging_->bytes() < bytes || (pinned_from && !staging_pinned_)) {
      staging_.reset();
      staging_ = (pinned_from ? pinned_from : &cpu)->allocate_staging(std::max<size_t>(bytes, 1));
      staging_pinned_ = pinned_from != nullptr;
    }
    auto* stage = staging_->as<uint8_t>();

    // Runs of consecutive items on one backend: [run_begin, run_end).
    auto for_each_run = [&](auto&& fn) {
      for_each_backend_run(views, begin, end, stage, elem, entries, fn);
    };

    // On a host backend a 16-bit wire is cast from each tensor straight into the bucket and back
    // (no gathered fp32 copy; the same casts, so the same bits). GRADEX_NONFINITE=zero gathers
    // first: the zeros are written into the copy, never into the caller's values.
    const bool cast_in_place =
        wire != DType::kFloat32 && options.nonfinite != NonFinitePolicy::kZero;
    auto t0 = Clock::now();
    for_each_run([&](be::Backend& b, size_t n, uint8_t* dst, size_t run_begin, size_t run_end) {
      if (n == 0) return;
      Lane& l = lane(b);
      // Names the first tensor whose cast saturated (for the one-time warning,
      // sync/engine/stats_report.h).
      auto note_saturated = [&](const be::CastCounts& c, size_t item) {
        if (c.saturated > 0 && counters.first_saturated == nullptr)
          counters.first_saturated = items[item].key;
      };
      const bool direct = b.host_accessible();
      if (direct && cast_in_place) {
        for (size_t k = 0; k < entries.size(); ++k) {
          const be::FusionEntry& e = entries[k];
          if (e.numel == 0) continue;
          be::CastCounts c = b.to_half(e.data, reinterpret_cast<uint16_t*>(dst) + e.offset, e.numel,
                                       wire, scale, *l.stream);
          note_saturated(c, run_begin + k);
          counters.saturated += c.saturated;
          counters.nonfinite += c.nonfinite;
        }
        return;
      }
      float* f32 =
          direct && wire == DType::kFloat32 ? reinterpret_cast<float*>(dst) : l.f32_buffer(n);
      b.gather(entries.data(), entries.size(), f32, *l.stream);
      if (options.nonfinite == NonFinitePolicy::kZero) b.zero_nonfinite(f32, n, *l.stream);
      if (wire != DType::kFloat32) {
        uint16_t* h = direct ? reinterpret_cast<uint16_t*>(dst) : l.half_buffer(n);
        // The cast is elementwise, so casting entry by entry gives the same bits; on host memory
        // it names the tensor that saturated. A device backend casts the run at once (one launch)
        // and names a tensor only when the run holds one.
        const bool per_entry = direct && run_end - run_begin > 1;
        for (size_t k = 0; k < (per_entry ? entries.size() : 1); ++k) {
          const size_t offset = per_entry ? entries[k].offset : 0;
          const size_t count = per_entry ? entries[k].numel : n;
          if (count == 0) continue;
          be::CastCounts c = b.to_half(f32 + offset, h + offset, count, wire, scale, *l.stream);
          if (per_entry || run_end - run_begin == 1) note_saturated(c, run_begin + k);
          counters.saturated += c.saturated;
          counters.nonfinite += c.nonfinite;
        }
        if (!direct) b.copy(dst, h, n * 2, *l.stream);
      } else if (!direct) {
        b.copy(dst, f32, n * 4, *l.stream);
      }
      if (!direct) {
        staged_bytes_ += n * elem;
        l.synchronize();  // the ring reads the staging buffer next
      }
    });
    counters.cast_seconds += seconds_since(t0);

    bucket.wire = wire;
    bucket.bytes = stage;
    bucket.count = bytes / elem;
  }
  return bucket;
}

void BackendPath::unstage_dense(DenseBucket& bucket, std::vector<DenseItem>& items,
                                const std::vector<TensorState*>& tensor,
                                const DenseExchangeOptions& options, DenseCounters& counters) {
  const int world = bucket.world;
  const DType wire = bucket.wire;
  const size_t elem = dtype_size(wire);
  const bool cast_in_place = wire != DType::kFloat32 && options.nonfinite != NonFinitePolicy::kZero;
  std::vector<DenseView>& views = bucket.views;
  std::vector<be::FusionEntry> entries;
  {
    const size_t begin = 0, end = items.size();
    uint8_t* stage = bucket.bytes;
    auto for_each_run = [&](auto&& fn) {
      for_each_backend_run(views, begin, end, stage, elem, entries, fn);
    };
    auto t2 = Clock::now();
    // fp32 sums are divided here (16-bit values were divided before the cast): on a host backend
    // straight into each tensor, else in the staging bucket before it is copied back.
    const float divisor = static_cast<float>(world);
    for_each_run([&](be::Backend& b, size_t n, uint8_t* src, size_t, size_t) {
      if (n == 0) return;
      Lane& l = lane(b);
      const bool direct = b.host_accessible();
      if (wire == DType::kFloat32) {
        auto* sums = reinterpret_cast<float*>(src);
        if (direct) {
          for (const be::FusionEntry& e : entries)
            for (size_t j = 0; j < e.numel; ++j)
              e.data[j] = sums[e.offset + j] / divisor;
          return;
        }
        for (size_t i = 0; i < n; ++i)
          sums[i] = sums[i] / divisor;
      }
      if (direct && cast_in_place) {
        for (const be::FusionEntry& e : entries)
          if (e.numel)
            b.from_half(reinterpret_cast<const uint16_t*>(src) + e.offset, e.data, e.numel, wire,
                        1.0f, false, *l.stream);
        return;
      }
      const float* f32 = reinterpret_cast<const float*>(src);
      if (wire != DType::kFloat32) {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
        if (!direct) {
          b.copy(l.half_buffer(n), src, n * 2, *l.stream);
          h = l.half_buffer(n);
        }
        float* out = l.f32_buffer(n);
        b.from_half(h, out, n, wire, 1.0f, false, *l.stream);
        f32 = out;
      } else if (!direct) {
        b.copy(l.f32_buffer(n), src, n * 4, *l.stream);
        f32 = l.f32_buffer(n);
      }
      b.scatter(f32, entries.data(), entries.size(), *l.stream);
      if (!direct) staged_bytes_ += n * elem;
      l.synchronize();  // the next bucket reuses the staging buffer and this lane's buffers
    });
    if (options.nonfinite == NonFinitePolicy::kError)
      for (size_t i = begin; i < end; ++i)
        items[i].nonfinite_result =
            views[i].backend->count_nonfinite(views[i].data, views[i].numel,
                                              *lane(*views[i].backend).stream) > 0;
    counters.cast_seconds += seconds_since(t2);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (TensorState* t = tensor[i])
      t->backend->ready->record(*lane(*views[i].backend).stream);  // the finish stage waits
    else if (items[i].dtype != DType::kFloat32)
      detail::from_float(views[i].data, items[i].numel, items[i].dtype, items[i].data);
  }
}

}  // namespace gradex::sync
