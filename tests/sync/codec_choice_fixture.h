// What the codec-choice tests share: a small model, link numbers, options, and lookups in a plan.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "sync/policy/codec_choice.h"

namespace gradex::sync::cost::choice_fixture {

// A small model: ready times spread over a 100 ms backward pass, large tensors first (as in a
// backward pass over an MLP/conv net: the output layer is ready first).
inline TensorInput input(const char* key, uint64_t numel, uint64_t rows, double ready_s) {
  TensorInput t;
  t.key = key;
  t.numel = numel;
  t.rows = rows;
  t.ready_s = ready_s;
  return t;
}

inline std::vector<TensorInput> model() {
  return {
      input("fc.weight", 20480, 10, 0.000), input("fc.bias", 10, 0, 0.000),
      input("layer3", 4000000, 0, 0.020),   input("layer2", 2000000, 0, 0.050),
      input("layer1", 1000000, 0, 0.080),   input("layer1.bias", 1000, 0, 0.080),
      input("stem", 50000, 0, 0.100),
  };
}

inline Snapshot numbers(double gbit) {
  Snapshot s;
  for (LinkParams& l : s.link)
    l = {50e-6, 8.0 / (gbit * 1e9), true};
  s.backward_s = 0.1;
  s.forward_s = 0.05;
  return s;
}

inline ChoiceOptions options() {
  ChoiceOptions o;
  o.world_size = 4;
  return o;
}

inline const TensorChoice& find(const Plan& p, const std::string& key) {
  return *std::find_if(p.tensors.begin(), p.tensors.end(),
                       [&](const TensorChoice& c) { return c.key == key; });
}

inline size_t rank_of(const Rung& r, const ChoiceOptions& o) {
  if (r.codec == Codec::kFp32) return 0;
  if (r.codec == Codec::kHalf) return 1;
  if (r.codec == Codec::kInt8) return 2;
  return 3 + static_cast<size_t>(std::find(o.ladder.begin(), o.ladder.end(), r.sparsity) -
                                 o.ladder.begin());
}

}  // namespace gradex::sync::cost::choice_fixture
