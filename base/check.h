// Invariant checks. A failed check is a gradex bug, not a user error: it throws InternalError with
// the expression, both values and the source location. User-facing validation throws typed errors
// instead.
#pragma once

#include <sstream>
#include <string>

#include "base/error.h"

namespace gradex::detail {

[[noreturn]] void check_failed(const char* file, int line, const std::string& message);

template <typename A, typename B>
[[noreturn]] void check_op_failed(const char* file, int line, const char* expr, const A& a,
                                  const B& b) {
  std::ostringstream os;
  os << "check failed: " << expr << " (" << a << " vs " << b << ")";
  check_failed(file, line, os.str());
}

}  // namespace gradex::detail

#define GX_CHECK(cond)                                                                       \
  do {                                                                                       \
    if (!(cond)) ::gradex::detail::check_failed(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)

#define GX_CHECK_OP(a, op, b)                                                                 \
  do {                                                                                        \
    const auto& gx_a_ = (a);                                                                  \
    const auto& gx_b_ = (b);                                                                  \
    if (!(gx_a_ op gx_b_))                                                                    \
      ::gradex::detail::check_op_failed(__FILE__, __LINE__, #a " " #op " " #b, gx_a_, gx_b_); \
  } while (0)

#define GX_CHECK_EQ(a, b) GX_CHECK_OP(a, ==, b)
#define GX_CHECK_NE(a, b) GX_CHECK_OP(a, !=, b)
#define GX_CHECK_LE(a, b) GX_CHECK_OP(a, <=, b)
#define GX_CHECK_LT(a, b) GX_CHECK_OP(a, <, b)
#define GX_CHECK_GE(a, b) GX_CHECK_OP(a, >=, b)
#define GX_CHECK_GT(a, b) GX_CHECK_OP(a, >, b)
