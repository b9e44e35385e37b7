// Writes the seed corpora of the store, negotiation and saved-state fuzzers from the real encoders
// (the store's Writer, the Negotiators' own messages in a real two-rank negotiation over UCX, an
// engine's save_state), so the seeds follow the formats as they are. Usage: gradex-fuzz-corpus-more
// DIR  (writes DIR/corpus-store, DIR/corpus-negotiate, DIR/corpus-state).
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/memory_store.h"
#include "comm/rendezvous/tcp_store_protocol.h"
#include "gradex/gradex.h"
#include "sync/negotiation/negotiator.h"
#include "tests/fuzz/negotiate_script.h"

using namespace gradex;
using Bytes = std::vector<uint8_t>;

namespace {

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

// [u8 who][u16 length][bytes]
void chunk(Bytes* out, uint8_t who, const Bytes& b) {
  out->push_back(who);
  out->push_back(static_cast<uint8_t>(b.size()));
  out->push_back(static_cast<uint8_t>(b.size() >> 8));
  out->insert(out->end(), b.begin(), b.end());
}

void store_corpus(const std::string& dir) {
  using namespace comm::store_wire;
  auto set = [](const std::string& k, const std::string& v) {
    Writer w;
    w.str(k);
    w.bytes(Bytes(v.begin(), v.end()));
    return w.frame(Type::kSet);
  };
  auto get = [](const std::string& k, uint64_t ms) {
    Writer w;
    w.u64(ms);
    w.str(k);
    return w.frame(Type::kGet);
  };
  auto wait = [](std::vector<std::string> keys, uint64_t ms) {
    Writer w;
    w.u64(ms);
    w.u32(static_cast<uint32_t>(keys.size()));
    for (auto& k : keys)
      w.str(k);
    return w.frame(Type::kWait);
  };
  auto add = [](const std::string& k, int64_t d) {
    Writer w;
    w.u64(static_cast<uint64_t>(d));
    w.str(k);
    return w.frame(Type::kAdd);
  };
  const Bytes hello = make_frame(Type::kHello, {});
  // Without a secret: a whole bootstrap between three clients.
  Bytes a{0};
  chunk(&a, 0, hello);
  chunk(&a, 1, get("addr/0", 5000));
  chunk(&a, 2, wait({"addr/0", "addr/1"}, 100));
  chunk(&a, 0, set("addr/0", "worker-address-0"));
  chunk(&a, 1, set("addr/1", "worker-address-1"));
  chunk(&a, 2, add("count", 1));
  chunk(&a, 0, add("count", -3));
  chunk(&a, 255, {0x05});
  write_file(dir + "/seed-open-bootstrap.bin", a);
  // Timeouts answered by time passing; a counter over a value.
  Bytes b{0};
  chunk(&b, 0, get("never", 10));
  chunk(&b, 1, set("v", "value"));
  chunk(&b, 1, add("v", 1));
  chunk(&b, 255, Bytes(20, 0));
  write_file(dir + "/seed-open-timeouts.bin", b);
  // With a secret: hellos with a nonce, a bogus proof, requests before authentication, and an
  // authenticated client 0 doing real work.
  auto nonce = comm::auth::random_nonce();
  Bytes c{3};
  chunk(&c, 1, make_frame(Type::kHello, Bytes(nonce.begin(), nonce.end())));
  chunk(&c, 1, make_frame(Type::kAuth, Bytes(32, 7)));
  chunk(&c, 2, set("x", "y"));
  chunk(&c, 0, set("addr/0", "a"));
  chunk(&c, 0, get("addr/0", 1));
  write_file(dir + "/seed-secret.bin", c);
  Bytes d{1};
  chunk(&d, 0, make_frame(Type::kHello, Bytes(nonce.begin(), nonce.end())));
  chunk(&d, 255, Bytes(40, 0));
  write_file(dir + "/seed-secret-silent.bin", d);
}

// Forwards to a real communicator and keeps a copy of every message sent.
class TapComm : public comm::Communicator {
 public:
  explicit TapComm(comm::Communicator& inner) : c_(inner) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  const comm::CommOptions& options() const override { return c_.options(); }
  comm::RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    const auto* p = static_cast<const uint8_t*>(data);
    sent.emplace_back(p, p + bytes);
    return c_.isend(peer, tag, data, bytes);
  }
  comm::RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return c_.irecv(peer, tag, data, bytes);
  }
  bool progress() override { return c_.progress(); }
  bool test(comm::Request& r, const char* op) override { return c_.test(r, op); }
  void wait_all(std::vector<comm::RequestPtr>& r, const char* op) override { c_.wait_all(r, op); }
  size_t recv_length(const comm::Request& r) const override { return c_.recv_length(r); }
  uint64_t next_collective_tag() override { return c_.next_collective_tag(); }
  uint64_t bytes_sent() const override { return c_.bytes_sent(); }
  uint64_t bytes_received() const override { return c_.bytes_received(); }
  std::vector<Bytes> sent;

 private:
  comm::Communicator& c_;
};

using Rank0 = std::function<std::vector<sync::Announcement>(int round, fuzz::NegotiateScript&)>;

// Rank 0's real messages of a two-rank negotiation over UCX (ranks as threads), as [u16
// length][message] chunks. Rank 1 runs exactly what the fuzz target runs (the shared script, the
// same cache capacity), so the cache ids in the seeds are the ones the fuzz target assigns.
Bytes negotiate_rounds(int rounds, const Rank0& rank0, int timeout_ms, int sleep_ms,
                       bool leave_last) {
  auto store = std::make_shared<comm::MemoryStore>();
  comm::CommOptions options;
  options.timeout = comm::Millis(20000);
  Bytes out;
  std::exception_ptr error;
  std::mutex mutex;
  auto rank = [&](int r) {
    try {
      auto c = comm::create_ucx_communicator(store, r, 2, options);
      TapComm tap(*c);
      sync::Negotiator n(tap, std::chrono::milliseconds(r == 0 ? timeout_ms : 1000), 8);
      fuzz::NegotiateScript script(r, 2);
      for (int i = 0; i < rounds; ++i) {
        tap.sent.clear();
        if (r == 0) {
          script.verdicts(n.round(rank0(i, script), leave_last && i + 1 == rounds));
          // allgatherv_inline to the one peer: the 8-byte size and the message in one send when it
          // fits the inline maximum, else the size alone and then the message.
          const Bytes msg = tap.sent.size() == 1
                                ? Bytes(tap.sent.at(0).begin() + 8, tap.sent.at(0).end())
                                : tap.sent.at(1);
          out.push_back(static_cast<uint8_t>(msg.size()));
          out.push_back(static_cast<uint8_t>(msg.size() >> 8));
          out.insert(out.end(), msg.begin(), msg.end());
        } else {
          script.verdicts(n.round(script.next(i), false));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  if (error) std::rethrow_exception(error);
  return out;
}

void negotiate_corpus(const std::string& dir) {
  using sync::Announcement;
  using sync::WorkKind;
  using Script = fuzz::NegotiateScript;
  // Rank 0 does what rank 1 does: full form first, then bits, non-finite bits, counter exceptions.
  auto same = [](int round, Script& s) { return s.next(round); };
  auto nothing = [](int, Script&) { return std::vector<Announcement>{}; };
  write_file(dir + "/seed-matching.bin", negotiate_rounds(8, same, 60000, 0, false));
  // Sizes and dtypes that differ before anything is cached.
  write_file(dir + "/seed-mismatch.bin",
             negotiate_rounds(
                 3,
                 [](int round, Script&) {
                   if (round > 0) return std::vector<Announcement>{};
                   return std::vector<Announcement>{
                       {{WorkKind::kGradient, "layer0.weight"}, 999, DType::kFloat32},
                       {{WorkKind::kGradient, "bias"}, 10, DType::kBFloat16}};
                 },
                 60000, 0, false));
  // A cached key announced with another size: the full form again, then a mismatch.
  write_file(dir + "/seed-cached-mismatch.bin", negotiate_rounds(
                                                    5,
                                                    [](int round, Script& s) {
                                                      std::vector<Announcement> a = s.next(round);
                                                      if (round == 3)
                                                        for (Announcement& x : a)
                                                          if (x.id.key == "bias") x.numel = 11;
                                                      return a;
                                                    },
                                                    60000, 0, false));
  // A key only rank 0 announces times out: rank 0's later messages carry the abort.
  write_file(dir + "/seed-abort.bin",
             negotiate_rounds(
                 3,
                 [](int round, Script&) {
                   if (round > 0) return std::vector<Announcement>{};
                   return std::vector<Announcement>{
                       {{WorkKind::kGradient, "only.rank0"}, 5, DType::kFloat32}};
                 },
                 1, 5, false));
  // Cached keys that rank 0 stops announcing: aborted by name.
  write_file(dir + "/seed-cached-abort.bin", negotiate_rounds(
                                                 5,
                                                 [](int round, Script& s) {
                                                   return round < 2 ? s.next(round)
                                                                    : std::vector<Announcement>{};
                                                 },
                                                 1, 5, false));
  write_file(
      dir + "/seed-leaving.bin",
      negotiate_rounds(
          2, [&](int round, Script& s) { return round == 0 ? nothing(round, s) : s.next(round); },
          60000, 0, true));
}

void state_corpus(const std::string& dir) {
  gradex_engine_options_t o;
  gradex_engine_options_init(&o);
  o.rank = 0;
  o.world_size = 1;
  const char* names[] = {"GRADEX_LOG_LEVEL", "GRADEX_DENSE_THRESHOLD"};
  const char* values[] = {"error", "1000"};
  o.config_count = 2;
  o.config_names = names;
  o.config_values = values;
  gradex_engine_t* e = nullptr;
  if (gradex_engine_create(&o, &e) != GRADEX_OK) throw std::runtime_error(gradex_last_error());
  gradex_register_tensor(e, "dense", 100, GRADEX_FLOAT32, GRADEX_DEVICE_CPU);
  gradex_register_tensor(e, "sparse", 1200, GRADEX_FLOAT32, GRADEX_DEVICE_CPU);
  gradex_register_tensor(e, "half", 300, GRADEX_FLOAT16, GRADEX_DEVICE_CPU);
  Bytes buf(1 << 20);
  size_t n = 0;
  gradex_save_state(e, buf.data(), buf.size(), &n);
  write_file(dir + "/seed-fresh.bin", Bytes(buf.begin(), buf.begin() + n));
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  std::vector<float> dense(100), sparse(1200);
  std::vector<uint16_t> half(300, 0x3c00);
  for (int step = 0; step < 3; ++step) {
    for (auto& v : dense)
      v = g(rng);
    for (auto& v : sparse)
      v = g(rng);
    gradex_handle_t h[3];
    gradex_submit(e, "dense", dense.data(), &h[0]);
    gradex_submit(e, "sparse", sparse.data(), &h[1]);
    gradex_submit(e, "half", half.data(), &h[2]);
    for (auto x : h)
      if (gradex_wait(e, x) != GRADEX_OK) throw std::runtime_error(gradex_last_error());
    int avg = 0;
    gradex_end_step(e, &avg);
  }
  gradex_save_state(e, buf.data(), buf.size(), &n);
  write_file(dir + "/seed-after-steps.bin", Bytes(buf.begin(), buf.begin() + n));
  gradex_engine_destroy(e);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  for (const char* sub : {"corpus-store", "corpus-negotiate", "corpus-state"})
    mkdir((dir + "/" + sub).c_str(), 0755);
  store_corpus(dir + "/corpus-store");
  negotiate_corpus(dir + "/corpus-negotiate");
  state_corpus(dir + "/corpus-state");
  std::printf("wrote seeds to %s/corpus-{store,negotiate,state}\n", dir.c_str());
  return 0;
}
