// Route kSparse: a DGC unit (one tensor, or a group of small ones) whose payloads, framed into one
// message per rank by the prepare stage, travel in one allgatherv chosen by sync/sparse_gather.h
// (inline round trip when small, direct or ring above); finish_unit decodes every rank's message.
#include <chrono>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "base/wall_time.h"
#include "sync/route/routes.h"

namespace gradex::sync::route {

// The link probe every DGC route agrees before its first gather (shared with
// sparse_hierarchical.cc): its bytes are not the unit's.
void plan_sparse(Context& ctx) {
  if (ctx.gather.needs_link() && ctx.world_size > 1) ctx.link.agree(ctx.comm);
}

namespace {

class SparseRoute : public Transfer {
 public:
  Path path() const override { return Path::kSparse; }
  void plan(Context& ctx) const override { plan_sparse(ctx); }

  void exchange(pipeline::Unit& unit, Context& ctx) const override {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const comm::AllgathervPath path =
          ctx.gather.gather(ctx.comm, ctx.link.model(), unit.message, unit.received);
      GX_LOG(kDebug) << "sparse gather of [" << unit.keys() << "]: " << unit.message.size()
                     << " bytes, " << comm::allgatherv_path_name(path);
    } catch (const Error& e) {
      throw Error(e.code(), "sparse exchange of [" + unit.keys() + "]: " + e.what());
    }
    unit.counters.transfer_seconds += seconds_since(t0);
  }
};

}  // namespace

const Transfer& sparse_route() {
  static const SparseRoute route;
  return route;
}

}  // namespace gradex::sync::route
