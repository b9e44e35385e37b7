// A Communicator over a subset of another's ranks (a host's ranks, or one rank per host), so that
// the flat collectives (allreduce_sum, allgatherv) run unchanged inside the hierarchical ones.
// Messages travel on the parent's endpoints; errors name the parent's ranks (requests are the
// parent's). Every collective run on a group takes its tag from `tags` in order: the caller takes
// those tags from the parent on every rank alike (members or not), so that the parent's tag
// sequence stays in step across ranks.
#pragma once

#include <vector>

#include "comm/communicator.h"

namespace gradex::comm {

class GroupCommunicator final : public Communicator {
 public:
  // `ranks`: the parent's ranks of the group in group order (this rank among them).
  GroupCommunicator(Communicator& parent, std::vector<int> ranks, std::vector<uint64_t> tags);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const CommOptions& options() const override { return parent_.options(); }
  RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  bool receives_any_length() const override { return parent_.receives_any_length(); }
  RequestPtr irecv_any_length(int peer, uint64_t tag, Bytes& out, size_t max_bytes) override {
    return parent_.irecv_any_length(parent_rank(peer), tag, out, max_bytes);
  }
  bool progress() override { return parent_.progress(); }
  // Every member's connections are the parent's (a member's lanes reach it over them).
  int connections_per_peer() const override { return parent_.connections_per_peer(); }
  bool test(Request& request, const char* operation) override {
    return parent_.test(request, operation);
  }
  void wait_all(std::vector<RequestPtr>& requests, const char* operation) override {
    parent_.wait_all(requests, operation);
  }
  size_t recv_length(const Request& request) const override { return parent_.recv_length(request); }
  // The next of the tags given at construction (InternalError when they are used up).
  uint64_t next_collective_tag() override;
  void abort(ErrorCode code, const std::string& message) override { parent_.abort(code, message); }
  uint64_t bytes_sent() const override { return parent_.bytes_sent(); }
  uint64_t bytes_received() const override { return parent_.bytes_received(); }

 private:
  int parent_rank(int peer) const;

  Communicator& parent_;
  std::vector<int> ranks_;
  std::vector<uint64_t> tags_;
  size_t next_tag_ = 0;
  int rank_ = -1;
};

}  // namespace gradex::comm
