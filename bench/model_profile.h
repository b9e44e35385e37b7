// A model's parameter tensors (name and shape, in registration order), as replayed by the exchange
// benchmark. Profiles are text, one tensor per line: "name dim [dim ...]"; '#' starts a comment,
// blank lines are ignored. The built-in profiles (bench/models/*.txt) are compiled into the binary,
// so gradex-bench works from any directory without extra files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradex::bench {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // every dimension >= 1
  int64_t numel = 0;           // product of shape
};

struct ModelProfile {
  std::string name;  // "resnet50", or the file path for a profile loaded from disk
  std::vector<TensorSpec> tensors;
  int64_t total_numel = 0;

  // Index of the largest tensor (the first one on ties). The profile must not be empty.
  size_t largest_tensor() const;
};

// Parses profile text. `source` names it in errors, which read "source:line: what is wrong"
// (InvalidArgument): a line without dimensions, a non-integer or non-positive dimension, a
// duplicate tensor name, a tensor or total above 2^53 elements, or a profile without tensors.
ModelProfile parse_model_profile(const std::string& text, const std::string& source,
                                 const std::string& name);

// Names of the compiled-in profiles, e.g. {"bert_base", "gpt2_small", "resnet50"}.
std::vector<std::string> builtin_model_names();

// A compiled-in profile by name, or, when `name_or_path` contains '/' or ends in ".txt", a profile
// file read from disk. InvalidArgument listing the built-in names when neither exists.
ModelProfile load_model_profile(const std::string& name_or_path);

}  // namespace gradex::bench
