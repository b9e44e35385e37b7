#include "comm/collectives/allgatherv_prologue.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "base/check.h"
#include "base/error.h"

namespace gradex::comm::detail {

void throw_length_mismatch(const char* operation, const Communicator& comm, const char* what,
                           int peer, size_t received, size_t expected) {
  const int r = comm.rank();
  throw MismatchError(std::string(operation) + ": rank " + std::to_string(r) + " received " +
                      std::to_string(received) + " bytes of " + what + " from rank " +
                      std::to_string(peer) + ", expected " + std::to_string(expected) + ": ranks " +
                      std::to_string(peer) + " and " + std::to_string(r) +
                      " are not in the same collective");
}

uint64_t physical_memory_bytes() {
  static const uint64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page = ::sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return uint64_t{1} << 40;  // unknown: 1 TiB
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  }();
  return bytes;
}

void check_announced_sizes(const char* operation, const std::vector<uint64_t>& sizes) {
  // Sizes come from peers: bounded before the caller allocates anything for them. No payload set
  // larger than this host's memory can be legitimate.
  const uint64_t limit = physical_memory_bytes();
  uint64_t total = 0;
  for (size_t q = 0; q < sizes.size(); ++q) {
    const uint64_t s = sizes[q];
    if (s > limit - std::min(limit, total))
      throw CorruptPayload(std::string(operation) + ": rank " + std::to_string(q) +
                           " announced a payload of " + std::to_string(s) + " bytes; with the " +
                           std::to_string(total) + " bytes of the ranks before it that exceeds " +
                           "this host's memory (" + std::to_string(limit) + " bytes)");
    total += s;
  }
}

bool take_own_slot(Communicator& comm, const void* data, size_t bytes, std::vector<Bytes>& result,
                   uint64_t* tag) {
  GX_CHECK(data != nullptr || bytes == 0);
  result.resize(static_cast<size_t>(comm.size()));
  const auto* p = static_cast<const uint8_t*>(data);
  result[static_cast<size_t>(comm.rank())].assign(p, p + bytes);
  if (comm.size() == 1) return false;
  *tag = comm.next_collective_tag();
  return true;
}

bool allgatherv_prologue(Communicator& comm, const char* operation, const char* sizes_operation,
                         const void* data, size_t bytes, std::vector<Bytes>& result,
                         std::vector<uint64_t>& sizes, uint64_t* tag) {
  if (!take_own_slot(comm, data, bytes, result, tag)) return false;
  const int P = comm.size();
  const int r = comm.rank();

  // Sizes as uint64 values in host order (all ranks run the same build).
  sizes.assign(static_cast<size_t>(P), 0);
  sizes[static_cast<size_t>(r)] = bytes;
  const uint64_t mine = bytes;
  // Requests at 2q (receive from q) and 2q + 1 (send to q).
  std::vector<RequestPtr> requests(2 * static_cast<size_t>(P));
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    const size_t i = 2 * static_cast<size_t>(q);
    requests[i] = comm.irecv(q, *tag, &sizes[static_cast<size_t>(q)], sizeof(uint64_t));
    requests[i + 1] = comm.isend(q, *tag, &mine, sizeof(uint64_t));
  }
  comm.wait_all(requests, sizes_operation);
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    const size_t got = comm.recv_length(*requests[2 * static_cast<size_t>(q)]);
    if (got != sizeof(uint64_t))
      throw_length_mismatch(operation, comm, "size", q, got, sizeof(uint64_t));
  }
  check_announced_sizes(operation, sizes);
  return true;
}

void two_round_allgatherv(Communicator& comm, const char* operation, const char* sizes_operation,
                          const void* data, size_t bytes, std::vector<Bytes>& result,
                          PayloadPhase payloads) {
  const int r = comm.rank();
  thread_local std::vector<uint64_t> sizes;
  uint64_t tag = 0;
  if (!allgatherv_prologue(comm, operation, sizes_operation, data, bytes, result, sizes, &tag))
    return;
  for (size_t q = 0; q < sizes.size(); ++q)
    if (q != static_cast<size_t>(r)) result[q].resize(sizes[q]);
  payloads(comm, operation, tag + 1, data, sizes, result);
}

}  // namespace gradex::comm::detail
