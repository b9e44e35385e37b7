// One fragment's share of DiLoCo: its global copy, outer momentum and codecs, and the exchange
// that turns every rank's local copy into the next global copy.
//
// bits = 32: ranks contribute theta_local exactly; the owner averages it (rank-order fp32 sum / P)
// and everyone receives the exact average; delta = theta_global - average. The update is written
// as theta_global' = average + (delta - lr * u), which equals theta_global - lr * u and is exactly
// the plain average when lr = 1 and momentum = 0 (u = delta, so the bracket is 0).
// bits = 4/8: ranks contribute delta, quantized with error feedback; owners requantize the average
// with error feedback of their own (so the allgather also moves 4/8-bit codes); everyone decodes
// the same codes, so the averaged delta and the updated global copy are bit-identical everywhere.
// topk: ranks contribute delta; each sends the top-k of (its residual + delta) with error feedback
// (TopkCodec) through a ring allgather of variable-length payloads; every rank sums all P payloads
// in rank order 0..P-1 in fp32 (from 0) and divides by P, so the averaged delta and the updated
// global copy are bit-identical everywhere (and equal a dense fp32 average when density is 1).
// Outer step: m = momentum * m + delta; u = nesterov ? delta + momentum * m : m.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/collectives.h"
#include "outer/outer_options.h"
#include "sync/data/byte_io.h"

namespace gradex::outer {

class TopkCodec;

class FragmentExchange {
 public:
  FragmentExchange(const OuterOptions& options, int64_t index, uint64_t numel, int rank,
                   int world_size);
  ~FragmentExchange();

  uint64_t numel() const { return global_.size(); }
  // The committed global copy: what the last merge installed. The caller's thread reads it at any
  // time while the worker computes the next one into a separate buffer.
  const std::vector<float>& global() const { return global_; }
  std::vector<float>& global() { return global_; }
  // Installs the global copy computed by the last exchange (caller's thread, at the merge).
  void commit() { global_.swap(next_); }

  // What this rank contributes given its local copy (flat, numel()): theta_local or delta.
  std::vector<float> contribution(const std::vector<float>& local) const;
  // The same for a local copy rebased onto the committed global copy (synchronize_all, after the
  // exchange that started when the local copy was `at_launch` has been committed): this rank's
  // inner steps since then, now - at_launch, on top of global(). bits = 32: global + (now -
  // at_launch); otherwise delta = global - rebased = at_launch - now.
  std::vector<float> rebased_contribution(const std::vector<float>& now,
                                          const std::vector<float>& at_launch) const;
  // Collective (all ranks, same fragment): averages the contributions and applies the outer step,
  // writing the next global copy for commit(). Returns the non-finite values met while encoding.
  uint64_t exchange(comm::Communicator& comm, std::vector<float>& contribution);
  uint64_t rounds() const { return round_; }
  // A new membership (OuterOptimizer::reconfigure): the global copy, the outer momentum and this
  // rank's contribution residuals (quantization, top-k) are kept; 4/8-bit owners' requantization
  // residuals restart at zero (the segment a rank owns depends on rank and world size).
  void set_membership(int rank, int world_size);

  void save(sync::ByteWriter& w) const;
  void load(sync::ByteReader& r);

  // The part every member holds identically (OuterOptimizer::save_shared_state).
  const std::vector<float>& momentum() const { return momentum_; }
  // Installs a member's round, global copy and outer momentum (sizes equal numel()); this rank's
  // contribution residual is kept, a 4/8-bit owner's requantization residual restarts at zero.
  void set_shared(uint64_t round, std::vector<float> global, std::vector<float> momentum);

 private:
  void outer_step(const float* average_or_delta);
  // The 4/8-bit codecs of (rank, world size); the contribution residual is `residual` when given.
  void make_quant_codecs(int rank, int world_size, std::vector<float>* residual);
  uint64_t exchange_topk(comm::Communicator& comm, const std::vector<float>& delta);

  OuterOptions options_;
  int64_t index_;
  int world_;
  std::vector<float> global_;
  std::vector<float> next_;  // written by exchange(), installed by commit()
  std::vector<float> momentum_;
  std::unique_ptr<comm::ChunkCodec> contribution_codec_;
  std::unique_ptr<comm::ChunkCodec> result_codec_;
  std::unique_ptr<TopkCodec> topk_;  // topk only (then the two codecs above are null)
  std::vector<float> sum_;           // topk: the rank-order sum of the decoded payloads
  uint64_t round_ = 0;
};

}  // namespace gradex::outer
