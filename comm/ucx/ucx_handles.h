// RAII owners of UCX handles. Each wrapper releases its handle in its destructor; moving transfers
// ownership. Creation failures throw TransportError with UCX's status text.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

namespace gradex::comm::ucx {

// Throws TransportError "<what> failed: <ucs status string>".
[[noreturn]] void throw_status(const std::string& what, ucs_status_t status);

// Owns the ucp_config_t read from UCX's environment, modified programmatically (never through
// UCX_* environment variables).
class Config {
 public:
  Config();
  ~Config();
  Config(const Config&) = delete;
  Config& operator=(const Config&) = delete;
  // ucp_config_modify; TransportError names the option and value when UCX rejects them.
  void modify(const char* name, const std::string& value);
  ucp_config_t* get() const { return config_; }

 private:
  ucp_config_t* config_ = nullptr;
};

// A UCP context with the tag-matching feature only.
class Context {
 public:
  explicit Context(const Config& config);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h get() const { return context_; }

 private:
  ucp_context_h context_ = nullptr;
};

// A single-threaded worker: only the thread using the communicator progresses it.
class Worker {
 public:
  explicit Worker(const Context& context);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ucp_worker_h get() const { return worker_; }

 private:
  ucp_worker_h worker_ = nullptr;
};

// The worker's packed address, to publish through the bootstrap store.
class WorkerAddress {
 public:
  explicit WorkerAddress(const Worker& worker);
  ~WorkerAddress();
  WorkerAddress(const WorkerAddress&) = delete;
  WorkerAddress& operator=(const WorkerAddress&) = delete;
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(address_); }
  size_t size() const { return length_; }

 private:
  ucp_worker_h worker_;
  ucp_address_t* address_ = nullptr;
  size_t length_ = 0;
};

// An endpoint to one peer. Closing needs worker progress, so it is explicit: start_close() hands
// back the close request (nullptr when already done) for the owner to progress and free. An
// endpoint destroyed while still open is force-closed.
class Endpoint {
 public:
  Endpoint() = default;
  Endpoint(ucp_worker_h worker, const ucp_ep_params_t& params, int peer);
  ~Endpoint();
  Endpoint(Endpoint&& other) noexcept;
  Endpoint& operator=(Endpoint&& other) noexcept;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  ucp_ep_h get() const { return ep_; }
  bool open() const { return ep_ != nullptr; }
  // Starts ucp_ep_close_nbx (force mode skips the flush and any handshake with the peer).
  // Returns an in-flight request or nullptr; the endpoint handle is released either way.
  void* start_close(bool force);

 private:
  ucp_ep_h ep_ = nullptr;
};

}  // namespace gradex::comm::ucx
