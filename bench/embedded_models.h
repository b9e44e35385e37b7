// The model profiles of bench/models/*.txt, compiled in. The definition is generated at build time
// (bench/models/embed.cmake writes embedded_models.cc into the build tree from the .txt files).
#pragma once

#include <vector>

namespace gradex::bench {

struct EmbeddedModel {
  const char* name;  // file name without ".txt"
  const char* text;  // the file's contents
};

// Sorted by name.
const std::vector<EmbeddedModel>& embedded_models();

}  // namespace gradex::bench
