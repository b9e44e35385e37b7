// libFuzzer target for the TCP store's server protocol (comm/rendezvous/tcp_store_core.h),
// socket-free: the input is a stream of bytes from three clients. Byte 0: bit 0 gives the store a
// job secret, bit 1 lets client 0 skip authentication (so authenticated requests are explored with
// a secret too: the fuzzer cannot forge HMACs). Then chunks [u8 client][u16 little-endian
// length][bytes], with client 255 meaning "time passes" (tick). After every chunk each client's
// output must be a sequence of well-formed frames (valid header, payload present); it is then
// consumed, as if sent. A crash, a sanitizer report or an escaping exception is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "base/log.h"
#include "comm/rendezvous/tcp_store_core.h"

using namespace gradex;
using namespace gradex::comm;

namespace {

void check_and_flush(StoreServerCore& core, StoreClient& c) {
  size_t at = 0;
  while (at < c.out.size()) {
    if (c.out.size() - at < store_wire::kHeaderBytes) std::abort();
    store_wire::Header h = store_wire::decode_header(c.out.data() + at);
    if (!store_wire::check_header(h).empty()) std::abort();
    if (c.out.size() - at - store_wire::kHeaderBytes < h.length) std::abort();
    at += store_wire::kHeaderBytes + h.length;
  }
  c.out.clear();
  c.out_sent = 0;
  if (!c.closing) core.flushed(c);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log::set_level(log::Level::kError);  // refusals are logged as warnings: keep the output readable
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  StoreServerCore core((mode & 1) ? "fuzz-secret" : "");
  auto start = Clock::now();
  auto now = start;
  for (int i = 0; i < 3; ++i)
    core.add_client(Fd(), "client" + std::to_string(i), now);
  if (mode & 2) core.clients()[0]->auth = StoreClient::Auth::kAuthenticated;
  size_t at = 1;
  while (at + 3 <= size) {
    uint8_t who = data[at];
    size_t n = data[at + 1] | (size_t{data[at + 2]} << 8);
    at += 3;
    if (n > size - at) n = size - at;
    if (who == 255) {
      now += std::chrono::seconds(n);  // deadlines of parked requests and of authentication
      core.tick(now);
    } else {
      StoreClient& c = *core.clients()[who % 3];
      if (!c.closing) core.receive(c, data + at, n);
    }
    at += n;
    for (auto& c : core.clients())
      check_and_flush(core, *c);
  }
  return 0;
}
