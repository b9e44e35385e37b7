#include "bench/exchange_modes.h"

#include <cmath>

#include "base/check.h"
#include "base/error.h"
#include "comm/collectives.h"
#include "compress/half/cast.h"
#include "sync/data/int8_exchange.h"

namespace gradex::bench {

namespace {

// Dense fp32: one allreduce_sum over the whole flat buffer, then the division by the world size.
// The sum is accumulated in a different order than the reference, hence a few ulps per rank.
class DenseFp32 : public ExchangeMode {
 public:
  explicit DenseFp32(ModeContext& ctx) : comm_(ctx.comm) {}

  void step(float* grads, size_t count) override {
    comm::allreduce_sum(comm_, grads, count, DType::kFloat32);
    const float inv = 1.0f / static_cast<float>(comm_.size());
    for (size_t i = 0; i < count; ++i)
      grads[i] *= inv;
  }

  std::optional<Tolerance> tolerance() const override {
    return Tolerance{4e-7 * (comm_.size() + 2), 1e-30};
  }

 private:
  comm::Communicator& comm_;
};

// Dense fp16: each rank pre-divides by the world size and casts to fp16 (dividing first keeps the
// sum in fp16's range, as PyTorch's fp16 compression hook does), the allreduce accumulates in fp32
// and rounds once per hop, and the result is cast back to fp32. The casts are compress/'s bulk
// casts (vectorized, rounding bit-identical to base/half.h): the cost gradex's own dense fp16 path
// pays, not that of a scalar loop.
class DenseFp16 : public ExchangeMode {
 public:
  explicit DenseFp16(ModeContext& ctx) : comm_(ctx.comm), half_(ctx.model.total_numel) {}

  void step(float* grads, size_t count) override {
    GX_CHECK_EQ(count, half_.size());
    uint16_t* h = half_.data();
    compress::half::to_half_predivided(grads, h, count, DType::kFloat16, comm_.size());
    comm::allreduce_sum(comm_, h, count, DType::kFloat16);
    compress::half::from_half(h, grads, count, DType::kFloat16, 1.0f);
  }

  // One rounding of each input (2^-11 relative) plus one per ring hop, and fp16's subnormal
  // spacing (2^-24) for the tiny values, per hop.
  std::optional<Tolerance> tolerance() const override {
    double p = comm_.size();
    return Tolerance{std::ldexp(1.0, -11) * (p + 2), std::ldexp(1.0, -24) * (p + 2)};
  }

 private:
  comm::Communicator& comm_;
  std::vector<uint16_t> half_;
};

// Dense 8-bit or 4-bit (the engine's 'int8' / 'int4' route, sync/data/int8_exchange.h, without the
// engine): every profile tensor encoded to blocks of that width with error feedback, a direct
// reduce-scatter whose owners sum in fp32 and re-encode the average with error feedback of their
// own, a direct allgather. The output is the average up to two roundings whose errors are carried
// into the next step, so no per-element tolerance against the exact average applies: step() checks
// that what every rank received is finite instead (the engine tests check bit identity and the
// error-feedback sums).
template <int Bits>
class DenseQuantized : public ExchangeMode {
 public:
  explicit DenseQuantized(ModeContext& ctx)
      : comm_(ctx.comm),
        model_(ctx.model),
        residual_(ctx.model.total_numel, 0.0f),
        owner_(ctx.model.total_numel, 0.0f) {}

  void step(float* grads, size_t count) override {
    GX_CHECK_EQ(count, residual_.size());
    items_.clear();
    size_t offset = 0;
    for (const TensorSpec& t : model_.tensors) {
      const size_t n = static_cast<size_t>(t.numel);
      items_.push_back(
          {grads + offset, n, residual_.data() + offset, owner_.data() + offset, &t.name});
      offset += n;
    }
    sync::Int8Counters counters;
    sync::int8_allreduce(comm_, items_, Bits, counters);
    if (counters.nonfinite != 0)
      throw InternalError("dense" + std::to_string(Bits) + ": " +
                          std::to_string(counters.nonfinite) + " non-finite values");
  }

  std::optional<Tolerance> tolerance() const override { return std::nullopt; }

 private:
  comm::Communicator& comm_;
  const ModelProfile& model_;
  std::vector<float> residual_, owner_;
  std::vector<sync::Int8Item> items_;
};

template <typename Mode>
std::function<std::unique_ptr<ExchangeMode>(ModeContext&)> factory() {
  return [](ModeContext& ctx) { return std::make_unique<Mode>(ctx); };
}

}  // namespace

const std::vector<ModeSpec>& exchange_modes() {
  static const std::vector<ModeSpec> modes = {
      {"dense_fp32", "one fp32 ring allreduce over all gradients (the baseline)",
       factory<DenseFp32>()},
      {"dense_fp16", "pre-divide, cast to fp16, fp16 ring allreduce, cast back",
       factory<DenseFp16>()},
      {"dense8",
       "8-bit blocks with error feedback: direct reduce-scatter (fp32 sums), owners re-encode, "
       "direct allgather (the engine's int8 route without the engine)",
       factory<DenseQuantized<8>>()},
      {"dense4",
       "4-bit blocks with error feedback, the same exchange as dense8 (the engine's int4 route "
       "without the engine)",
       factory<DenseQuantized<4>>(), /*in_all=*/false},
  };
  static const std::vector<ModeSpec> all = [] {
    std::vector<ModeSpec> v = modes;
    for (ModeSpec& m : engine_modes())
      v.push_back(std::move(m));
    return v;
  }();
  return all;
}

std::vector<const ModeSpec*> select_modes(const std::string& list) {
  std::string available;
  for (const ModeSpec& m : exchange_modes())
    available += (available.empty() ? "" : ", ") + m.name;
  std::vector<const ModeSpec*> out;
  if (list == "all") {
    for (const ModeSpec& m : exchange_modes())
      if (m.in_all) out.push_back(&m);
    return out;
  }
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string name = list.substr(start, comma - start);
    const ModeSpec* found = nullptr;
    for (const ModeSpec& m : exchange_modes()) {
      if (m.name == name) found = &m;
    }
    if (!found) {
      throw InvalidArgument("unknown mode '" + name + "' (available: " + available + ", or all)");
    }
    for (const ModeSpec* m : out) {
      if (m == found) throw InvalidArgument("mode '" + name + "' listed twice");
    }
    out.push_back(found);
    start = comma + 1;
  }
  return out;
}

}  // namespace gradex::bench
