// make_prefix_store: a namespacing view over another store.
#include "base/check.h"
#include "comm/rendezvous/store.h"

namespace gradex::comm {
namespace {

class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const Bytes& value) override {
    base_->set(prefix_ + key, value);
  }
  Bytes get(const std::string& key, Millis timeout) override {
    return base_->get(prefix_ + key, timeout);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys)
      full.push_back(prefix_ + k);
    base_->wait(full, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_->add(prefix_ + key, delta);
  }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, std::string prefix) {
  GX_CHECK(base != nullptr);
  return std::make_shared<PrefixStore>(std::move(base), std::move(prefix));
}

}  // namespace gradex::comm
