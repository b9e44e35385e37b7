#include "sync/policy/codec_calibration.h"

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "base/cpu_time.h"
#include "base/log.h"
#include "comm/collectives/reduce.h"
#include "compress/backend/backend.h"
#include "compress/backend/block_codec.h"
#include "compress/dgc/schedule.h"
#include "sync/data/codec_factory.h"
#include "sync/policy/transport_cpu.h"

namespace gradex::sync {

void calibrate_codecs(cost::CostModel& model, const CalibrationSettings& s) {
  // Measured alone, at start-up, on ~2^18 elements on the host backend: gradex's momentum, the
  // fp32 bucket's copies, the 16-bit cast there and back, the rings' sums, the 8-bit codec, and
  // DGC's step (at the ladder's highest sparsity) with the decode of its payload. The units'
  // measured times correct them later (observe_unit, Snapshot::codec_factor).
  //
  // Each is this thread's CPU time (CLOCK_THREAD_CPUTIME_ID), on a tensor small enough to stay on
  // this thread (the kernels split work over the pool from 2^18 elements): the cost of the work
  // itself, not the time other programs took the core. Wall time read up to 10x too high on a
  // shared 2-core host. Even CPU time moves with the load (caches, memory bandwidth and a core's
  // sibling thread shared with other programs: DGC's encode read 0.66-1.95 ns per element between
  // runs, 2.7-2.9 with four ranks calibrating on two cores), and which codec looked cheap then
  // depended on which measurement the load fell on. So every measurement runs once per round,
  // kRounds interleaved rounds, and each codec's number is the least of its rounds: load only ever
  // adds to a sample, so the least is the nearest to the work's own cost for every codec alike (a
  // median of seven still priced DGC at 2.4x its cost with four ranks on two cores, and the plan
  // flipped between 16-bit everywhere and DGC from run to run). What contention a step really
  // sees comes from its units' measured times (observe_unit, Snapshot::codec_factor), as for
  // every later sample (CostModel::observe_codec also keeps the least).
  namespace be = compress::backend;
  // Just under the codec's parallel threshold (2^18): one thread, fixed costs amortised.
  constexpr size_t kN = (1u << 18) - 1024;
  constexpr int kRounds = 7;
  const be::BackendPtr backend = be::get_backend(be::DeviceType::kCpu);
  const be::StreamPtr stream = backend->create_stream();
  std::vector<float> g(kN), values(kN), u(kN, 0.0f), bucket(kN);
  uint32_t x = 0x12345678u;
  for (float& v : g) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x)) * 4.6566e-10f;
  }
  const DType half_type = s.options.half_on_wire ? s.options.half_type : DType::kFloat16;
  const float divisor = static_cast<float>(std::max(s.world_size, 1));
  std::vector<uint16_t> half(kN), half_acc(kN);
  backend->to_half(g.data(), half_acc.data(), kN, half_type, 0.25f, *stream);
  // The quantized route's widths, 8 and 4 bits: codec, encoding and residual each.
  constexpr Codec kQuantized[] = {Codec::kInt8, Codec::kInt4};
  constexpr int kWidths = 2;
  // Encode, the owner's sum (decode_add), decode.
  enum QuantOp { kQuantEncode, kQuantSum, kQuantDecode, kQuantOps };
  std::array<const be::BlockCodec*, kWidths> quant{};
  std::array<std::vector<uint8_t>, kWidths> quant_bytes;
  std::vector<float> quant_residual(kN, 0.0f);
  for (int w = 0; w < kWidths; ++w) {
    quant[w] = &be::block_codec(quantized_bits(kQuantized[w]));
    quant_bytes[w].resize(quant[w]->encoded_size(kN));
  }
  const double sparsity = s.dgc_sparsity;
  const compress::DgcOptions dgc =
      sparse_codec_options(Codec::kDgc, s.config, s.options, s.world_size, sparsity);
  const std::unique_ptr<be::DgcCodec> probe =
      make_sparse_codec(Codec::kDgc, *backend, "gradex.probe", kN, 0, dgc,
                        compress::wire_options_from_config(s.config), s.options);
  be::DgcCodec& codec = *probe;
  std::vector<uint8_t> payload;
  values = g;
  codec.encode_step(values.data(), 1.0f, *stream, payload);  // warms buffers and the threshold

  enum Measure {
    kMomentum,
    kGather,
    kDivide,
    kToHalf,
    kFromHalf,
    kSumFp32,
    kSumHalf,
    kDgcEncode,
    kDgcDecode,
    // Then the quantized route's operations per width w, at kQuant + kQuantOps * w + op.
    kQuant,
    kMeasures = kQuant + kQuantOps * kWidths
  };
  auto quant_measure = [&](int w, QuantOp op) { return kQuant + kQuantOps * w + op; };
  auto run = [&](int m) {
    if (m >= kQuant) {
      const int w = (m - kQuant) / kQuantOps;
      const be::BlockCodec& q = *quant[w];
      uint8_t* bytes = quant_bytes[w].data();
      const auto op = static_cast<QuantOp>((m - kQuant) % kQuantOps);
      if (op == kQuantEncode)
        q.encode(g.data(), quant_residual.data(), kN, bytes);
      else if (op == kQuantSum)
        q.decode_add(bytes, kN, values.data());
      else
        q.decode(bytes, kN, values.data());
      return;
    }
    switch (m) {
      case kMomentum:  // gradex's momentum: part of every dense unit's prepare stage
        if (s.options.momentum > 0)
          backend->apply_momentum(values.data(), u.data(), kN, s.options.momentum,
                                  s.options.nesterov, 1.0f, *stream);
        break;
      case kGather:  // an fp32 bucket: gathered into the ring's buffer (prepare) ...
        std::copy(g.begin(), g.end(), bucket.begin());
        break;
      case kDivide:  // ... and divided back into the tensor (sync/data/dense_exchange.cc)
        for (size_t j = 0; j < kN; ++j)
          values[j] = bucket[j] / divisor;
        break;
      case kToHalf:
        backend->to_half(g.data(), half.data(), kN, half_type, 0.5f, *stream);
        break;
      case kFromHalf:
        backend->from_half(half.data(), values.data(), kN, half_type, 1.0f, false, *stream);
        break;
      case kSumFp32:  // the rings' reduce-scatter sums on each wire type
                      // (comm/collectives/reduce.h)
        comm::sum_into(bucket.data(), values.data(), kN, DType::kFloat32);
        break;
      case kSumHalf:
        comm::sum_into(half_acc.data(), half.data(), kN, half_type);
        break;
      case kDgcEncode:
        payload.clear();
        values = g;
        codec.encode_step(values.data(), 1.0f, *stream, payload);
        break;
      case kDgcDecode:
        codec.sum_payloads({{payload.data(), payload.size()}}, 1.0f, values.data(), *stream);
        break;
    }
  };
  std::array<std::vector<double>, kMeasures> samples;
  for (int round = 0; round < kRounds; ++round) {
    for (int m = 0; m < kMeasures; ++m) {
      if (m == kMomentum) values = g;
      const double a = thread_cpu_seconds();
      run(m);
      samples[static_cast<size_t>(m)].push_back(thread_cpu_seconds() - a);
    }
  }
  auto least = [&](int m) {
    const std::vector<double>& v = samples[static_cast<size_t>(m)];
    return *std::min_element(v.begin(), v.end());
  };
  const double momentum_s = s.options.momentum > 0 ? least(kMomentum) : 0.0;
  model.observe_codec(cost::Codec::kFp32, kN, momentum_s + least(kGather), least(kDivide));
  model.observe_codec(cost::Codec::kHalf, kN, momentum_s + least(kToHalf), least(kFromHalf));
  model.observe_reduce(cost::Codec::kFp32, kN, least(kSumFp32));
  model.observe_reduce(cost::Codec::kHalf, kN, least(kSumHalf));
  // The quantized route at each width: encode, the owner's sum of P pieces (N values in all) and
  // re-encode of 1/P, then the decode of every segment.
  const double owner = 1.0 / static_cast<double>(std::max(s.world_size, 1));
  for (int w = 0; w < kWidths; ++w)
    model.observe_codec(kQuantized[w], kN,
                        momentum_s + least(quant_measure(w, kQuantEncode)) * (1.0 + owner) +
                            least(quant_measure(w, kQuantSum)),
                        least(quant_measure(w, kQuantDecode)));
  model.observe_codec(cost::Codec::kDgc, kN, least(kDgcEncode), least(kDgcDecode),
                      compress::dgc::target_count(kN, sparsity));
}

void calibrate_adam_codec(cost::CostModel& model, const CalibrationSettings& s) {
  // The Adam codec as the engine builds it (sync/data/codec_factory.h: the chunked DCT unless
  // GRADEX_ADAM_TRANSFORM=none), at its sparsity, measured as measure_codecs measures DGC: this
  // thread's CPU time, the least of kRepeats runs. On 255 x 256 elements (blocks of 51 x 64 at
  // the default chunk, as a weight's): under 2^16, where the DCT would spread its blocks over
  // the pool and this thread's clock would miss the pool's share. The decode sums the world's P
  // payloads and, with the DCT, transforms the tensor back: priced per element of the tensor.
  namespace be = compress::backend;
  constexpr uint64_t kRows = 255;
  constexpr size_t kN = kRows * 256;
  const be::BackendPtr backend = be::get_backend(be::DeviceType::kCpu);
  const be::StreamPtr stream = backend->create_stream();
  std::vector<float> g(kN), values(kN);
  uint32_t x = 0x9e3779b9u;
  for (float& v : g) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x)) * 4.6566e-10f;
  }
  const double sparsity = s.adam_sparsity;
  const compress::DgcOptions dgc =
      sparse_codec_options(Codec::kAdam, s.config, s.options, s.world_size, sparsity);
  const std::unique_ptr<be::DgcCodec> codec =
      make_sparse_codec(Codec::kAdam, *backend, "gradex.probe.adam", kN, kRows, dgc,
                        compress::wire_options_from_config(s.config), s.options);
  constexpr int kRepeats = 5;
  auto least = [&](auto&& body) {
    double best = 0;
    for (int r = 0; r < kRepeats; ++r) {
      const double a = thread_cpu_seconds();
      body();
      const double s = thread_cpu_seconds() - a;
      if (r == 0 || s < best) best = s;
    }
    return best;
  };
  std::vector<uint8_t> payload;
  values = g;
  codec->encode_step(values.data(), 1.0f, *stream, payload);  // warms buffers and the threshold
  const double encode_s = least([&] {
    payload.clear();
    values = g;
    codec->encode_step(values.data(), 1.0f, *stream, payload);
  });
  const std::vector<compress::wire::PayloadSpan> received(
      static_cast<size_t>(std::max(s.world_size, 1)), {payload.data(), payload.size()});
  const float scale = 1.0f / static_cast<float>(std::max(s.world_size, 1));
  const double decode_s = least([&] {
    std::fill(values.begin(), values.end(), 0.0f);
    codec->sum_payloads(received, scale, values.data(), *stream);
  });
  model.observe_codec(cost::Codec::kAdam, kN, encode_s, decode_s);
  model.observe_adam_payload(compress::dgc::target_count(kN, sparsity), payload.size());
  GX_LOG(kDebug) << "GRADEX_POLICY=auto: adam codec " << encode_s / kN * 1e9 << " ns encode, "
                 << decode_s / kN * 1e9 << " ns decode per element, "
                 << static_cast<double>(payload.size()) /
                        static_cast<double>(compress::dgc::target_count(kN, sparsity))
                 << " bytes per value";
}

void calibrate_transport(cost::CostModel& model, const cost::ProbeResult* probe) {
  // The transport's CPU per byte sent and received: rank 0's thread over the probe's largest
  // round trips through this communicator (its copies, protocol and progress work: what a ring
  // pays per byte besides the wire), else a TCP loopback connection driven by this thread alone
  // (the kernel's share only: reads low where the transport copies again in user space).
  if (probe != nullptr && probe->transport_bytes > 0) {
    model.observe_transport(probe->transport_bytes, probe->transport_cpu_s);
    GX_LOG(kDebug) << "GRADEX_POLICY=auto: transport CPU "
                   << probe->transport_cpu_s / static_cast<double>(probe->transport_bytes) * 1e9
                   << " ns per byte (link probe)";
    return;
  }
  const cost::TransportSample t = cost::measure_transport();
  model.observe_transport(t.bytes, t.seconds);
  GX_LOG(kDebug) << "GRADEX_POLICY=auto: transport CPU over " << t.via << ": "
                 << (t.bytes ? t.seconds / static_cast<double>(t.bytes) * 1e9 : 0.0)
                 << " ns per byte ("
                 << (t.bytes ? t.wall_seconds / static_cast<double>(t.bytes) * 1e9 : 0.0)
                 << " ns wall)";
}

}  // namespace gradex::sync
