// What the timeline says about a unit of the engine's pipeline (sync/engine/pipeline.h): its route,
// the codecs of its tensors and their counts, its tensors and elements, and, at most 8 of them, the
// tensors' keys. Shared by the unit's encode, transfer, decode and per-peer spans.
#pragma once

#include "sync/engine/pipeline.h"
#include "sync/timeline/recorder.h"

namespace gradex::sync::timeline {

Args unit_args(const pipeline::Unit& unit);

}  // namespace gradex::sync::timeline
