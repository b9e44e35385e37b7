// Writes the seed corpora of the store, negotiation and saved-state fuzzers from the real encoders
// (the store's Writer, the Negotiator's own messages, an engine's save_state), so the seeds follow
// the formats as they are. Usage: gradex-fuzz-corpus-more DIR  (writes DIR/corpus-store,
// DIR/corpus-negotiate, DIR/corpus-state).
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/auth.h"
#include "comm/tcp_store_protocol.h"
#include "gradex/gradex.h"
#include "sync/negotiator.h"
#include "tests/fuzz/scripted_comm.h"

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

// Rank 0's real messages for a few rounds, as [u16 length][message] chunks.
void negotiate_corpus(const std::string& dir) {
  using sync::Announcement;
  using sync::WorkKind;
  auto rounds_file = [&](const std::string& name,
                         const std::vector<std::vector<Announcement>>& rounds, bool leave_last,
                         int sleep_ms) {
    fuzz::ScriptedComm comm(0, 2);
    sync::Negotiator n(comm, std::chrono::milliseconds(1));
    Bytes out;
    for (size_t i = 0; i < rounds.size(); ++i) {
      comm.script_allgatherv(1, {});
      comm.sent.clear();
      try {
        n.round(rounds[i], leave_last && i + 1 == rounds.size());
      } catch (const Error&) {
        // the scripted peer sends nothing valid: only rank 0's own message matters here
      }
      const Bytes& msg = comm.sent.size() > 1 ? comm.sent[1] : Bytes{};
      out.push_back(static_cast<uint8_t>(msg.size()));
      out.push_back(static_cast<uint8_t>(msg.size() >> 8));
      out.insert(out.end(), msg.begin(), msg.end());
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    write_file(dir + "/" + name, out);
  };
  std::vector<Announcement> same = {{{WorkKind::kGradient, "layer0.weight"}, 1000, DType::kFloat32},
                                    {{WorkKind::kAverage, "layer0.weight"}, 1000, DType::kFloat32},
                                    {{WorkKind::kGradient, "bias"}, 10, DType::kFloat16}};
  std::vector<Announcement> differ = {
      {{WorkKind::kGradient, "layer0.weight"}, 999, DType::kFloat32},
      {{WorkKind::kGradient, "bias"}, 10, DType::kBFloat16}};
  std::vector<Announcement> others = {{{WorkKind::kGradient, "only.rank0"}, 5, DType::kFloat32}};
  rounds_file("seed-matching.bin", {same}, false, 0);
  rounds_file("seed-mismatch.bin", {differ, {}}, false, 0);
  // A key only rank 0 announces times out: rank 0's later messages carry the abort.
  rounds_file("seed-abort.bin", {others, {}, {}}, false, 5);
  rounds_file("seed-leaving.bin", {{}, same}, true, 0);
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
