// Routes kInt8 and kInt4 (the policies 'int8' and 'int4', the auto policy's 8-bit and 4-bit rungs):
// a bucket of such tensors in one comm::encoded_allreduce of 8-bit (or 4-bit) blocks with error
// feedback on both quantizations (sync/data/int8_exchange.h). Each tensor's values reach the
// exchange through its backend (BackendPath::stage_int8 and unstage_int8: host tensors in place,
// device tensors through host memory); the residuals live in TensorState. Under GRADEX_HIERARCHICAL
// the encoded phases cross the layout's groups only (comm::hierarchical_encoded_allreduce); flat,
// in one hop instead of two where the agreed link model says so.
#include <string>
#include <vector>

#include "base/error.h"
#include "sync/data/backend_path.h"
#include "sync/data/int8_exchange.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {
namespace {

class QuantizedRoute : public Transfer {
 public:
  explicit QuantizedRoute(Path path) : path_(path), bits_(quantized_path_bits(path)) {}
  Path path() const override { return path_; }
  // The agreed link model: a plan that keeps every tensor on this route (the auto policy's 8-bit
  // or 4-bit rung across a slow link) must still switch on what the engine does on a
  // latency-bound link (Engine::ProgressLoop::coalesce_submissions). This route prices no incast,
  // so the probe's bursts wait for a route that does, unless the link is latency-bound.
  void plan(Context& ctx) const override {
    if (ctx.world_size > 1) ctx.link.agree(ctx.comm, /*incast=*/false);
  }

  void exchange(pipeline::Unit& unit, Context& ctx) const override {
    std::vector<TensorState*> tensors;
    std::vector<float*> values;
    std::vector<bool> absent;
    for (pipeline::Job* job : unit.jobs) {
      tensors.push_back(job->tensor);
      values.push_back(static_cast<float*>(job->values));
      absent.push_back(job->absent);
    }
    // One hop where the agreed model says a latency costs more than its extra bytes: a decision
    // from numbers every rank holds (the model, the unit's sizes). The model prices the flat
    // exchange over every rank; with a layout the encoded phases run among each local shard's
    // owners, in two phases.
    uint64_t encoded = 0;
    for (const TensorState* t : tensors)
      encoded += int8_encoded_bytes(t->numel, bits_);
    unit.one_hop = encoded <= quantized_one_hop_max_bytes(ctx.link.model(), ctx.hosts);
    uint64_t elements = 0;
    for (const TensorState* t : tensors)
      elements += t->numel;
    unit.sample.codec = bits_ == 4 ? Codec::kInt4 : Codec::kInt8;
    unit.sample.terms = cost::int8_allreduce_terms(static_cast<double>(elements), ctx.world_size,
                                                   bits_, unit.one_hop);
    unit.sample.codec_cpu_in_transfer = true;
    Int8Counters c;
    try {
      Int8Staging staging =
          ctx.path.stage_int8(tensors, values, absent, ctx.comm.size(), ctx.comm.rank(), ctx.hosts);
      int8_allreduce(ctx.comm, staging.items, bits_, c, unit.one_hop, ctx.hosts);
      ctx.path.unstage_int8(staging, tensors, values);
    } catch (const Error& e) {
      throw Error(e.code(), std::to_string(bits_) + "-bit dense bucket of " +
                                std::to_string(unit.jobs.size()) + " tensor(s) [" + unit.keys() +
                                "]: " + e.what());
    }
    unit.counters.prepare_seconds += c.encode_seconds;
    unit.counters.finish_seconds += c.decode_seconds;
    unit.counters.transfer_seconds += c.communicate_seconds;
    if (c.nonfinite > 0)
      for (pipeline::Job* job : unit.jobs)
        job->nonfinite_result = true;  // sent as 0: under GRADEX_NONFINITE=error the unit fails
  }

 private:
  const Path path_;
  const int bits_;
};

}  // namespace

uint64_t quantized_one_hop_max_bytes(const LinkModel* link, const comm::HostTopology* hosts) {
  return hosts == nullptr && link != nullptr ? link->quantized_one_hop_max_bytes() : 0;
}

const Transfer& int8_route() {
  static const QuantizedRoute route(Path::kInt8);
  return route;
}

const Transfer& int4_route() {
  static const QuantizedRoute route(Path::kInt4);
  return route;
}

}  // namespace gradex::sync::route
