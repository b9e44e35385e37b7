#include "sync/negotiation/negotiator.h"

#include <algorithm>

#include "comm/collectives.h"

namespace gradex::sync {
namespace {

std::string kind_name(WorkKind k) {
  return k == WorkKind::kGradient ? "tensor" : "parameter";
}

}  // namespace

Negotiator::Negotiator(comm::Communicator& comm, std::chrono::milliseconds timeout,
                       size_t cache_capacity)
    : comm_(comm), timeout_(timeout), cache_(cache_capacity) {}

std::string Negotiator::describe_ranks(const Entry& e, bool announced) const {
  std::string s;
  for (size_t r = 0; r < e.numel.size(); ++r) {
    if ((e.numel[r] >= 0) != announced) continue;
    s += s.empty() ? "" : ", ";
    s += std::to_string(r);
  }
  return "[" + s + "]";
}

std::string Negotiator::describe_sizes(const Entry& e) const {
  std::string s;
  for (size_t r = 0; r < e.numel.size(); ++r) {
    if (e.numel[r] < 0) continue;
    s += s.empty() ? "" : ", ";
    s += "rank " + std::to_string(r) + ": " + std::to_string(e.numel[r]) + " x " +
         dtype_name(static_cast<DType>(e.dtype[r]));
  }
  return s;
}

bool Negotiator::anchors_disagree(const Entry& e) const {
  int first = -1;
  for (size_t r = 0; r < e.numel.size(); ++r) {
    if (e.numel[r] < 0) continue;
    const int has = e.step[r] != 0 ? 1 : 0;
    if (first < 0) first = has;
    if (has != first) return true;
  }
  return false;
}

std::string Negotiator::describe_anchors(const Entry& e) const {
  std::string with, without;
  for (size_t r = 0; r < e.numel.size(); ++r) {
    if (e.numel[r] < 0) continue;
    std::string& s = e.step[r] != 0 ? with : without;
    s += (s.empty() ? "" : ", ") + std::to_string(r);
  }
  return "ranks [" + with + "] hold a LocalSGD anchor (they averaged before), ranks [" + without +
         "] do not";
}

void Negotiator::apply(int from, const NegotiationMessage& m, RoundResult& result,
                       std::vector<WorkId>& touched) {
  const int world = comm_.size();
  for (const Announcement& a : m.announcements) {
    // Rank 0 aborted this key in this very round (its message is applied first): the abort
    // answers this announcement's handle too, on the announcing rank, so no entry may stay.
    if (std::find(aborted_this_round_.begin(), aborted_this_round_.end(), a.id) !=
        aborted_this_round_.end())
      continue;
    auto [it, inserted] = table_.try_emplace(a.id);
    Entry& e = it->second;
    if (inserted) {
      e.numel.assign(world, -1);
      e.dtype.assign(world, -1);
      e.step.assign(world, 0);
      e.nonfinite.assign(world, 0);
      e.first_seen = std::chrono::steady_clock::now();
    }
    e.numel[from] = static_cast<int64_t>(a.numel);
    e.dtype[from] = static_cast<int>(a.dtype);
    e.step[from] = a.step;
    e.nonfinite[from] = a.nonfinite ? 1 : 0;
    touched.push_back(a.id);
    result.anything_happened = true;
  }
  for (const WorkId& id : m.aborts) {
    auto it = table_.find(id);
    if (it == table_.end()) continue;  // completed in this very round
    result.failed.push_back({id, ErrorCode::kTimeout,
                             kind_name(id.kind) + " '" + id.key + "' was submitted by ranks " +
                                 describe_ranks(it->second, true) + " but not by ranks " +
                                 describe_ranks(it->second, false) + " within " +
                                 std::to_string(timeout_.count() / 1000.0).substr(0, 6) +
                                 " s (GRADEX_TIMEOUT_S)"});
    table_.erase(it);
    result.anything_happened = true;
  }
}

bool Negotiator::own_announcement_pending() const {
  const auto me = static_cast<size_t>(comm_.rank());
  for (const auto& [id, e] : table_)
    if (!e.mismatched && e.numel[me] >= 0) return true;
  return false;
}

std::chrono::steady_clock::time_point Negotiator::next_decision() const {
  using TimePoint = std::chrono::steady_clock::time_point;
  if (comm_.rank() != 0 || table_.empty()) return TimePoint::max();
  TimePoint oldest = TimePoint::max(), oldest_live = TimePoint::max();
  for (const auto& [id, e] : table_) {
    oldest = std::min(oldest, e.first_seen);
    if (!e.mismatched) oldest_live = std::min(oldest_live, e.first_seen);
  }
  // round() aborts a key once strictly more than the timeout has passed.
  TimePoint t = oldest + timeout_ + std::chrono::milliseconds(1);
  if (stall_ && oldest_live != TimePoint::max()) t = std::min(t, stall_->next_due(oldest_live));
  return t;
}

RoundResult Negotiator::round(const std::vector<Announcement>& announcements, bool leaving) {
  // Rank 0 alone decides which partially announced keys have waited too long.
  std::vector<WorkId> aborts;
  if (comm_.rank() == 0) {
    auto now = std::chrono::steady_clock::now();
    for (const auto& [id, entry] : table_)
      if (now - entry.first_seen > timeout_) aborts.push_back(id);
  }
  std::vector<uint8_t> mine = encode_negotiation(announcements, leaving, aborts, cache_);
  control_bytes_ += mine.size() * static_cast<uint64_t>(std::max(0, comm_.size() - 1));
  // One round trip: a round's message (~33 bytes in steady state) travels inline with its size.
  comm::AllgathervOptions gather;
  gather.inline_max_bytes = comm_.options().allgather_inline_bytes;
  std::vector<comm::Bytes> all;
  comm::allgatherv_inline(comm_, mine.data(), mine.size(), all, gather, "negotiation");

  // Every message is decoded against the cache as it was when the round began (as it was encoded),
  // and before anything changes: a malformed message leaves the table and the cache untouched.
  std::vector<NegotiationMessage> messages;
  messages.reserve(all.size());
  for (int r = 0; r < comm_.size(); ++r)
    messages.push_back(decode_negotiation(r, all[r].data(), all[r].size(), cache_));

  RoundResult result;
  std::vector<WorkId> touched;
  aborted_this_round_ = messages[0].aborts;
  int leaving_count = 0;
  // Aborts are in rank 0's message, which is applied first; announcements of an aborted key in the
  // same round are answered by the abort (apply() skips them): a rank whose first announcement
  // races rank 0's abort fails with the others instead of keeping an entry nobody completes.
  for (int r = 0; r < comm_.size(); ++r) {
    apply(r, messages[r], result, touched);
    if (messages[r].leaving) ++leaving_count;
  }
  result.all_leaving = leaving_count == comm_.size();
  std::vector<CachedKey> ready;
  decide(touched, result, ready);
  // The cache changes from this round's verdicts alone, identically everywhere: failed keys leave
  // it first, then ready keys enter (or record their agreed step) in (kind, key) order.
  for (const NegotiationFailure& f : result.failed)
    cache_.evict(f.id);
  for (const CachedKey& k : ready)
    cache_.ready(k.id, k.numel, k.dtype, k.last_step);
  inspect_stalls();
  return result;
}

void Negotiator::decide(const std::vector<WorkId>& ids, RoundResult& result,
                        std::vector<CachedKey>& ready) {
  std::vector<WorkId> touched = ids;
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (const WorkId& id : touched) {
    auto it = table_.find(id);
    if (it == table_.end()) continue;
    const Entry& e = it->second;
    bool complete = true, consistent = true;
    int64_t first_numel = -1;
    int first_dtype = -1;
    for (int r = 0; r < comm_.size(); ++r) {
      if (e.numel[r] < 0) {
        complete = false;
        continue;
      }
      if (first_numel < 0) {
        first_numel = e.numel[r];
        first_dtype = e.dtype[r];
      } else if (e.numel[r] != first_numel || e.dtype[r] != first_dtype) {
        consistent = false;
      }
    }
    // A parameter average's counter is its rank's LocalSGD anchor presence (sync/engine/engine.cc):
    // ranks with and without one would sum full parameters with deltas.
    const bool anchors_differ =
        id.kind == WorkKind::kAverage && consistent && !e.mismatched && anchors_disagree(e);
    if (anchors_differ) {
      it->second.mismatched = true;
      result.failed.push_back({id, ErrorCode::kMismatch,
                               kind_name(id.kind) + " '" + id.key +
                                   "' differs across ranks: " + describe_anchors(e) +
                                   " (restored from checkpoints of different steps?)"});
      if (complete) table_.erase(it);
    } else if (!consistent || e.mismatched) {
      it->second.mismatched = true;
      result.failed.push_back({id, ErrorCode::kMismatch,
                               kind_name(id.kind) + " '" + id.key + "' differs across ranks (" +
                                   describe_sizes(e) + ")"});
      if (complete) table_.erase(it);
    } else if (complete) {
      ReadyWork w;
      w.id = id;
      w.step = *std::max_element(e.step.begin(), e.step.end());
      for (int r = 0; r < comm_.size(); ++r) {
        w.steps_differed |= e.step[r] != w.step;
        if (e.nonfinite[r]) w.nonfinite_ranks.push_back(r);
      }
      ready.push_back(
          {id, static_cast<uint64_t>(first_numel), static_cast<DType>(first_dtype), w.step});
      result.ready.push_back(std::move(w));
      table_.erase(it);
    }
  }
}

void Negotiator::inspect_stalls() {
  // The stall inspector (sync/engine/stall_inspector.h) reads the table on rank 0, whose clock
  // decides.
  if (!stall_ || comm_.rank() != 0 || table_.empty()) return;
  auto now = std::chrono::steady_clock::now();
  auto oldest = now;
  for (const auto& [id, e] : table_)
    if (!e.mismatched && e.first_seen < oldest) oldest = e.first_seen;
  if (!stall_->due(oldest, now)) return;
  std::vector<StallKey> pending;
  for (const auto& [id, e] : table_) {
    if (e.mismatched) continue;
    std::vector<bool> announced(e.numel.size());
    for (size_t r = 0; r < announced.size(); ++r)
      announced[r] = e.numel[r] >= 0;
    pending.push_back({kind_name(id.kind) + " '" + id.key + "'", announced, e.first_seen});
  }
  stall_->inspect(pending, now);
}

}  // namespace gradex::sync
