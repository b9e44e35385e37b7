// One rank's side of a negotiation, as the engine would drive it, shared by the negotiation fuzzer
// (this process is rank 1, rank 0's messages are the input) and its seed generator (which runs it
// on rank 1 of a real two-rank negotiation, so that the seeds' cache ids are the ones the fuzz
// target assigns). Three keys; each is announced again as soon as its last announcement got a
// verdict, with the counter the engine would carry (agreed step + 1 for gradients), now and then
// with a non-finite flag or a counter from an older checkpoint: so cached keys, non-finite bits
// and counter exceptions all occur. verdicts() aborts on a verdict that cannot be right.
#pragma once

#include <cstdlib>
#include <vector>

#include "sync/negotiation/negotiator.h"

namespace gradex::fuzz {

class NegotiateScript {
 public:
  NegotiateScript(int rank, int world) : rank_(rank), world_(world) {
    keys_ = {{{sync::WorkKind::kGradient, "layer0.weight"}, 1000, DType::kFloat32},
             {{sync::WorkKind::kAverage, "layer0.weight"}, 1000, DType::kFloat32},
             {{sync::WorkKind::kGradient, "bias"}, 10, DType::kFloat16}};
  }

  // This round's announcements (`round` counts from 0).
  std::vector<sync::Announcement> next(int round) {
    std::vector<sync::Announcement> out;
    for (Key& k : keys_) {
      if (k.pending) continue;
      sync::Announcement a{k.id, k.numel, k.dtype, k.step};
      if (k.id.key == "bias" && round % 3 == 1) a.nonfinite = true;
      if (k.id.kind == sync::WorkKind::kGradient && k.id.key != "bias" && (round + rank_) % 5 == 4)
        a.step = 0;  // a rank restored from an older checkpoint
      k.pending = true;
      out.push_back(a);
    }
    return out;
  }

  void verdicts(const sync::RoundResult& r) {
    for (const auto& w : r.ready) {
      if (w.id.kind != sync::WorkKind::kGradient && w.id.kind != sync::WorkKind::kAverage)
        std::abort();
      for (int q : w.nonfinite_ranks)
        if (q < 0 || q >= world_) std::abort();
      if (Key* k = find(w.id)) {
        if (!k->pending) std::abort();  // ready needs this rank's announcement
        k->pending = false;
        k->step = w.id.kind == sync::WorkKind::kGradient ? w.step + 1 : 0;
      }
    }
    for (const auto& f : r.failed) {
      if (f.message.empty()) std::abort();
      if (Key* k = find(f.id)) k->pending = false;
    }
  }

 private:
  struct Key {
    sync::WorkId id;
    uint64_t numel;
    DType dtype;
    uint64_t step = 0;
    bool pending = false;
  };
  Key* find(const sync::WorkId& id) {
    for (Key& k : keys_)
      if (k.id == id) return &k;
    return nullptr;
  }
  int rank_, world_;
  std::vector<Key> keys_;
};

}  // namespace gradex::fuzz
