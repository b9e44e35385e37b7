#include "capi/callback_store.h"

#include <chrono>

#include "base/error.h"

namespace gradex::capi {

CallbackStore::CallbackStore(const gradex_store_t& callbacks) : callbacks_(callbacks) {
  if (!callbacks_.set || !callbacks_.get || !callbacks_.add)
    throw InvalidArgument(
        "the store passed to gradex_engine_create lacks a set, get or add callback");
}

void CallbackStore::set(const std::string& key, const comm::Bytes& value) {
  if (callbacks_.set(callbacks_.context, key.c_str(), value.data(), value.size()) != 0)
    throw TransportError("the framework's store failed to set key '" + key + "'");
}

comm::Bytes CallbackStore::get(const std::string& key, comm::Millis timeout) {
  void* value = nullptr;
  size_t length = 0;
  if (callbacks_.get(callbacks_.context, key.c_str(), timeout.count(), &value, &length) != 0)
    throw TimeoutError("store get of key '" + key + "'", -1,
                       "the framework's store did not provide it within " +
                           std::to_string(timeout.count()) + " ms");
  const auto* bytes = static_cast<const uint8_t*>(value);
  comm::Bytes result(bytes, bytes + length);
  if (callbacks_.release && value) callbacks_.release(callbacks_.context, value);
  return result;
}

void CallbackStore::wait(const std::vector<std::string>& keys, comm::Millis timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& key : keys) {
    auto left =
        std::chrono::duration_cast<comm::Millis>(deadline - std::chrono::steady_clock::now());
    get(key, std::max(left, comm::Millis(1)));
  }
}

int64_t CallbackStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  if (callbacks_.add(callbacks_.context, key.c_str(), delta, &result) != 0)
    throw TransportError("the framework's store failed to add to key '" + key + "'");
  return result;
}

}  // namespace gradex::capi
