#include "sync/negotiator.h"

#include <algorithm>
#include <set>

#include "comm/collectives.h"
#include "sync/byte_io.h"

namespace gradex::sync {
namespace {

constexpr uint8_t kVersion = 2;
constexpr uint8_t kFlagLeaving = 1;
constexpr uint8_t kItemNonFinite = 1;

std::string kind_name(WorkKind k) {
  return k == WorkKind::kGradient ? "tensor" : "parameter";
}

}  // namespace

Negotiator::Negotiator(comm::Communicator& comm, std::chrono::milliseconds timeout)
    : comm_(comm), timeout_(timeout) {}

std::vector<uint8_t> Negotiator::encode(const std::vector<Announcement>& announcements,
                                        bool leaving) {
  ByteWriter w;
  w.put<uint8_t>(kVersion);
  w.put<uint8_t>(leaving ? kFlagLeaving : 0);
  w.put<uint32_t>(static_cast<uint32_t>(announcements.size()));
  for (const auto& a : announcements) {
    w.put<uint8_t>(static_cast<uint8_t>(a.id.kind));
    w.put<uint8_t>(static_cast<uint8_t>(a.dtype));
    w.put<uint8_t>(a.nonfinite ? kItemNonFinite : 0);
    w.put<uint64_t>(a.numel);
    w.put<uint64_t>(a.step);
    w.put_string(a.id.key);
  }
  // Rank 0 alone decides which partially announced keys have waited too long.
  std::vector<WorkId> aborts;
  if (comm_.rank() == 0) {
    auto now = std::chrono::steady_clock::now();
    for (const auto& [id, entry] : table_)
      if (now - entry.first_seen > timeout_) aborts.push_back(id);
  }
  w.put<uint32_t>(static_cast<uint32_t>(aborts.size()));
  for (const auto& id : aborts) {
    w.put<uint8_t>(static_cast<uint8_t>(id.kind));
    w.put_string(id.key);
  }
  return std::move(w.bytes());
}

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

void Negotiator::apply(int from, const uint8_t* data, size_t size, RoundResult& result,
                       std::vector<WorkId>& touched, int& leaving_count) {
  ByteReader r(data, size, "negotiation message from rank " + std::to_string(from));
  uint8_t version = r.get<uint8_t>();
  if (version != kVersion)
    throw CorruptPayload("negotiation message from rank " + std::to_string(from) + " has version " +
                         std::to_string(version) + ", expected " + std::to_string(kVersion) +
                         " (mixed gradex versions?)");
  uint8_t flags = r.get<uint8_t>();
  if (flags & kFlagLeaving) ++leaving_count;
  uint32_t n = r.get<uint32_t>();
  const int world = comm_.size();
  for (uint32_t i = 0; i < n; ++i) {
    auto kind = static_cast<WorkKind>(r.get<uint8_t>());
    uint8_t dtype = r.get<uint8_t>();
    uint8_t item_flags = r.get<uint8_t>();
    uint64_t numel = r.get<uint64_t>();
    uint64_t step = r.get<uint64_t>();
    std::string key = r.get_string();
    if (kind != WorkKind::kGradient && kind != WorkKind::kAverage)
      throw CorruptPayload("negotiation message from rank " + std::to_string(from) +
                           " has an unknown work kind");
    if ((item_flags & ~kItemNonFinite) != 0)
      throw CorruptPayload("negotiation message from rank " + std::to_string(from) +
                           " has unknown announcement flags " + std::to_string(item_flags));
    if (!dtype_valid(dtype))
      throw CorruptPayload("negotiation message from rank " + std::to_string(from) +
                           " has an unknown dtype " + std::to_string(dtype));
    WorkId id{kind, std::move(key)};
    auto [it, inserted] = table_.try_emplace(id);
    Entry& e = it->second;
    if (inserted) {
      e.numel.assign(world, -1);
      e.dtype.assign(world, -1);
      e.step.assign(world, 0);
      e.flags.assign(world, 0);
      e.first_seen = std::chrono::steady_clock::now();
    }
    e.numel[from] = static_cast<int64_t>(numel);
    e.dtype[from] = dtype;
    e.step[from] = step;
    e.flags[from] = item_flags;
    touched.push_back(id);
    result.anything_happened = true;
  }
  uint32_t aborts = r.get<uint32_t>();
  if (aborts > 0 && from != 0)
    throw CorruptPayload("negotiation message from rank " + std::to_string(from) +
                         " carries aborts; only rank 0 may send them");
  for (uint32_t i = 0; i < aborts; ++i) {
    auto kind = static_cast<WorkKind>(r.get<uint8_t>());
    WorkId id{kind, r.get_string()};
    auto it = table_.find(id);
    if (it == table_.end()) continue;  // completed in this very round
    result.failed.push_back({id, ErrorCode::kTimeout,
                             kind_name(kind) + " '" + id.key + "' was submitted by ranks " +
                                 describe_ranks(it->second, true) + " but not by ranks " +
                                 describe_ranks(it->second, false) + " within " +
                                 std::to_string(timeout_.count() / 1000.0).substr(0, 6) +
                                 " s (GRADEX_TIMEOUT_S)"});
    table_.erase(it);
    result.anything_happened = true;
  }
  r.expect_end();
}

std::chrono::steady_clock::time_point Negotiator::next_decision() const {
  using TimePoint = std::chrono::steady_clock::time_point;
  if (comm_.rank() != 0 || table_.empty()) return TimePoint::max();
  TimePoint oldest = TimePoint::max(), oldest_live = TimePoint::max();
  for (const auto& [id, e] : table_) {
    oldest = std::min(oldest, e.first_seen);
    if (!e.mismatched) oldest_live = std::min(oldest_live, e.first_seen);
  }
  // encode() aborts a key once strictly more than the timeout has passed.
  TimePoint t = oldest + timeout_ + std::chrono::milliseconds(1);
  if (stall_ && oldest_live != TimePoint::max()) t = std::min(t, stall_->next_due(oldest_live));
  return t;
}

RoundResult Negotiator::round(const std::vector<Announcement>& announcements, bool leaving) {
  std::vector<uint8_t> mine = encode(announcements, leaving);
  control_bytes_ += mine.size() * static_cast<uint64_t>(std::max(0, comm_.size() - 1));
  std::vector<comm::Bytes> all = comm::allgatherv(comm_, mine.data(), mine.size());

  RoundResult result;
  std::vector<WorkId> touched;
  int leaving_count = 0;
  // Aborts are in rank 0's message, which is applied first; announcements of the same round that
  // complete an aborted key therefore start a fresh entry (and time out again if still incomplete).
  for (int r = 0; r < comm_.size(); ++r)
    apply(r, all[r].data(), all[r].size(), result, touched, leaving_count);
  result.all_leaving = leaving_count == comm_.size();

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
    if (!consistent || e.mismatched) {
      it->second.mismatched = true;
      result.failed.push_back({id, ErrorCode::kMismatch,
                               kind_name(id.kind) + " '" + id.key + "' differs across ranks (" +
                                   describe_sizes(e) + ")"});
      if (complete) table_.erase(it);
    } else if (complete) {
      ReadyWork w{id};
      w.step = *std::max_element(e.step.begin(), e.step.end());
      for (int r = 0; r < comm_.size(); ++r) {
        w.steps_differed |= e.step[r] != w.step;
        if (e.flags[r] & kItemNonFinite) w.nonfinite_ranks.push_back(r);
      }
      result.ready.push_back(std::move(w));
      table_.erase(it);
    }
  }
  // The stall inspector (sync/stall_inspector.h) reads the table on rank 0, whose clock decides.
  if (stall_ && comm_.rank() == 0 && !table_.empty()) {
    auto now = std::chrono::steady_clock::now();
    auto oldest = now;
    for (const auto& [id, e] : table_)
      if (!e.mismatched && e.first_seen < oldest) oldest = e.first_seen;
    if (stall_->due(oldest, now)) {
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
  }
  return result;
}

}  // namespace gradex::sync
