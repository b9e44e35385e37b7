// DiLoCo outer optimization (Douillard et al. 2023; Streaming DiLoCo 2025). Ranks train locally
// with any inner optimizer; every H steps each fragment's pseudo-gradient
// delta = theta_global - theta_local is averaged across ranks (block-quantized with error feedback,
// or exact fp32) and an outer SGD/Nesterov step is applied to theta_global, which is bit-identical
// on every rank; the local copy is then replaced by (or mixed with) the global one.
//
// Threading: the caller's thread calls step()/synchronize() and is the only one touching the
// tensors it registered; a background thread of this object runs the exchanges, on a communicator
// of its own (so it never competes with an Engine's thread for one). An exchange started at step
// t is merged at step t + delay: with delay >= 1 the caller waits only when the network is slower
// than `delay` inner steps. A failed exchange (dead or stalled peer) is reported by the next
// step()/synchronize() call and every later one (sticky), never by a hang.
//
// Every rank must register the same tensors in the same order and call step() equally often.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "comm/communicator.h"
#include "outer/outer_options.h"

namespace gradex::sync {
class ByteReader;
class ByteWriter;
}  // namespace gradex::sync

namespace gradex::outer {

class FragmentExchange;

struct OuterStats {
  uint64_t steps = 0;       // step() calls
  uint64_t syncs = 0;       // fragment exchanges merged
  uint64_t bytes_sent = 0;  // payloads of this object's communicator
  uint64_t bytes_received = 0;
  uint64_t dense_bytes = 0;  // what an fp32 ring allreduce of the same tensors would have sent
  uint64_t nonfinite = 0;    // non-finite pseudo-gradient values (sent as 0)
  uint64_t waits = 0;        // merges that had to wait for their exchange
  double communicate_seconds = 0;  // background thread, inside collectives
  double wait_seconds = 0;         // caller's thread, waiting for exchanges
};

class OuterOptimizer {
 public:
  // Collective: connects to every rank through `store` (a prefix of its own). `api_version`: the
  // version of the API driving it, part of the start-up agreement (capi/: GRADEX_API_VERSION).
  OuterOptimizer(config::Config config, std::shared_ptr<comm::Store> store, int rank,
                 int world_size, uint32_t api_version);
  ~OuterOptimizer();
  OuterOptimizer(const OuterOptimizer&) = delete;
  OuterOptimizer& operator=(const OuterOptimizer&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const OuterOptions& options() const { return options_; }
  const config::Config& config() const { return config_; }

  // Registers an fp32 tensor the caller owns (it must stay valid and at this address until
  // shutdown). Parameters (is_buffer false) get the outer optimization; buffers (BatchNorm
  // statistics) are replaced by their plain average at fragment 0's merges and at synchronize().
  // Only before start().
  void add_tensor(const std::string& key, float* data, uint64_t numel, bool is_buffer);
  // Collective: freezes the tensor set, splits it into fragments and copies rank 0's values into
  // every rank's tensors and global copy.
  void start();
  // Not collective (in place of start()): the global copies are this rank's own tensors as they
  // are now, and the step count is `step`. For a member joining peers that started already (it
  // then takes their state with load_shared_state()), or when the caller made every rank's
  // tensors and step identical (torchft: its own recovery does).
  void start_local(uint64_t step);
  // Inner steps ended by step(): the fragment schedule's clock (restored by the state loads).
  uint64_t step_count() const { return step_; }
  // Ends an inner step (after the inner optimizer's step). Merges exchanges due now, starts the
  // exchanges of fragments due now. Returns the number of fragments merged.
  int step();
  // Finishes every pending exchange and merges it, averages the buffers, and writes the global
  // copy into the parameters: every rank then holds the same model. Collective. Local progress
  // since each fragment's last exchange is dropped (synchronize_all keeps it).
  void synchronize();
  // Collective: the end of training (or any point where every rank must hold the same model)
  // without dropping local progress (outer_final_sync.cc). The exchanges in flight finish and their
  // global copies are installed, but each rank's inner steps since such an exchange started are
  // kept (as if its local copy had been rebased onto the new global copy); then one outer step runs
  // over every fragment with inner steps since its local copy was last taken or replaced, all at
  // once and with no delay, exactly as a regular exchange would (same codec, outer momentum and
  // rounds, so bit-identical on every rank); buffers are averaged; the parameters become the global
  // copy. Fragments without such steps (merged at this step with mixing 0, or whose exchange
  // started at this step) are not exchanged. Training may continue afterwards on the usual
  // schedule. Returns the number of fragments exchanged.
  int synchronize_all();

  // The global copy of a parameter as of its fragment's last merge (exchanges in flight are not
  // visible until merged).
  std::vector<float> global_of(const std::string& key) const;
  // The step at which each fragment last merged (0 = never), per fragment.
  std::vector<uint64_t> last_merge_steps() const;
  int64_t fragment_of(const std::string& key) const;
  OuterStats stats() const;

  // Global copies, momenta, residuals and the step count. Waits for pending exchanges first
  // (synchronize() semantics without touching the caller's tensors).
  std::vector<uint8_t> save_state();
  // Also on a failed object (to roll back to a state saved before an exchange that failed): the
  // exchanges in flight are then waited for (they fail within the timeout) and dropped; the
  // failure stays until a reconfiguration. Without a failure, exchanges in flight are an error.
  void load_state(const uint8_t* data, size_t size);

  // The outer state every member holds identically (outer_shared_state.cc): the step count, last
  // merges, and per fragment its round, global copy and outer momentum; no residuals (a rank's
  // own error feedback) and nothing that depends on rank or world size, so that a member of any
  // membership can load it. Versioned and checksummed. Refused with exchanges in flight or after
  // a failure (the state may be partly updated).
  std::vector<uint8_t> save_shared_state();
  // Replaces the shared state (checked against this job's settings and tensors; a corrupt or
  // mismatched blob changes nothing). This rank's contribution residuals are kept (a new
  // member's are zero); 4/8-bit owners' requantization residuals restart at zero.
  void load_shared_state(const uint8_t* data, size_t size);

  // Finishes pending exchanges (bounded by the timeout) and leaves; idempotent.
  void shutdown();

  // A new membership (torchft's quorum change), collective over the new members, every one of which
  // must be a member of the old one (this object's state is kept; a newcomer cannot join a started
  // DiLoCo object yet). Exchanges launched and not yet merged are dropped (fail with kAborted if
  // still running: within about 10 ms); the old communicator is torn down (old peers get the abort
  // notice); a new one bootstraps through `store` (a namespace without an earlier membership's
  // keys) and the start-up agreement runs again. Kept: the tensors, their fragments and schedule,
  // the step count and last merges, global copies, outer momenta, contribution residuals
  // (FragmentExchange::set_membership). A failure of the old membership is cleared on success.
  void reconfigure(std::shared_ptr<comm::Store> store, int rank, int world_size);

 private:
  struct Tensor {
    std::string key;
    float* data;
    uint64_t numel;
    bool is_buffer;
    int64_t fragment = 0;
    uint64_t offset = 0;  // in its fragment's (or the buffers') flat vector
  };
  struct Job;

  // The tensor list both state formats carry (count, then key, numel and kind of each), so that a
  // state is never loaded into a job with other tensors; `what` names the format in errors.
  void write_tensor_list(sync::ByteWriter& w) const;
  void check_tensor_list(sync::ByteReader& r, const std::string& what) const;
  void begin(bool from_rank0);
  void drop_pending_after_failure();
  void require_started(const char* what) const;
  void check_failed();
  void launch(int64_t fragment, bool with_buffers);
  // This rank's values of a fragment's parameters, flat (its local copy).
  std::vector<float> local_of(int64_t fragment) const;
  // Waits for a job; throws its failure.
  void wait_for(const std::shared_ptr<Job>& job);
  void finish(const std::shared_ptr<Job>& job);
  void merge(const Job& job);
  void run_worker();
  void run_job(Job& job);

  config::Config config_;
  OuterOptions options_;
  int rank_;
  int world_;
  uint32_t api_version_;  // for the start-up agreement of every membership
  std::unique_ptr<comm::Communicator> comm_;
  std::vector<Tensor> tensors_;
  std::vector<Tensor*> buffers_;
  std::vector<std::unique_ptr<FragmentExchange>> fragments_;
  uint64_t buffer_numel_ = 0;
  uint64_t bytes_at_start_[2] = {0, 0};  // communicator counters after start()'s broadcast
  bool started_ = false;
  bool stopped_ = false;
  uint64_t step_ = 0;
  std::vector<uint64_t> last_merge_;
  std::deque<std::shared_ptr<Job>> pending_;  // launched, not merged; in launch order

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // for the worker
  bool quit_ = false;
  ErrorCode failed_code_ = ErrorCode::kOk;
  std::string failed_message_;
  OuterStats stats_;
  std::thread worker_;
};

}  // namespace gradex::outer
