// The check every collective makes on a completed receive whose length it knows in advance: a
// different length means the ranks disagree on the call's arguments (sizes, types, buffers), and
// the error says who received what from whom.
#pragma once

#include <cstddef>
#include <string>

#include "base/error.h"
#include "comm/communicator.h"

namespace gradex::comm {

// The words around a length mismatch: "<what>: rank R received G bytes<of> from rank F, expected
// E<why>". `of` names the piece (" of shard 3", or ""), `why` what a difference means.
struct ReceivedText {
  std::string what, of, why;
};

// Throws MismatchError with text()'s words unless the receive brought exactly `expected` bytes.
// text() runs only on a mismatch, so a receive that matches builds no string.
template <typename Text>
void expect_received(const Communicator& comm, const Request& request, size_t expected, int from,
                     Text&& text) {
  const size_t got = comm.recv_length(request);
  if (got == expected) return;
  const ReceivedText t = text();
  throw MismatchError(t.what + ": rank " + std::to_string(comm.rank()) + " received " +
                      std::to_string(got) + " bytes" + t.of + " from rank " + std::to_string(from) +
                      ", expected " + std::to_string(expected) + t.why);
}

}  // namespace gradex::comm
