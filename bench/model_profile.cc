#include "bench/model_profile.h"

#include <fstream>
#include <set>
#include <sstream>

#include "base/error.h"
#include "bench/embedded_models.h"

namespace gradex::bench {

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 53;  // exact in a double, generous for any model

[[noreturn]] void fail(const std::string& source, int line, const std::string& what) {
  throw InvalidArgument(source + ":" + std::to_string(line) + ": " + what);
}

// Strict positive integer: digits only, no sign, no leading zero, within kMaxElements.
int64_t parse_dimension(const std::string& word, const std::string& source, int line) {
  bool digits = !word.empty() && word.size() <= 16 && word[0] != '0';
  for (char c : word)
    digits = digits && c >= '0' && c <= '9';
  if (!digits) fail(source, line, "dimension '" + word + "' is not a positive integer");
  int64_t value = std::stoll(word);
  if (value > kMaxElements) fail(source, line, "dimension " + word + " is too large");
  return value;
}

}  // namespace

size_t ModelProfile::largest_tensor() const {
  if (tensors.empty()) throw InvalidArgument("model profile '" + name + "' has no tensors");
  size_t best = 0;
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].numel > tensors[best].numel) best = i;
  }
  return best;
}

ModelProfile parse_model_profile(const std::string& text, const std::string& source,
                                 const std::string& name) {
  ModelProfile profile;
  profile.name = name;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  while (std::getline(in, raw)) {
    ++line;
    size_t hash = raw.find('#');
    if (hash != std::string::npos) raw.resize(hash);
    std::istringstream words(raw);
    TensorSpec tensor;
    if (!(words >> tensor.name)) continue;  // blank or comment-only line
    std::string word;
    tensor.numel = 1;
    while (words >> word) {
      int64_t dim = parse_dimension(word, source, line);
      if (tensor.numel > kMaxElements / dim) {
        fail(source, line, "tensor '" + tensor.name + "' has more than 2^53 elements");
      }
      tensor.numel *= dim;
      tensor.shape.push_back(dim);
    }
    if (tensor.shape.empty()) fail(source, line, "tensor '" + tensor.name + "' has no dimensions");
    if (!seen.insert(tensor.name).second) {
      fail(source, line, "tensor '" + tensor.name + "' appears twice");
    }
    profile.total_numel += tensor.numel;
    if (profile.total_numel > kMaxElements) fail(source, line, "model has more than 2^53 elements");
    profile.tensors.push_back(std::move(tensor));
  }
  if (profile.tensors.empty()) fail(source, line, "no tensors in the profile");
  return profile;
}

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const EmbeddedModel& m : embedded_models())
    names.push_back(m.name);
  return names;
}

ModelProfile load_model_profile(const std::string& name_or_path) {
  for (const EmbeddedModel& m : embedded_models()) {
    if (name_or_path == m.name) {
      return parse_model_profile(m.text, std::string("bench/models/") + m.name + ".txt", m.name);
    }
  }
  bool looks_like_path =
      name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 4 && name_or_path.compare(name_or_path.size() - 4, 4, ".txt") == 0);
  if (looks_like_path) {
    std::ifstream file(name_or_path, std::ios::binary);
    if (!file) throw InvalidArgument("cannot open model profile '" + name_or_path + "'");
    std::ostringstream text;
    text << file.rdbuf();
    return parse_model_profile(text.str(), name_or_path, name_or_path);
  }
  std::string known;
  for (const std::string& n : builtin_model_names())
    known += (known.empty() ? "" : ", ") + n;
  throw InvalidArgument("unknown model '" + name_or_path + "' (built in: " + known +
                        "; or give a profile file path)");
}

}  // namespace gradex::bench
