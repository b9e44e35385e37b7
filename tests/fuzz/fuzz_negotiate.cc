// libFuzzer target for negotiation messages. sync/negotiator's parser is private (and is being
// rewritten elsewhere), so the input reaches it through the narrowest public function,
// Negotiator::round(), with rank 0's contribution to each round's allgatherv taken from the input
// (rank 0's messages may carry aborts). This process is rank 1 of 2 and announces a fixed set of
// keys. Input: a sequence of [u16 little-endian length][message] chunks, one per round. Every round
// must either complete or fail with CorruptPayload (a malformed message); anything else (a crash, a
// sanitizer report, another exception) is a bug. Verdicts must be well-formed: a ready or failed
// key was announced by someone.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "sync/negotiator.h"
#include "tests/fuzz/scripted_comm.h"

using namespace gradex;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::ScriptedComm comm(1, 2);
  sync::Negotiator negotiator(comm, std::chrono::milliseconds(1000));
  std::vector<sync::Announcement> mine = {
      {{sync::WorkKind::kGradient, "layer0.weight"}, 1000, DType::kFloat32},
      {{sync::WorkKind::kAverage, "layer0.weight"}, 1000, DType::kFloat32},
      {{sync::WorkKind::kGradient, "bias"}, 10, DType::kFloat16}};
  size_t at = 0;
  for (int round = 0; round < 16 && at + 2 <= size; ++round) {
    size_t n = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    if (n > size - at) n = size - at;
    comm.script_allgatherv(0, std::vector<uint8_t>(data + at, data + at + n));
    at += n;
    try {
      sync::RoundResult r =
          negotiator.round(round == 0 ? mine : std::vector<sync::Announcement>{}, false);
      for (const auto& w : r.ready) {
        if (w.id.kind != sync::WorkKind::kGradient && w.id.kind != sync::WorkKind::kAverage)
          std::abort();
        for (int rank : w.nonfinite_ranks)
          if (rank < 0 || rank >= comm.size()) std::abort();
      }
      for (const auto& f : r.failed)
        if (f.message.empty()) std::abort();
    } catch (const CorruptPayload&) {
      return 0;  // a malformed message is rejected: the engine fails the job cleanly
    }
  }
  return 0;
}
