// A Communicator for fuzzing and seed generation: this process is one rank and the other ranks are
// scripts. Sends complete at once (their bytes are kept in `sent`); a receive from peer q takes
// q's next scripted message. It models no network: it lets a fuzzer put arbitrary bytes where a
// peer's message would arrive, through the public collectives, without UCX.
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "base/error.h"
#include "comm/communicator.h"

namespace gradex::fuzz {

class ScriptedComm : public comm::Communicator {
 public:
  ScriptedComm(int rank, int size) : rank_(rank), size_(size), inbox_(static_cast<size_t>(size)) {
    options_.timeout = comm::Millis(1000);
  }
  // Queues the messages an allgatherv contribution of `payload` from `peer` consists of, framed as
  // the one-round allgatherv_inline expects (comm/collectives.h): its 8-byte size followed by the
  // payload in one message when it fits options().allgather_inline_bytes, else the size alone and
  // the payload as a second message. The fuzzer's bytes thus reach the parser behind the framing.
  void script_allgatherv(int peer, const std::vector<uint8_t>& payload) {
    uint64_t n = payload.size();
    std::vector<uint8_t> first(8);
    std::memcpy(first.data(), &n, 8);
    auto& q = inbox_[static_cast<size_t>(peer)];
    if (payload.size() <= options_.allgather_inline_bytes) {
      first.insert(first.end(), payload.begin(), payload.end());
      q.push_back(first);
      return;
    }
    q.push_back(first);
    q.push_back(payload);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const comm::CommOptions& options() const override { return options_; }

  comm::RequestPtr isend(int peer, uint64_t, const void* data, size_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(data);
    sent.emplace_back(p, p + bytes);
    return std::make_unique<Req>(peer, 0);
  }
  comm::RequestPtr irecv(int peer, uint64_t, void* data, size_t bytes) override {
    auto& q = inbox_[static_cast<size_t>(peer)];
    if (q.empty()) throw TimeoutError("scripted receive", peer, "the script has no more messages");
    std::vector<uint8_t> m = std::move(q.front());
    q.pop_front();
    if (m.size() > bytes) throw PeerError("scripted receive", peer, "message longer than buffer");
    if (!m.empty()) std::memcpy(data, m.data(), m.size());
    return std::make_unique<Req>(peer, m.size());
  }
  bool progress() override { return false; }
  bool test(comm::Request&, const char*) override { return true; }
  void wait_all(std::vector<comm::RequestPtr>&, const char*) override {}
  size_t recv_length(const comm::Request& r) const override {
    return static_cast<const Req&>(r).length;
  }
  uint64_t next_collective_tag() override { return ++seq_ << 16; }
  uint64_t bytes_sent() const override { return 0; }
  uint64_t bytes_received() const override { return 0; }

  std::vector<std::vector<uint8_t>> sent;

 private:
  struct Req : comm::Request {
    Req(int p, size_t n) : peer_(p), length(n) {}
    int peer() const override { return peer_; }
    int peer_;
    size_t length;
  };
  int rank_, size_;
  comm::CommOptions options_;
  std::vector<std::deque<std::vector<uint8_t>>> inbox_;
  uint64_t seq_ = 0;
};

}  // namespace gradex::fuzz
