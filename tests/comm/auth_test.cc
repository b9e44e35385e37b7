// The job secret: resolving it from GRADEX_JOB_SECRET[_FILE], the authenticated TCP store (mutual
// challenge-response; strangers refused while the job goes on) and authenticated UCX peers.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "base/config.h"
#include "base/error.h"
#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/memory_store.h"
#include "comm/rendezvous/store_seal.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/rendezvous/tcp_store_protocol.h"
#include "comm/ucx/ucx_peer_auth.h"
#include "tests/comm/rank_harness.h"

namespace gradex::test {
namespace {

using comm::Bytes;
using comm::Millis;

Bytes b(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

std::string config_error(const std::vector<std::string>& env) {
  try {
    auto c = config::Config::from_strings(env, config::Source::kEnvironment);
    comm::comm_options_from_config(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

std::string temp_file(const std::string& name, const std::string& content) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(JobSecret, FromTheEnvironmentOrAFile) {
  auto secret_of = [](const std::vector<std::string>& env) {
    auto c = config::Config::from_strings(env, config::Source::kEnvironment);
    return comm::comm_options_from_config(c).job_secret;
  };
  EXPECT_EQ(secret_of({}), "");
  EXPECT_EQ(secret_of({"GRADEX_JOB_SECRET=s3cret"}), "s3cret");
  std::string path = temp_file("gradex_secret_ok", "from-file\n");
  EXPECT_EQ(secret_of({"GRADEX_JOB_SECRET_FILE=" + path}), "from-file");
  std::remove(path.c_str());
}

TEST(JobSecret, BadSettingsAreClearErrors) {
  std::string path = temp_file("gradex_secret_x", "x");
  EXPECT_EQ(config_error({"GRADEX_JOB_SECRET=a", "GRADEX_JOB_SECRET_FILE=" + path}),
            "GRADEX_JOB_SECRET and GRADEX_JOB_SECRET_FILE are both set: set only one (the file "
            "keeps the secret out of the environment)");
  EXPECT_EQ(config_error({"GRADEX_JOB_SECRET_FILE=/nonexistent/gradex.secret"}),
            "GRADEX_JOB_SECRET_FILE='/nonexistent/gradex.secret' cannot be read: No such file or "
            "directory");
  EXPECT_EQ(config_error({"GRADEX_JOB_SECRET_FILE=/"}),
            "GRADEX_JOB_SECRET_FILE='/' is a directory, not a file");
  std::string empty = temp_file("gradex_secret_empty", "\n");
  EXPECT_EQ(config_error({"GRADEX_JOB_SECRET_FILE=" + empty}),
            "GRADEX_JOB_SECRET_FILE='" + empty +
                "' holds an empty secret (write the secret into the file)");
  EXPECT_EQ(config_error({"GRADEX_JOB_SECRET="}),
            "GRADEX_JOB_SECRET is set but empty: give a secret or unset it");
  std::remove(path.c_str());
  std::remove(empty.c_str());
}

TEST(JobSecret, NeverPrinted) {
  auto c = config::Config::from_strings({"GRADEX_JOB_SECRET=do-not-print-me"},
                                        config::Source::kEnvironment);
  std::string text = c.describe();
  EXPECT_EQ(text.find("do-not-print-me"), std::string::npos);
  EXPECT_NE(text.find("GRADEX_JOB_SECRET=<hidden>"), std::string::npos);
}

TEST(JobSecret, ProofsDependOnEverything) {
  comm::auth::Nonce n1 = comm::auth::random_nonce(), n2 = comm::auth::random_nonce();
  EXPECT_NE(n1, n2);  // fresh nonces
  auto m = comm::auth::hmac("k", "label", {n1, n2});
  EXPECT_TRUE(comm::auth::equal(m, m.data(), m.size()));
  EXPECT_FALSE(comm::auth::equal(m, m.data(), m.size() - 1));
  for (auto other :
       {comm::auth::hmac("K", "label", {n1, n2}), comm::auth::hmac("k", "label2", {n1, n2}),
        comm::auth::hmac("k", "label", {n2, n1})})
    EXPECT_FALSE(comm::auth::equal(m, other.data(), other.size()));
  // Length framing: ("ab", "c") and ("a", "bc") are different messages.
  auto ab_c = comm::auth::hmac("k", "l", {std::string("ab"), std::string("c")});
  auto a_bc = comm::auth::hmac("k", "l", {std::string("a"), std::string("bc")});
  EXPECT_FALSE(comm::auth::equal(ab_c, a_bc.data(), a_bc.size()));
}

// Error text of a client connecting with `secret`.
std::string client_error(uint16_t port, const std::string& secret) {
  try {
    comm::TcpStore s("127.0.0.1", port, Millis(5000), nullptr, secret);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(AuthenticatedStore, MatchingSecretRuns) {
  comm::TcpStoreServer server("127.0.0.1", 0, "job-secret");
  comm::TcpStore a("127.0.0.1", server.port(), Millis(5000), nullptr, "job-secret");
  comm::TcpStore c("127.0.0.1", server.port(), Millis(5000), nullptr, "job-secret");
  a.set("k", b("v"));
  EXPECT_EQ(c.get("k", Millis(1000)), b("v"));
  EXPECT_EQ(c.add("n", 2), 2);
  EXPECT_EQ(server.refused_clients(), 0u);
}

TEST(AuthenticatedStore, WrongOrMissingSecretIsRefusedAndTheJobGoesOn) {
  comm::TcpStoreServer server("127.0.0.1", 0, "job-secret");
  comm::TcpStore member("127.0.0.1", server.port(), Millis(5000), nullptr, "job-secret");
  member.set("before", b("1"));
  const std::string where = "the gradex store at 127.0.0.1:" + std::to_string(server.port());

  ::testing::internal::CaptureStderr();
  std::string wrong = client_error(server.port(), "guess");
  std::string none = client_error(server.port(), "");
  std::string log = ::testing::internal::GetCapturedStderr();

  // The wrong secret: the client sees that the store's proof does not match and leaves.
  EXPECT_EQ(wrong, "authentication failed: " + where +
                       " did not prove knowledge of the job secret (a different "
                       "GRADEX_JOB_SECRET on rank 0, or not this job's store)");
  EXPECT_TRUE(contains(none, where + " refused this client: authentication failed: this store "
                                     "requires the job secret (GRADEX_JOB_SECRET) and the client "
                                     "at 127.0.0.1:"))
      << none;
  EXPECT_TRUE(contains(log, "gradex store: refused the client at 127.0.0.1:")) << log;
  EXPECT_TRUE(contains(log, "presented none")) << log;
  EXPECT_EQ(server.refused_clients(), 1u);
  // The job's own client is unaffected.
  member.set("after", b("2"));
  EXPECT_EQ(member.get("before", Millis(100)), b("1"));
}

TEST(AuthenticatedStore, ClientWithAWrongProofIsRefused) {
  // The client must prove the secret too: a stranger that answers the challenge with a made-up
  // proof is refused (a store with the wrong secret is caught by the client, see above; here the
  // client is the one without it).
  comm::TcpStoreServer server("127.0.0.1", 0, "job-secret");
  comm::Fd fd = comm::connect_tcp_with_retry("127.0.0.1", server.port(),
                                             comm::Clock::now() + Millis(5000), 5);
  auto deadline = comm::Clock::now() + Millis(5000);
  auto nonce = comm::auth::random_nonce();
  comm::seal::EphemeralKey key;
  Bytes offer(nonce.begin(), nonce.end());
  offer.insert(offer.end(), key.public_key().begin(), key.public_key().end());
  Bytes hello = comm::store_wire::make_frame(comm::store_wire::Type::kHello, offer);
  ASSERT_TRUE(comm::send_all(fd.get(), hello.data(), hello.size(), deadline, "store"));
  uint8_t header[comm::store_wire::kHeaderBytes];
  ASSERT_TRUE(comm::recv_all(fd.get(), header, sizeof(header), deadline, "store"));
  auto h = comm::store_wire::decode_header(header);
  ASSERT_EQ(h.type, comm::store_wire::Type::kChallenge);
  Bytes challenge(h.length);
  ASSERT_TRUE(comm::recv_all(fd.get(), challenge.data(), h.length, deadline, "store"));
  Bytes forged = comm::store_wire::make_frame(comm::store_wire::Type::kAuth, Bytes(32, 0xab));
  ASSERT_TRUE(comm::send_all(fd.get(), forged.data(), forged.size(), deadline, "store"));
  ASSERT_TRUE(comm::recv_all(fd.get(), header, sizeof(header), deadline, "store"));
  h = comm::store_wire::decode_header(header);
  EXPECT_EQ(h.type, comm::store_wire::Type::kError);
  Bytes text(h.length);
  ASSERT_TRUE(comm::recv_all(fd.get(), text.data(), h.length, deadline, "store"));
  EXPECT_TRUE(contains(std::string(text.begin(), text.end()),
                       "authentication failed: the client at 127.0.0.1:"));
  EXPECT_TRUE(contains(std::string(text.begin(), text.end()), "does not know the job secret"));
  EXPECT_EQ(server.refused_clients(), 1u);
}

// A client that completed the handshake (it knows the secret): every frame after it must be sealed
// with that connection's keys. An unsealed request, or one sealed under another connection's keys,
// drops the connection and writes nothing; a sealed one is served, and sealed back.
TEST(AuthenticatedStore, FramesAfterTheProofAreSealed) {
  const std::string secret = "job-secret";
  comm::TcpStoreServer server("127.0.0.1", 0, secret);
  comm::TcpStore member("127.0.0.1", server.port(), Millis(5000), nullptr, secret);
  using comm::store_wire::Type;
  // Handshakes by hand; returns the connection and its channel.
  auto handshake = [&](comm::Fd* fd) {
    *fd = comm::connect_tcp_with_retry("127.0.0.1", server.port(),
                                       comm::Clock::now() + Millis(5000), 5);
    auto deadline = comm::Clock::now() + Millis(5000);
    const auto nonce = comm::auth::random_nonce();
    auto key = std::make_unique<comm::seal::EphemeralKey>();
    Bytes offer(nonce.begin(), nonce.end());
    offer.insert(offer.end(), key->public_key().begin(), key->public_key().end());
    Bytes hello = comm::store_wire::make_frame(Type::kHello, offer);
    EXPECT_TRUE(comm::send_all(fd->get(), hello.data(), hello.size(), deadline, "store"));
    uint8_t header[comm::store_wire::kHeaderBytes];
    EXPECT_TRUE(comm::recv_all(fd->get(), header, sizeof(header), deadline, "store"));
    auto h = comm::store_wire::decode_header(header);
    EXPECT_EQ(h.type, Type::kChallenge);
    Bytes challenge(h.length);
    EXPECT_TRUE(comm::recv_all(fd->get(), challenge.data(), h.length, deadline, "store"));
    comm::auth::Nonce server_nonce{};
    comm::seal::PublicKey server_key{};
    std::copy(challenge.begin(), challenge.begin() + 32, server_nonce.begin());
    std::copy(challenge.begin() + 32, challenge.begin() + 64, server_key.begin());
    auto proof =
        comm::store_client_proof(secret, nonce, server_nonce, key->public_key(), server_key);
    Bytes auth = comm::store_wire::make_frame(Type::kAuth, Bytes(proof.begin(), proof.end()));
    EXPECT_TRUE(comm::send_all(fd->get(), auth.data(), auth.size(), deadline, "store"));
    auto channel =
        std::make_unique<comm::StoreChannel>(secret, false, nonce, server_nonce, *key, server_key);
    EXPECT_TRUE(comm::recv_all(fd->get(), header, sizeof(header), deadline, "store"));
    h = comm::store_wire::decode_header(header);
    EXPECT_EQ(h.type, Type::kSealed);  // the answer to the proof is sealed already
    Bytes ok(h.length);
    EXPECT_TRUE(comm::recv_all(fd->get(), ok.data(), h.length, deadline, "store"));
    Bytes inner = channel->open(ok.data(), ok.size());
    EXPECT_EQ(comm::store_wire::decode_header(inner.data()).type, Type::kOk);
    return channel;
  };
  comm::store_wire::Writer w;
  w.str("gradex/ucx/address/0");
  w.bytes(b("injected"));
  const Bytes set = w.frame(Type::kSet);
  auto dropped = [&](comm::Fd& fd) {
    auto deadline = comm::Clock::now() + Millis(5000);
    uint8_t byte = 0;
    try {
      return !comm::recv_all(fd.get(), &byte, 1, deadline, "store");  // no answer
    } catch (const TransportError&) {
      return true;  // closed by the server
    }
  };
  {
    comm::Fd fd;
    auto channel = handshake(&fd);
    ASSERT_TRUE(comm::send_all(fd.get(), set.data(), set.size(), comm::Clock::now() + Millis(5000),
                               "store"));
    EXPECT_TRUE(dropped(fd)) << "an unsealed set was answered";
  }
  {
    comm::Fd other, fd;
    auto foreign = handshake(&other);  // another connection's keys
    auto channel = handshake(&fd);
    const Bytes forged = foreign->seal(set);
    ASSERT_TRUE(comm::send_all(fd.get(), forged.data(), forged.size(),
                               comm::Clock::now() + Millis(5000), "store"));
    EXPECT_TRUE(dropped(fd)) << "a set sealed with another connection's keys was answered";
  }
  EXPECT_THROW(member.get("gradex/ucx/address/0", Millis(50)), TimeoutError);
  {
    comm::Fd fd;
    auto channel = handshake(&fd);
    const Bytes sealed = channel->seal(set);
    // Nothing of the value is in clear on the wire.
    EXPECT_EQ(std::search(sealed.begin(), sealed.end(), set.begin() + 12, set.end()), sealed.end());
    auto deadline = comm::Clock::now() + Millis(5000);
    ASSERT_TRUE(comm::send_all(fd.get(), sealed.data(), sealed.size(), deadline, "store"));
    uint8_t header[comm::store_wire::kHeaderBytes];
    ASSERT_TRUE(comm::recv_all(fd.get(), header, sizeof(header), deadline, "store"));
    auto h = comm::store_wire::decode_header(header);
    ASSERT_EQ(h.type, Type::kSealed);
    Bytes reply(h.length);
    ASSERT_TRUE(comm::recv_all(fd.get(), reply.data(), h.length, deadline, "store"));
    EXPECT_EQ(
        comm::store_wire::decode_header(channel->open(reply.data(), reply.size()).data()).type,
        Type::kOk);
  }
  EXPECT_EQ(member.get("gradex/ucx/address/0", Millis(1000)), b("injected"));
}

// A raw socket that skips the handshake (garbage, or a well-formed set) is refused at once.
std::string raw_exchange(uint16_t port, const Bytes& request) {
  comm::Fd fd =
      comm::connect_tcp_with_retry("127.0.0.1", port, comm::Clock::now() + Millis(5000), 5);
  auto deadline = comm::Clock::now() + Millis(5000);
  comm::send_all(fd.get(), request.data(), request.size(), deadline, "store");
  std::string got;
  try {
    char buf[256];
    while (true) {
      size_t want = 1;
      if (!comm::recv_all(fd.get(), buf, want, deadline, "store")) return got + "<timeout>";
      got.push_back(buf[0]);
    }
  } catch (const TransportError&) {
    // closed by the server: expected
  }
  return got;
}

TEST(AuthenticatedStore, RawClientsAreRefusedWhileTheJobContinues) {
  comm::TcpStoreServer server("127.0.0.1", 0, "job-secret");
  comm::TcpStore member("127.0.0.1", server.port(), Millis(5000), nullptr, "job-secret");
  std::string garbage = raw_exchange(server.port(), b("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(contains(garbage, "authentication failed: the client at 127.0.0.1:")) << garbage;
  EXPECT_TRUE(contains(garbage, "is not a gradex store client")) << garbage;
  comm::store_wire::Writer w;
  w.str("gradex/ucx/address/0");
  w.bytes(b("injected"));
  std::string set = raw_exchange(server.port(), w.frame(comm::store_wire::Type::kSet));
  EXPECT_TRUE(contains(set, "sent request type 2 before authenticating")) << set;
  EXPECT_EQ(server.refused_clients(), 2u);
  // Nothing was written, and the member is still served.
  EXPECT_THROW(member.get("gradex/ucx/address/0", Millis(50)), TimeoutError);
  member.set("k", b("v"));
  EXPECT_EQ(member.get("k", Millis(100)), b("v"));
}

TEST(AuthenticatedStore, SecretOnOneSideOnly) {
  comm::TcpStoreServer open_server("127.0.0.1", 0);
  std::string e = client_error(open_server.port(), "job-secret");
  EXPECT_TRUE(contains(e, "refused this client: authentication failed: the client at 127.0.0.1:"))
      << e;
  EXPECT_TRUE(contains(e, "has a job secret but this store was started without one")) << e;
  // Without secrets anywhere: as before.
  EXPECT_EQ(client_error(open_server.port(), ""), "no error");
}

TEST(AuthenticatedStore, WarnsOnceWithoutASecretOnANonLoopbackAddress) {
  ::testing::internal::CaptureStderr();
  { comm::TcpStoreServer loopback("127.0.0.1", 0); }
  std::string quiet = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(quiet.find("without a job secret"), std::string::npos) << quiet;
  ::testing::internal::CaptureStderr();
  { comm::TcpStoreServer any("0.0.0.0", 0); }
  { comm::TcpStoreServer again("0.0.0.0", 0); }
  { comm::TcpStoreServer with_secret("0.0.0.0", 0, "s"); }
  std::string log = ::testing::internal::GetCapturedStderr();
  size_t first = log.find("the gradex store listens on 0.0.0.0:");
  EXPECT_NE(first, std::string::npos) << log;
  size_t warning = log.find("without a job secret");
  EXPECT_NE(warning, std::string::npos) << log;
  EXPECT_EQ(log.find("without a job secret", warning + 1), std::string::npos) << "warned twice";
}

// An address entry written by someone without the secret: a forged HMAC, or a genuine entry whose
// address (or claimed rank) was changed, is refused; malformed entries are corrupt, not accepted.
TEST(AuthenticatedPeers, AddressEntriesAreBoundToTheirRank) {
  const std::string address = "a UCX worker address";
  Bytes entry = comm::ucx::encode_address_entry(1, 4, "hostA|boot|ns", address.data(),
                                                address.size(), "job-secret");
  auto e = comm::ucx::decode_address_entry(entry, 0, 1, "job-secret");
  EXPECT_EQ(e.world, 4u);
  EXPECT_EQ(e.host, "hostA|boot|ns");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(e.address), e.address_size), address);
  auto refusal = [](const Bytes& b, int peer, const std::string& secret) {
    try {
      comm::ucx::decode_address_entry(b, 0, peer, secret);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  Bytes redirected = entry;
  redirected.back() ^= 1;  // the address now points elsewhere
  EXPECT_EQ(refusal(redirected, 1, "job-secret"),
            "connect: authentication failed: rank 1 (host hostA) published a UCX address with a "
            "wrong proof of the job secret: it has a different GRADEX_JOB_SECRET, or someone "
            "without the secret wrote it");
  // The same genuine entry copied under another rank's key.
  EXPECT_NE(refusal(entry, 2, "job-secret")
                .find("rank 2 (host hostA) published a UCX address "
                      "with a wrong proof"),
            std::string::npos);
  Bytes forged = comm::ucx::encode_address_entry(1, 4, "hostA|boot|ns", address.data(),
                                                 address.size(), "a-guess");
  EXPECT_NE(refusal(forged, 1, "job-secret").find("wrong proof"), std::string::npos);
  for (size_t cut : {size_t{0}, size_t{11}, size_t{12 + 13}, size_t{12 + 13 + 32}})
    EXPECT_EQ(refusal(Bytes(entry.begin(), entry.begin() + static_cast<std::ptrdiff_t>(cut)), 1,
                      "job-secret"),
              "connect: malformed address entry for rank 1")
        << cut;
}

// Two ranks as threads over one in-memory store, each with its own secret.
std::vector<std::string> connect_pair(const std::string& secret0, const std::string& secret1) {
  auto store = std::make_shared<comm::MemoryStore>();
  std::vector<std::string> errors(2, "no error");
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      comm::CommOptions o = test_options();
      o.timeout = Millis(5000);
      o.job_secret = r == 0 ? secret0 : secret1;
      try {
        auto c = comm::create_ucx_communicator(store, r, 2, o);
        int out = r, in = -1;
        std::vector<comm::RequestPtr> reqs;
        reqs.push_back(c->irecv(1 - r, 1 << 16, &in, sizeof(in)));
        reqs.push_back(c->isend(1 - r, 1 << 16, &out, sizeof(out)));
        c->wait_all(reqs, "test");
        if (in != 1 - r) errors[static_cast<size_t>(r)] = "wrong value";
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return errors;
}

TEST(AuthenticatedPeers, MatchingSecretRuns) {
  auto errors = connect_pair("job-secret", "job-secret");
  EXPECT_EQ(errors[0], "no error");
  EXPECT_EQ(errors[1], "no error");
}

TEST(AuthenticatedPeers, MismatchedSecretIsRefusedNamingThePeer) {
  auto errors = connect_pair("job-secret", "other-secret");
  EXPECT_TRUE(contains(errors[0], "connect: authentication failed: rank 1 (host ")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "published a UCX address with a wrong proof of the job secret"))
      << errors[0];
  EXPECT_TRUE(contains(errors[1], "connect: authentication failed: rank 0 (host ")) << errors[1];
}

TEST(AuthenticatedPeers, MissingSecretOnEitherSideIsRefused) {
  auto errors = connect_pair("job-secret", "");
  EXPECT_TRUE(contains(errors[0], "rank 1 (host ")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "published a UCX address without proof of the job secret"))
      << errors[0];
  EXPECT_TRUE(contains(errors[1],
                       "was started with a job secret (GRADEX_JOB_SECRET) and this "
                       "rank without one"))
      << errors[1];
}

}  // namespace
}  // namespace gradex::test
