// Route kFirstAverage: LocalSGD's first parameter average: fused, fp32 on the wire whatever the
// dense wire type, since it establishes the anchor on every rank. Its jobs are parameter
// averages: no gradient residual to fold.
#include "sync/route/dense_bucket.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {
namespace {

class FirstAverageRoute : public Transfer {
 public:
  Path path() const override { return Path::kFirstAverage; }
  void plan(Context& ctx) const override { plan_dense(ctx); }
  void exchange(pipeline::Unit& unit, Context& ctx) const override {
    exchange_dense(unit, ctx, /*fp32_wire=*/true);
    unit.sample.codec_work = false;  // parameters, not a codec's work
  }
};

}  // namespace

const Transfer& first_average_route() {
  static const FirstAverageRoute route;
  return route;
}

}  // namespace gradex::sync::route
