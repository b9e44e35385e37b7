// get_backend(): one shared backend per type, clear errors for what this machine or build lacks
// (the CUDA library is dlopen'ed only when asked for), and the staging helpers' round trip:
// step -> stage -> encode -> decode -> apply equals the CPU path on every backend.
#include <gtest/gtest.h>

#include <string>

#include "backend_util.h"
#include "base/error.h"
#include "compress/backend/backend.h"
#include "compress/backend/staging.h"
#include "compress/wire/codec.h"
#include "test_util.h"

namespace gradex::compress {
namespace {

using backend::DeviceType;
using test::Device;

TEST(BackendFactory, SharesOneBackendPerType) {
  auto a = backend::get_backend(DeviceType::kCpu);
  auto b = backend::get_backend(DeviceType::kCpu);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_EQ(a->name(), "cpu");
  EXPECT_TRUE(a->host_accessible());
  auto t = backend::get_backend(DeviceType::kThrustOmp);
  EXPECT_EQ(t->type(), DeviceType::kThrustOmp);
  EXPECT_EQ(t->name(), "thrust-omp");
  EXPECT_TRUE(backend::backend_available(DeviceType::kThrustOmp));
}

TEST(BackendFactory, RejectsBadDeviceIndices) {
  EXPECT_THROW(backend::get_backend(DeviceType::kCpu, 1), InvalidArgument);
  EXPECT_THROW(backend::get_backend(DeviceType::kCuda, -1), InvalidArgument);
  EXPECT_THROW(backend::get_backend(static_cast<DeviceType>(7)), InvalidArgument);
}

// Either this machine has a CUDA device and the library (then the backend works), or the error
// says what is missing, and asking again gives the same answer.
TEST(BackendFactory, CudaIsLoadedOnDemandOrExplainsWhyNot) {
  if (backend::backend_available(DeviceType::kCuda)) {
    auto c = backend::get_backend(DeviceType::kCuda);
    EXPECT_EQ(c->type(), DeviceType::kCuda);
    EXPECT_FALSE(c->host_accessible());
    EXPECT_NE(c->name().find("cuda:0"), std::string::npos);
    return;
  }
  std::string first;
  try {
    backend::get_backend(DeviceType::kCuda);
    FAIL() << "get_backend(kCuda) succeeded although backend_available said no";
  } catch (const InvalidArgument& e) {
    first = e.what();
  }
  EXPECT_NE(first.find("CUDA backend"), std::string::npos) << first;
  EXPECT_TRUE(first.find("libgradex_backend_cuda.so") != std::string::npos ||
              first.find("CUDA runtime") != std::string::npos ||
              first.find("out of range") != std::string::npos)
      << first;
  try {
    backend::get_backend(DeviceType::kCuda);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(first, e.what());
  }
}

class BackendStaging : public ::testing::TestWithParam<DeviceType> {};

// Two "ranks" step, stage and encode; every payload is decoded and applied in rank order. The sum
// must equal wire::accumulate over the same payloads on the host, bit for bit.
TEST_P(BackendStaging, StepStageEncodeDecodeApplyRoundTrip) {
  auto b = backend::get_backend(GetParam());
  Device dev{*b};
  const size_t n = 200003;
  DgcOptions o;
  o.sparsity = 0.99;
  o.value_dtype = DType::kFloat16;
  backend::SelectionStager stager(*b);
  backend::PayloadApplier applier(*b);
  std::vector<float> want(n, 0.0f);
  auto out = dev.upload(want);
  size_t selected = 0;
  for (int rank = 0; rank < 2; ++rank) {
    auto s = b->create_dgc(n, o);
    auto g = dev.upload(test::random_grad(n, 5 + rank));
    backend::DgcStepInfo info = s->step(g->as<float>(), 1.0f, *dev.stream);
    wire::SparseRef ref = stager.stage(*s, info, *dev.stream);
    ASSERT_EQ(ref.count, info.count);
    std::vector<uint8_t> bytes;
    wire::encode(ref, 42, WireOptions{}, bytes);
    wire::DecodedPayload p = wire::decode(bytes.data(), bytes.size());
    ASSERT_EQ(p.indices, dev.download(s->selected_indices(), info.count));
    wire::accumulate(p, want.data(), n, 0.5f);
    applier.apply(p, out->as<float>(), n, 0.5f, *dev.stream);
    selected += info.count;
  }
  std::vector<float> got = dev.download(out->as<float>(), n);
  ASSERT_EQ(0, std::memcmp(got.data(), want.data(), n * 4));
  // Host backends move nothing; a device backend moves exactly the selections, both ways.
  const size_t expect = b->host_accessible() ? 0 : 8 * selected;
  EXPECT_EQ(stager.bytes_staged(), expect);
  EXPECT_EQ(applier.bytes_staged(), expect);
  wire::DecodedPayload wrong;
  wrong.header.numel = n - 1;
  EXPECT_THROW(applier.apply(wrong, out->as<float>(), n, 1.0f, *dev.stream), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(All, BackendStaging, ::testing::ValuesIn(test::test_backends()),
                         test::backend_param_name);

}  // namespace
}  // namespace gradex::compress
