// The TcpStore client: one connection, one request at a time.
#include "comm/rendezvous/tcp_store.h"

#include <algorithm>

#include "base/error.h"
#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/tcp_store_protocol.h"

namespace gradex::comm {

using namespace store_wire;

namespace {

// The reply to a blocking request may take as long as the request's own timeout; allow this much
// more for the network before declaring the server unresponsive.
constexpr Millis kReplyGrace{10000};

// Longer waits are clamped (and so are deadlines computed from them): one week is "forever" for a
// bootstrap and keeps time arithmetic far from overflow.
constexpr Millis kMaxWait{7LL * 24 * 3600 * 1000};

std::string seconds(Millis t) {
  return format_seconds(static_cast<double>(t.count()) / 1000.0);
}

}  // namespace

struct TcpStore::Reply {
  Type type;
  Bytes payload;
  std::string text() const { return std::string(payload.begin(), payload.end()); }
};

TcpStore::TcpStore(std::string host, uint16_t port, Millis connect_timeout,
                   std::unique_ptr<TcpStoreServer> server, const std::string& job_secret)
    : host_(std::move(host)), port_(port), server_(std::move(server)) {
  auto deadline = Clock::now() + connect_timeout;
  fd_ = connect_tcp_with_retry(host_, port_, deadline, connect_timeout.count() / 1000.0);
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  handshake(job_secret, std::max(left, Millis(1000)));
}

// A hello round trip proves that the peer is a gradex store of the same protocol version
// (something else listening on MASTER_PORT fails here, clearly, instead of later). With a job
// secret: hello(client nonce, client key) -> challenge(server nonce, server key, server proof) ->
// auth(client proof) -> ok, and every frame from the ok on sealed with the keys of that exchange.
void TcpStore::handshake(const std::string& job_secret, Millis grace) {
  const std::string where = "the gradex store at " + host_port(host_, port_);
  auto refused = [&](const std::string& server_text) {
    fd_.reset();
    return ConfigError(where + " refused this client: " + server_text);
  };
  if (job_secret.empty()) {
    Reply r = round_trip(Writer().frame(Type::kHello), Millis(0), "connect", grace);
    if (r.type == Type::kError) throw refused(r.text());
    if (r.type != Type::kOk)
      throw TransportError(where + " refused the gradex store handshake: " + r.text());
    return;
  }
  const auth::Nonce client_nonce = auth::random_nonce();
  const seal::EphemeralKey client_key;
  Bytes hello(auth::kNonceBytes + seal::kPublicKeyBytes);
  std::copy(client_nonce.begin(), client_nonce.end(), hello.begin());
  std::copy(client_key.public_key().begin(), client_key.public_key().end(),
            hello.begin() + auth::kNonceBytes);
  Reply r = round_trip(make_frame(Type::kHello, hello), Millis(0), "connect", grace);
  if (r.type == Type::kError) throw refused(r.text());
  constexpr size_t kChallengeBytes = auth::kNonceBytes + seal::kPublicKeyBytes + auth::kMacBytes;
  if (r.type != Type::kChallenge || r.payload.size() != kChallengeBytes) {
    fd_.reset();
    throw ConfigError("authentication failed: " + where +
                      " did not prove knowledge of the job secret (it answered without a "
                      "challenge: rank 0 was started without GRADEX_JOB_SECRET)");
  }
  auth::Nonce server_nonce{};
  std::copy(r.payload.begin(), r.payload.begin() + auth::kNonceBytes, server_nonce.begin());
  seal::PublicKey server_key{};
  std::copy(r.payload.begin() + auth::kNonceBytes,
            r.payload.begin() + auth::kNonceBytes + seal::kPublicKeyBytes, server_key.begin());
  auth::Mac want = store_server_proof(job_secret, client_nonce, server_nonce,
                                      client_key.public_key(), server_key);
  if (!auth::equal(want, r.payload.data() + auth::kNonceBytes + seal::kPublicKeyBytes,
                   auth::kMacBytes)) {
    fd_.reset();
    throw ConfigError("authentication failed: " + where +
                      " did not prove knowledge of the job secret (a different "
                      "GRADEX_JOB_SECRET on rank 0, or not this job's store)");
  }
  auth::Mac proof = store_client_proof(job_secret, client_nonce, server_nonce,
                                       client_key.public_key(), server_key);
  // The store seals its answer to the proof: the keys exist from here on (the private key is
  // forgotten when this function returns).
  channel_ = std::make_unique<StoreChannel>(job_secret, false, client_nonce, server_nonce,
                                            client_key, server_key);
  r = round_trip(make_frame(Type::kAuth, Bytes(proof.begin(), proof.end())), Millis(0), "connect",
                 grace, /*plain_request=*/true);
  if (r.type == Type::kError) throw refused(r.text());
  if (r.type != Type::kOk) throw TransportError(where + " answered the authentication oddly");
}

TcpStore::~TcpStore() {
  fd_.reset();  // close our connection before stopping a server we own
  server_.reset();
}

TcpStore::Reply TcpStore::round_trip(const Bytes& request, Millis timeout, const char* operation,
                                     Millis grace, bool plain_request) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeout = std::clamp(timeout, Millis(0), kMaxWait);
  std::string who = "the gradex store at " + host_port(host_, port_);
  if (!fd_.valid()) throw TransportError("connection to " + who + " was lost earlier");
  auto deadline = Clock::now() + timeout + grace;
  auto fail_timeout = [&]() {
    fd_.reset();  // a late reply would desynchronize the connection
    return TimeoutError(std::string("store ") + operation, -1,
                        who + " did not answer within " + seconds(timeout + grace) +
                            " (something other than a gradex store may be listening there)");
  };
  try {
    const Bytes frame = channel_ && !plain_request ? channel_->seal(request) : request;
    if (!send_all(fd_.get(), frame.data(), frame.size(), deadline, who)) throw fail_timeout();
    uint8_t hdr[kHeaderBytes];
    if (!recv_all(fd_.get(), hdr, kHeaderBytes, deadline, who)) throw fail_timeout();
    Header h = decode_header(hdr);
    std::string bad = check_header(h);
    if (!bad.empty()) {
      fd_.reset();
      throw TransportError(who + " is not a usable gradex store: " + bad);
    }
    Reply r{h.type, Bytes(h.length)};
    if (h.length > 0 && !recv_all(fd_.get(), r.payload.data(), h.length, deadline, who))
      throw fail_timeout();
    if (channel_ && r.type == Type::kSealed) {
      Bytes inner;
      try {
        inner = channel_->open(r.payload.data(), r.payload.size());
      } catch (const Error& e) {
        fd_.reset();  // a stream that carried a forged or altered frame is not used again
        throw CorruptPayload(who + " sent a reply that failed its seal: " + e.what());
      }
      const Header ih = decode_header(inner.data());
      r = Reply{ih.type, Bytes(inner.begin() + kHeaderBytes, inner.end())};
    } else if (channel_ && r.type != Type::kError) {
      fd_.reset();
      throw CorruptPayload(who + " sent an unsealed reply (type " +
                           std::to_string(static_cast<unsigned>(r.type)) +
                           ") on a sealed connection");
    }
    // The handshake reports refusals itself (they name the authentication failure).
    if (r.type == Type::kError && std::string(operation) != "connect")
      throw InvalidArgument(std::string("store ") + operation + " failed: " + r.text());
    return r;
  } catch (const TransportError&) {
    fd_.reset();
    throw;
  }
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  Writer w;
  w.str(key);
  w.bytes(value);
  round_trip(w.frame(Type::kSet), Millis(0), "set", kReplyGrace);
}

Bytes TcpStore::get(const std::string& key, Millis timeout) {
  Writer w;
  w.u64(static_cast<uint64_t>(std::clamp(timeout, Millis(0), kMaxWait).count()));
  w.str(key);
  Reply r = round_trip(w.frame(Type::kGet), timeout, "get", kReplyGrace);
  if (r.type == Type::kTimeout)
    throw TimeoutError("store get", -1, "key '" + key + "' was not set within " + seconds(timeout));
  return std::move(r.payload);
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  Writer w;
  w.u64(static_cast<uint64_t>(std::clamp(timeout, Millis(0), kMaxWait).count()));
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys)
    w.str(k);
  Reply r = round_trip(w.frame(Type::kWait), timeout, "wait", kReplyGrace);
  if (r.type == Type::kTimeout)
    throw TimeoutError("store wait", -1,
                       "key '" + r.text() + "' was not set within " + seconds(timeout));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Writer w;
  w.u64(static_cast<uint64_t>(delta));
  w.str(key);
  Reply r = round_trip(w.frame(Type::kAdd), Millis(0), "add", kReplyGrace);
  Reader reader(r.payload.data(), r.payload.size());
  return static_cast<int64_t>(reader.u64());
}

}  // namespace gradex::comm
