#include "sync/timeline/unit_args.h"

#include <map>
#include <string>

#include "sync/policy/policy.h"
#include "sync/route/path.h"

namespace gradex::sync::timeline {

Args unit_args(const pipeline::Unit& unit) {
  // "dgc 99% x3, fp16 x1": the codec mix of the unit, in name order.
  std::map<std::string, int> codecs;
  for (const pipeline::Job* job : unit.jobs)
    ++codecs[rung_name(job->tensor->policy.rung) + (job->rider ? " (rider)" : "")];
  std::string mix;
  for (const auto& [name, count] : codecs)
    mix += (mix.empty() ? "" : ", ") + name + " x" + std::to_string(count);
  Args args;
  args.add("route", route::path_name(unit.path))
      .add("codec", mix)
      .add("tensors", static_cast<uint64_t>(unit.jobs.size()))
      .add("elements", unit.elements())
      .add("keys", unit.keys());
  return args;
}

}  // namespace gradex::sync::timeline
