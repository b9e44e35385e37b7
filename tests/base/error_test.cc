#include "base/error.h"

#include <gtest/gtest.h>

#include "base/check.h"

TEST(Errors, PeerFailuresNameOperationAndPeer) {
  gradex::TimeoutError e("allreduce", 3, "no data for 2.0 s");
  EXPECT_EQ(e.code(), gradex::ErrorCode::kTimeout);
  EXPECT_EQ(e.peer(), 3);
  EXPECT_STREQ(e.what(), "allreduce with peer rank 3: no data for 2.0 s");
}

TEST(Errors, CheckMacrosReportBothValues) {
  try {
    int a = 2, b = 3;
    GX_CHECK_EQ(a, b);
    FAIL() << "GX_CHECK_EQ did not throw";
  } catch (const gradex::InternalError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("a == b (2 vs 3)"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(GX_CHECK_LT(1, 2));
}
