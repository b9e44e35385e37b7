// Route kDense: Fused allreduce of a bucket on the dense wire type (fp32, or 16-bit with
// GRADEX_FP16/BF16; the collective ring, direct or hierarchical per sync/data/dense_exchange.h).
// DGC tensors in their dense warm-up steps (kDgcDenseStep) ride these buckets: their prepare stage
// is DGC's, the wire is this.
#include "sync/route/dense_bucket.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {
namespace {

class DenseRoute : public Transfer {
 public:
  Path path() const override { return Path::kDense; }
  void plan(Context& ctx) const override { plan_dense(ctx); }
  void prepare(pipeline::Unit& unit, Context& ctx) const override {
    fold_int8_residuals(unit, ctx);
  }
  void exchange(pipeline::Unit& unit, Context& ctx) const override {
    exchange_dense(unit, ctx, /*fp32_wire=*/false);
  }
};

}  // namespace

const Transfer& dense_route() {
  static const DenseRoute route;
  return route;
}

}  // namespace gradex::sync::route
