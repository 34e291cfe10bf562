// The C API end to end against a live podlinkd (host memory), including its
// error reporting.
#include <cstring>
#include <string>

#include "common/cuda_driver.h"
#include "gtest/gtest.h"
#include "podlink/podlink.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

TEST(CApi, ExportImportMapRelease) {
  Daemon d("{}");
  EXPECT_EQ(podlink_abi_version(), PODLINK_ABI_VERSION);
  podlink_client_t* a = nullptr;
  podlink_client_t* b = nullptr;
  ASSERT_EQ(podlink_connect(d.dir().c_str(), &a), 0) << podlink_last_error();
  ASSERT_EQ(podlink_connect(d.dir().c_str(), &b), 0) << podlink_last_error();
  podlink_buffer_t* buf = nullptr;
  ASSERT_EQ(podlink_alloc(a, -1, 8192, &buf), 0) << podlink_last_error();
  ASSERT_NE(podlink_buffer_host_ptr(buf), nullptr);
  EXPECT_EQ(podlink_buffer_device_ptr(buf), 0u);
  EXPECT_EQ(podlink_buffer_size(buf), 8192u);
  std::memcpy(podlink_buffer_host_ptr(buf), "hello from C", 13);
  uint64_t id = 0;
  ASSERT_EQ(podlink_export(a, buf, "c-api", nullptr, &id), 0) << podlink_last_error();
  podlink_mapping_t* m = nullptr;
  ASSERT_EQ(podlink_import_map(b, 0, "c-api", -1, &m), 0) << podlink_last_error();
  EXPECT_EQ(podlink_mapping_size(m), 8192u);
  EXPECT_STREQ(static_cast<const char*>(podlink_mapping_host_ptr(m)), "hello from C");
  podlink_unmap(m);
  EXPECT_EQ(podlink_release(a, id), 0) << podlink_last_error();
  // Second release: NOT_FOUND (5) with a message.
  EXPECT_EQ(podlink_release(a, id), 5);
  EXPECT_NE(std::string(podlink_last_error()).find("already released"), std::string::npos) << podlink_last_error();
  podlink_free(buf);
  podlink_disconnect(a);
  podlink_disconnect(b);
}

TEST(CApi, ErrorsAreCodesWithMessages) {
  podlink_client_t* c = nullptr;
  EXPECT_EQ(podlink_connect("/nonexistent-podlink-dir", &c), 14);  // UNAVAILABLE
  EXPECT_NE(std::string(podlink_last_error()).find("Is podlinkd running"), std::string::npos) << podlink_last_error();
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(podlink_connect(nullptr, nullptr), 3);  // INVALID_ARGUMENT
  Daemon d("{}");
  ASSERT_EQ(podlink_connect(d.dir().c_str(), &c), 0);
  podlink_buffer_t* buf = nullptr;
  EXPECT_EQ(podlink_alloc(c, -1, 0, &buf), 3);
  ASSERT_EQ(podlink_alloc(c, -1, 4096, &buf), 0);
  uint64_t id;
  EXPECT_EQ(podlink_export(c, buf, nullptr, "not-a-pod-ref", &id), 3);
  EXPECT_NE(std::string(podlink_last_error()).find("namespace/name"), std::string::npos);
  podlink_mapping_t* m = nullptr;
  EXPECT_EQ(podlink_import_map(c, 424242, nullptr, -1, &m), 5);  // NOT_FOUND
  if (!cu::LoadDriver().ok()) {
    // GPU memory on a machine without CUDA: a clear failure, not a crash.
    podlink_buffer_t* gpu = nullptr;
    EXPECT_EQ(podlink_alloc(c, 0, 1 << 20, &gpu), 14);  // UNAVAILABLE
    EXPECT_NE(std::string(podlink_last_error()).find("CUDA driver not available"), std::string::npos)
        << podlink_last_error();
  }
  podlink_free(buf);
  podlink_disconnect(c);
}

}  // namespace
}  // namespace podlink::testing
