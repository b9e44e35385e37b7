// Adapts a framework-supplied gradex_store_t (C callbacks) to comm::Store.
#pragma once

#include "comm/rendezvous/store.h"
#include "gradex/gradex.h"

namespace gradex::capi {

class CallbackStore : public comm::Store {
 public:
  explicit CallbackStore(const gradex_store_t& callbacks);
  void set(const std::string& key, const comm::Bytes& value) override;
  comm::Bytes get(const std::string& key, comm::Millis timeout) override;
  void wait(const std::vector<std::string>& keys, comm::Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  gradex_store_t callbacks_;
};

}  // namespace gradex::capi
