// Routes kInt8 and kInt4 (the policies 'int8' and 'int4', the auto policy's 8-bit and 4-bit rungs):
// a bucket of such tensors in one comm::encoded_allreduce of 8-bit (or 4-bit) blocks with error
// feedback on both quantizations (sync/int8_exchange.h). Each tensor's values reach the exchange
// through its backend (BackendPath::int8_average: host tensors in place, device tensors through
// host memory); the residuals live in TensorState. Under GRADEX_HIERARCHICAL the encoded phases
// cross the layout's groups only (comm::hierarchical_encoded_allreduce); flat, in one hop instead
// of two where the agreed link model says so.
#include <string>
#include <vector>

#include "base/error.h"
#include "sync/backend_path.h"
#include "sync/int8_exchange.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {
namespace {

class QuantizedRoute : public Transfer {
 public:
  explicit QuantizedRoute(Path path) : path_(path), bits_(quantized_path_bits(path)) {}
  Path path() const override { return path_; }
  // The agreed link model: a plan that keeps every tensor on this route (the auto policy's 8-bit
  // or 4-bit rung across a slow link) must still switch on what the engine does on a
  // latency-bound link (Engine::coalesce_submissions). This route prices no incast, so the
  // probe's bursts wait for a route that does, unless the link is latency-bound.
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
    const LinkModel* model = ctx.link.model();
    unit.one_hop =
        ctx.hosts == nullptr && model != nullptr && encoded <= model->quantized_one_hop_max_bytes();
    Int8Counters c;
    try {
      ctx.path.int8_average(ctx.comm, tensors, values, absent, bits_, unit.one_hop, ctx.hosts, c);
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

const Transfer& int8_route() {
  static const QuantizedRoute route(Path::kInt8);
  return route;
}

const Transfer& int4_route() {
  static const QuantizedRoute route(Path::kInt4);
  return route;
}

}  // namespace gradex::sync::route
