// libFuzzer target for negotiation messages (format 3, sync/negotiation/negotiator.h). The input
// reaches the parser through the narrowest public function, Negotiator::round(), with rank 0's
// contribution to each round's allgatherv taken from the input (rank 0's messages may carry
// aborts). This process is rank 1 of 2 and runs the shared script (tests/fuzz/negotiate_script.h):
// it announces its keys again after every verdict, so its cache fills and later rounds go as bits,
// which rank 0's messages may then refer to by cache id. Input: a sequence of [u16 little-endian
// length][message] chunks, one per round. Every round must either complete or fail with
// CorruptPayload (a malformed message); anything else (a crash, a sanitizer report, another
// exception) is a bug. Verdicts must be well-formed: a ready key this rank owns was announced by
// it, ranks are in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "sync/negotiation/negotiator.h"
#include "tests/fuzz/negotiate_script.h"
#include "tests/fuzz/scripted_comm.h"

using namespace gradex;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::ScriptedComm comm(1, 2);
  // A small cache, so that a long input can also fill it.
  sync::Negotiator negotiator(comm, std::chrono::milliseconds(1000), /*cache_capacity=*/8);
  fuzz::NegotiateScript me(1, 2);
  size_t at = 0;
  for (int round = 0; round < 32 && at + 2 <= size; ++round) {
    size_t n = data[at] | (size_t{data[at + 1]} << 8);
    at += 2;
    if (n > size - at) n = size - at;
    comm.script_allgatherv(0, std::vector<uint8_t>(data + at, data + at + n));
    at += n;
    try {
      me.verdicts(negotiator.round(me.next(round), false));
    } catch (const CorruptPayload&) {
      return 0;  // a malformed message is rejected: the engine fails the job cleanly
    }
    if (negotiator.cached_keys() > 8) std::abort();
  }
  return 0;
}
