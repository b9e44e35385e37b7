// Small helpers for code that runs inside a forked rank: failures are returned as strings.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "gradex/gradex.h"
#include "tests/test_values.h"

#define RANK_REQUIRE(cond, what)                                                           \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::ostringstream rank_require_os_;                                                 \
      rank_require_os_ << what << " [" #cond " at " << __FILE__ << ":" << __LINE__ << "]"; \
      return rank_require_os_.str();                                                       \
    }                                                                                      \
  } while (0)

#define RANK_OK(call) RANK_REQUIRE((call) == GRADEX_OK, #call << ": " << gradex_last_error())

namespace gradex::test {

// gradex_explain's text for `engine` ("" when the call fails: the caller's check then fails).
inline std::string explain_text(gradex_engine_t* engine) {
  size_t length = 0;
  if (gradex_explain(engine, nullptr, 0, &length) != GRADEX_OK) return "";
  std::string text(length, '\0');
  if (gradex_explain(engine, text.data(), text.size(), &length) != GRADEX_OK) return "";
  return text;
}

// gradex_save_state's blob for `engine` into `blob`; "" on success, else what failed.
inline std::string save_state(gradex_engine_t* engine, std::vector<uint8_t>* blob) {
  size_t length = 0;
  RANK_OK(gradex_save_state(engine, nullptr, 0, &length));
  blob->resize(length);
  RANK_OK(gradex_save_state(engine, blob->data(), blob->size(), &length));
  return "";
}

}  // namespace gradex::test
