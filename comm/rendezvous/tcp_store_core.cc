// StoreServerCore: the store's state machine (authentication, requests, parked waits).
#include "comm/rendezvous/tcp_store_core.h"

#include <algorithm>

#include "base/error.h"
#include "base/log.h"

namespace gradex::comm {

using namespace store_wire;

namespace {

constexpr uint64_t kMaxWaitMs = 7ULL * 24 * 3600 * 1000;

Bytes text_frame(Type type, const std::string& text) {
  return make_frame(type, Bytes(text.begin(), text.end()));
}

}  // namespace

StoreClient& StoreServerCore::add_client(Fd fd, std::string peer, Clock::time_point now) {
  auto c = std::make_unique<StoreClient>();
  c->fd = std::move(fd);
  c->peer = std::move(peer);
  c->accepted = now;
  c->auth = secret_.empty() ? StoreClient::Auth::kAuthenticated : StoreClient::Auth::kAwaitHello;
  clients_.push_back(std::move(c));
  return *clients_.back();
}

void StoreServerCore::push(StoreClient& c, const Bytes& frame) {
  if (c.channel) {
    const Bytes sealed = c.channel->seal(frame);
    c.out.insert(c.out.end(), sealed.begin(), sealed.end());
    return;
  }
  c.out.insert(c.out.end(), frame.begin(), frame.end());
}

void StoreServerCore::refuse(StoreClient& c, const std::string& reason) {
  GX_LOG(kWarn) << "gradex store: refused the client at " << c.peer
                << ": authentication failed: " << reason;
  push(c, text_frame(Type::kError, "authentication failed: " + reason));
  c.closing = true;
  refused_.fetch_add(1);
}

bool StoreServerCore::try_answer(StoreClient& c, Clock::time_point now) {
  const StoreParked& p = *c.parked;
  const std::string* missing = nullptr;
  for (const auto& k : p.keys) {
    if (!data_.count(k)) {
      missing = &k;
      break;
    }
  }
  if (missing == nullptr) {
    push(c, p.type == Type::kGet ? make_frame(Type::kOk, data_[p.keys[0]])
                                 : make_frame(Type::kOk, {}));
  } else if (now >= p.deadline) {
    push(c, text_frame(Type::kTimeout, *missing));
  } else {
    return false;
  }
  c.parked.reset();
  return true;
}

void StoreServerCore::answer_parked(Clock::time_point now) {
  for (auto& c : clients_)
    if (c->parked) try_answer(*c, now);
}

void StoreServerCore::handle_hello(StoreClient& c, Reader& r) {
  const size_t offered = r.remaining();
  if (secret_.empty()) {
    if (offered != 0)
      return refuse(c, "the client at " + c.peer +
                           " has a job secret but this store was started without one (set the "
                           "same GRADEX_JOB_SECRET on every rank)");
    push(c, make_frame(Type::kOk, {}));
    return;
  }
  if (c.auth != StoreClient::Auth::kAwaitHello)
    return refuse(c, "a second hello from the client at " + c.peer);
  if (offered == auth::kNonceBytes)
    return refuse(c, "the client at " + c.peer +
                         " offered no key for a sealed connection (an older gradex build)");
  if (offered != auth::kNonceBytes + seal::kPublicKeyBytes)
    return refuse(c, "this store requires the job secret (GRADEX_JOB_SECRET) and the client at " +
                         c.peer + " presented none");
  const uint8_t* nonce = r.raw(auth::kNonceBytes);
  std::copy(nonce, nonce + auth::kNonceBytes, c.client_nonce.begin());
  const uint8_t* key = r.raw(seal::kPublicKeyBytes);
  std::copy(key, key + seal::kPublicKeyBytes, c.client_key.begin());
  c.server_nonce = auth::random_nonce();
  c.server_key = std::make_unique<seal::EphemeralKey>();
  const seal::PublicKey& server_key = c.server_key->public_key();
  auth::Mac proof =
      store_server_proof(secret_, c.client_nonce, c.server_nonce, c.client_key, server_key);
  Bytes payload(c.server_nonce.begin(), c.server_nonce.end());
  payload.insert(payload.end(), server_key.begin(), server_key.end());
  payload.insert(payload.end(), proof.begin(), proof.end());
  push(c, make_frame(Type::kChallenge, payload));
  c.auth = StoreClient::Auth::kAwaitProof;
}

void StoreServerCore::handle_auth(StoreClient& c, Reader& r) {
  if (secret_.empty() || c.auth != StoreClient::Auth::kAwaitProof)
    return refuse(c, "an unexpected authentication message from the client at " + c.peer);
  const size_t n = r.remaining();
  const uint8_t* proof = r.raw(n);
  auth::Mac want = store_client_proof(secret_, c.client_nonce, c.server_nonce, c.client_key,
                                      c.server_key->public_key());
  if (!auth::equal(want, proof, n))
    return refuse(c, "the client at " + c.peer +
                         " does not know the job secret (a different GRADEX_JOB_SECRET)");
  c.auth = StoreClient::Auth::kAuthenticated;
  // From here on every frame is sealed, this answer included; the private key is forgotten.
  c.channel = std::make_unique<StoreChannel>(secret_, true, c.client_nonce, c.server_nonce,
                                             *c.server_key, c.client_key);
  c.server_key.reset();
  GX_LOG(kDebug) << "gradex store: authenticated the client at " << c.peer;
  push(c, make_frame(Type::kOk, {}));
}

void StoreServerCore::handle(StoreClient& c, Type type, Reader r) {
  if (type == Type::kHello) return handle_hello(c, r);
  if (type == Type::kAuth) return handle_auth(c, r);
  if (c.auth != StoreClient::Auth::kAuthenticated)
    return refuse(c, "the client at " + c.peer + " sent request type " +
                         std::to_string(static_cast<unsigned>(type)) + " before authenticating");
  switch (type) {
    case Type::kSet: {
      std::string key = r.str();
      data_[key] = r.bytes();
      push(c, make_frame(Type::kOk, {}));
      answer_parked(Clock::now());
      return;
    }
    case Type::kGet:
    case Type::kWait: {
      StoreParked p;
      p.type = type;
      // Clamped to a week: a hostile or buggy client cannot overflow the deadline.
      p.deadline =
          Clock::now() + std::chrono::milliseconds(std::min<uint64_t>(r.u64(), kMaxWaitMs));
      if (type == Type::kGet) {
        p.keys.push_back(r.str());
      } else {
        uint32_t n = r.u32();
        // Each key takes at least its 4-byte length: a count beyond the payload is malformed
        // (and must not reserve memory).
        if (n > r.remaining() / 4) throw CorruptPayload("wait request lists too many keys");
        for (uint32_t i = 0; i < n; ++i)
          p.keys.push_back(r.str());
      }
      c.parked = std::move(p);
      try_answer(c, Clock::now());
      return;
    }
    case Type::kAdd: {
      int64_t delta = static_cast<int64_t>(r.u64());
      std::string key = r.str();
      Bytes& value = data_[key];
      if (value.empty()) value.assign(8, 0);
      if (value.size() != 8) {
        push(c, text_frame(Type::kError, "key '" + key + "' holds a value, not a counter"));
        return;
      }
      Reader vr(value.data(), 8);
      uint64_t now_value = vr.u64() + static_cast<uint64_t>(delta);  // wraps, never UB
      Writer w;
      w.u64(now_value);
      Bytes encoded = w.frame(Type::kOk);
      value.assign(encoded.begin() + kHeaderBytes, encoded.end());
      push(c, encoded);
      answer_parked(Clock::now());
      return;
    }
    default:
      push(c, text_frame(Type::kError,
                         "unknown request type " + std::to_string(static_cast<unsigned>(type))));
      c.closing = true;
  }
}

void StoreServerCore::parse(StoreClient& c) {
  size_t at = 0;
  while (!c.closing && !c.parked && c.in.size() - at >= kHeaderBytes) {
    Header h = decode_header(c.in.data() + at);
    std::string bad = check_header(h);
    const bool authenticated = c.auth == StoreClient::Auth::kAuthenticated;
    if (bad.empty() && !authenticated && h.length > kMaxUnauthenticatedFrame)
      bad = "it sent a frame of " + std::to_string(h.length) + " bytes before authenticating";
    if (!bad.empty()) {
      if (!authenticated) {
        refuse(c, "the client at " + c.peer + " is not a gradex store client: " + bad);
      } else {
        GX_LOG(kWarn) << "gradex store: dropping the client at " << c.peer << ": " << bad;
        push(c, text_frame(Type::kError, "not a gradex store client: " + bad));
        c.closing = true;
      }
      break;
    }
    if (c.in.size() - at < kHeaderBytes + h.length) break;
    try {
      if (c.channel) {
        // A sealed connection: only sealed frames, each opened into the request it carries.
        if (h.type != Type::kSealed)
          throw CorruptPayload("it sent an unsealed frame (type " +
                               std::to_string(static_cast<unsigned>(h.type)) +
                               ") on a sealed connection");
        const Bytes inner = c.channel->open(c.in.data() + at + kHeaderBytes, h.length);
        const Header ih = decode_header(inner.data());
        handle(c, ih.type, Reader(inner.data() + kHeaderBytes, ih.length));
      } else {
        handle(c, h.type, Reader(c.in.data() + at + kHeaderBytes, h.length));
      }
    } catch (const Error& e) {
      GX_LOG(kWarn) << "gradex store: dropping the client at " << c.peer << ": " << e.what();
      c.parked.reset();
      c.closing = true;
    }
    at += kHeaderBytes + h.length;
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(at));
}

void StoreServerCore::receive(StoreClient& c, const uint8_t* data, size_t size) {
  c.in.insert(c.in.end(), data, data + size);
  parse(c);
}

void StoreServerCore::flushed(StoreClient& c) {
  if (!c.closing && !c.parked && !c.in.empty()) parse(c);
}

void StoreServerCore::disconnected(StoreClient& c) {
  if (c.auth == StoreClient::Auth::kAwaitProof && !c.closing) {
    GX_LOG(kWarn) << "gradex store: the client at " << c.peer
                  << " left during authentication (it may have rejected this store's proof: a "
                     "different job secret)";
  }
  c.parked.reset();
  c.fd.reset();
  c.closing = true;
}

void StoreServerCore::tick(Clock::time_point now) {
  for (auto& c : clients_) {
    if (c->closing || c->auth == StoreClient::Auth::kAuthenticated) continue;
    if (now - c->accepted >= kAuthWindow)
      refuse(*c, "the client at " + c->peer + " did not authenticate within 30 s");
  }
  answer_parked(now);
}

void StoreServerCore::remove_closed() {
  clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                [](const auto& c) { return !c->fd.valid(); }),
                 clients_.end());
}

Clock::time_point StoreServerCore::next_deadline(Clock::time_point limit) const {
  for (const auto& c : clients_)
    if (c->parked && c->parked->deadline < limit) limit = c->parked->deadline;
  return limit;
}

}  // namespace gradex::comm
