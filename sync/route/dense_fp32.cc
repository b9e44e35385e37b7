// Route kDenseFp32: The auto policy's fp32 rung on a 16-bit dense wire: the same fused allreduce,
// fp32 on the wire, in buckets of its own (pipeline::plan).
#include "sync/route/dense_bucket.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {
namespace {

class DenseFp32Route : public Transfer {
 public:
  Path path() const override { return Path::kDenseFp32; }
  void plan(Context& ctx) const override { plan_dense(ctx); }
  void prepare(pipeline::Unit& unit, Context& ctx) const override {
    fold_int8_residuals(unit, ctx);
  }
  void exchange(pipeline::Unit& unit, Context& ctx) const override {
    exchange_dense(unit, ctx, /*fp32_wire=*/true);
  }
};

}  // namespace

const Transfer& dense_fp32_route() {
  static const DenseFp32Route route;
  return route;
}

}  // namespace gradex::sync::route
