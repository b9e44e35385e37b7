#include "comm/ucx/ucx_handles.h"

#include "base/error.h"
#include "base/log.h"

namespace gradex::comm::ucx {

void throw_status(const std::string& what, ucs_status_t status) {
  throw TransportError(what + " failed: " + ucs_status_string(status));
}

Config::Config() {
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config_);
  if (st != UCS_OK) throw_status("ucp_config_read", st);
}

Config::~Config() {
  if (config_) ucp_config_release(config_);
}

void Config::modify(const char* name, const std::string& value) {
  ucs_status_t st = ucp_config_modify(config_, name, value.c_str());
  if (st != UCS_OK)
    throw TransportError(std::string("UCX rejected ") + name + "='" + value +
                         "': " + ucs_status_string(st));
}

Context::Context(const Config& config) {
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // WAKEUP: a waiting rank sleeps on the worker's event fd instead of spinning (ucx_requests.cc).
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucs_status_t st = ucp_init(&params, config.get(), &context_);
  if (st != UCS_OK) throw_status("ucp_init", st);
}

Context::~Context() {
  if (context_) ucp_cleanup(context_);
}

Worker::Worker(const Context& context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // SERIALIZED, not SINGLE: the worker is created on the caller's thread and then driven by the
  // engine's progress thread (one thread at a time, never concurrently).
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t st = ucp_worker_create(context.get(), &params, &worker_);
  if (st != UCS_OK) throw_status("ucp_worker_create", st);
}

Worker::~Worker() {
  if (worker_) ucp_worker_destroy(worker_);
}

WorkerAddress::WorkerAddress(const Worker& worker) : worker_(worker.get()) {
  ucs_status_t st = ucp_worker_get_address(worker_, &address_, &length_);
  if (st != UCS_OK) throw_status("ucp_worker_get_address", st);
}

WorkerAddress::~WorkerAddress() {
  if (address_) ucp_worker_release_address(worker_, address_);
}

Endpoint::Endpoint(ucp_worker_h worker, const ucp_ep_params_t& params, int peer) {
  ucs_status_t st = ucp_ep_create(worker, &params, &ep_);
  if (st != UCS_OK) throw_status("ucp_ep_create to rank " + std::to_string(peer), st);
}

Endpoint::~Endpoint() {
  if (!ep_) return;
  void* req = start_close(true);
  if (req != nullptr) ucp_request_free(req);  // UCX releases it once the close completes
}

Endpoint::Endpoint(Endpoint&& other) noexcept : ep_(other.ep_) {
  other.ep_ = nullptr;
}

Endpoint& Endpoint::operator=(Endpoint&& other) noexcept {
  if (this != &other) {
    std::swap(ep_, other.ep_);
  }
  return *this;
}

void* Endpoint::start_close(bool force) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep_, &param);
  ep_ = nullptr;
  if (req == nullptr) return nullptr;
  if (UCS_PTR_IS_ERR(req)) {
    GX_LOG(kDebug) << "ucp_ep_close_nbx: " << ucs_status_string(UCS_PTR_STATUS(req));
    return nullptr;
  }
  return req;
}

}  // namespace gradex::comm::ucx
