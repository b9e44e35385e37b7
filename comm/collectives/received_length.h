// The check every collective makes on a completed receive whose length it knows in advance: a
// different length means the ranks disagree on the call's arguments (sizes, types, buffers), and
// the error says who received what from whom.
#pragma once

#include <cstddef>
#include <string>

#include "base/error.h"
#include "comm/communicator.h"

namespace gradex::comm {

// Throws MismatchError "<what>: rank <me> received <got> bytes<of> from rank <from>, expected
// <expected><why>" unless the receive brought exactly `expected` bytes. `of` names the piece
// (" of shard 3", or ""), `why` what a difference means (": the ranks disagree on ...", or "").
inline void expect_received(const Communicator& comm, const Request& request, size_t expected,
                            int from, const std::string& what, const std::string& of,
                            const std::string& why) {
  const size_t got = comm.recv_length(request);
  if (got == expected) return;
  throw MismatchError(what + ": rank " + std::to_string(comm.rank()) + " received " +
                      std::to_string(got) + " bytes" + of + " from rank " + std::to_string(from) +
                      ", expected " + std::to_string(expected) + why);
}

}  // namespace gradex::comm
