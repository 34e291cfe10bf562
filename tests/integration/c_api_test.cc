// The C API end to end against a live podlinkd (host memory), including its
// error reporting.
#include <unistd.h>

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

// ABI version 2: a malloc'd buffer and podlink host memory between two
// engines, written, read back and notified with a value and with bytes.
TEST(CApi, TransfersAndNotificationsWithBytes) {
  Daemon d("{}");
  podlink_client_t* a = nullptr;
  podlink_client_t* b = nullptr;
  ASSERT_EQ(podlink_connect(d.dir().c_str(), &a), 0) << podlink_last_error();
  ASSERT_EQ(podlink_connect(d.dir().c_str(), &b), 0) << podlink_last_error();
  podlink_engine_t* ea = nullptr;
  podlink_engine_t* eb = nullptr;
  ASSERT_EQ(podlink_engine_create(a, 0, &ea), 0) << podlink_last_error();
  ASSERT_EQ(podlink_engine_create(b, PODLINK_ENGINE_FORCE_RELAY, &eb), 0) << podlink_last_error();
  EXPECT_EQ(podlink_engine_create(a, 0x80, &ea), 3);  // unknown flags
  // a: podlink host memory; b: memory as the application has it.
  podlink_buffer_t* buf = nullptr;
  ASSERT_EQ(podlink_alloc(a, -1, 1 << 20, &buf), 0) << podlink_last_error();
  podlink_region_t* ra = nullptr;
  ASSERT_EQ(podlink_register_buffer(ea, buf, "c-engine", &ra), 0) << podlink_last_error();
  std::string heap(1 << 20, 'x');
  for (size_t i = 0; i < heap.size(); ++i) heap[i] = static_cast<char>(i * 7);
  podlink_region_t* rb = nullptr;
  uint64_t offset = 99;
  ASSERT_EQ(podlink_register_host(eb, heap.data(), heap.size(), nullptr, &rb, &offset), 0) << podlink_last_error();
  EXPECT_EQ(offset, 0u);
  size_t len = 0;
  EXPECT_EQ(podlink_describe(ea, ra, nullptr, 0, &len), 11);  // OUT_OF_RANGE, with the length
  ASSERT_GT(len, 0u);
  std::string desc(len + 1, '\0');
  ASSERT_EQ(podlink_describe(ea, ra, desc.data(), desc.size(), &len), 0) << podlink_last_error();
  podlink_remote_t* rem = nullptr;
  ASSERT_EQ(podlink_open(eb, desc.c_str(), &rem), 0) << podlink_last_error();
  ASSERT_EQ(podlink_write(eb, rb, 0, rem, 8, heap.size() - 8), 0) << podlink_last_error();
  EXPECT_EQ(std::memcmp(static_cast<char*>(podlink_buffer_host_ptr(buf)) + 8, heap.data(), heap.size() - 8), 0);
  std::memset(podlink_buffer_host_ptr(buf), 'r', 4096);
  ASSERT_EQ(podlink_read(eb, rb, 100, rem, 0, 4096), 0) << podlink_last_error();
  EXPECT_EQ(heap.substr(100, 4096), std::string(4096, 'r'));
  EXPECT_EQ(podlink_write(eb, rb, 0, rem, 1 << 20, 1), 11) << podlink_last_error();  // past the peer's region
  // A value, then bytes (at the bound), each after the data before it; over the bound is refused.
  ASSERT_EQ(podlink_notify(eb, rem, 42, nullptr, 0), 0) << podlink_last_error();
  std::string msg(PODLINK_MAX_NOTIFY_BYTES, 'm');
  ASSERT_EQ(podlink_notify(eb, rem, 0, msg.data(), msg.size()), 0) << podlink_last_error();
  EXPECT_EQ(podlink_notify(eb, rem, 0, msg.data(), msg.size() + 1), 3) << podlink_last_error();
  podlink_notification_t n{};
  std::string got(PODLINK_MAX_NOTIFY_BYTES, '\0');
  int rc = 5;
  for (int i = 0; i < 2000 && rc == 5; ++i) {
    rc = podlink_next_notification(ea, &n, got.data(), got.size());
    if (rc == 5) ::usleep(1000);
  }
  ASSERT_EQ(rc, 0) << podlink_last_error();
  EXPECT_EQ(n.has_message, 0);
  EXPECT_EQ(n.value, 42u);
  EXPECT_NE(n.from_session, 0u);
  rc = 5;
  for (int i = 0; i < 2000 && rc == 5; ++i) {
    rc = podlink_next_notification(ea, &n, got.data(), 16);  // too small: it stays next
    if (rc == 5) ::usleep(1000);
  }
  EXPECT_EQ(rc, 11);
  EXPECT_EQ(n.message_length, msg.size());
  ASSERT_EQ(podlink_next_notification(ea, &n, got.data(), got.size()), 0) << podlink_last_error();
  EXPECT_EQ(n.has_message, 1);
  EXPECT_EQ(got, msg);
  EXPECT_EQ(podlink_next_notification(ea, &n, got.data(), got.size()), 5);
  EXPECT_EQ(podlink_close_remote(eb, rem), 0);
  EXPECT_EQ(podlink_unregister(eb, rb), 0) << podlink_last_error();
  EXPECT_EQ(podlink_unregister(ea, ra), 0) << podlink_last_error();
  EXPECT_EQ(podlink_register_host(eb, nullptr, 0, nullptr, &rb, nullptr), 3);
  EXPECT_EQ(podlink_open(eb, "garbage", &rem), 3);
  podlink_engine_destroy(ea);
  podlink_engine_destroy(eb);
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
