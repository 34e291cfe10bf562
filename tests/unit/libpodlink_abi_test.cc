// The shared library exposes the C API (and only a small surface) to dlopen.
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "podlink/podlink.h"

namespace {

TEST(LibpodlinkAbi, CEntryPointsResolveThroughDlopen) {
  void* lib = dlopen(LIBPODLINK_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  for (const char* sym : {"podlink_abi_version", "podlink_last_error", "podlink_connect", "podlink_disconnect",
                          "podlink_alloc", "podlink_buffer_host_ptr", "podlink_buffer_device_ptr",
                          "podlink_buffer_size", "podlink_free", "podlink_export", "podlink_import_map",
                          "podlink_mapping_host_ptr", "podlink_mapping_device_ptr", "podlink_mapping_size",
                          "podlink_unmap", "podlink_release",
                          // version 2
                          "podlink_engine_create", "podlink_engine_destroy", "podlink_register_host",
                          "podlink_register_buffer", "podlink_unregister", "podlink_describe", "podlink_open",
                          "podlink_close_remote", "podlink_write", "podlink_read", "podlink_notify",
                          "podlink_next_notification"}) {
    EXPECT_NE(dlsym(lib, sym), nullptr) << sym;
  }
  auto version = reinterpret_cast<int (*)()>(dlsym(lib, "podlink_abi_version"));
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version(), 2);
  auto connect = reinterpret_cast<int (*)(const char*, podlink_client_t**)>(dlsym(lib, "podlink_connect"));
  auto last_error = reinterpret_cast<const char* (*)()>(dlsym(lib, "podlink_last_error"));
  podlink_client_t* client = nullptr;
  EXPECT_EQ(connect("/nonexistent-podlink", &client), 14);
  EXPECT_NE(std::string(last_error()).find("cannot reach podlinkd"), std::string::npos);
  // Internals stay hidden.
  EXPECT_EQ(dlsym(lib, "_ZN7podlink13SendFdMessageEiRKNS_9FdMessageEib"), nullptr);
  dlclose(lib);
}

// How many of libpodlink's dynamic symbols match an extended regular expression (all of them for "").
int CountExported(const std::string& pattern) {
  std::string cmd = std::string("nm -D --defined-only ") + LIBPODLINK_PATH + " | awk '{print $3}'";
  if (!pattern.empty()) cmd += " | grep -E '" + pattern + "'";
  cmd += " | wc -l";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  int n = -1;
  if (fscanf(p, "%d", &n) != 1) n = -1;
  pclose(p);
  return n;
}

TEST(LibpodlinkAbi, ExportedSymbolTableIsSmall) {
  int n = CountExported("");
  EXPECT_GT(n, 16);
  // The static libraries linked in stay inside (--exclude-libs): the generated protobuf classes, protobuf's and
  // gRPC's templates instantiated for them, common/'s helpers.
  EXPECT_EQ(CountExported("^_ZN7podlink2v1|^_ZN6google8protobuf|^_ZN4grpc|SendFdMessage|RecvFdMessage"), 0);
#if defined(__clang__) && defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define PODLINK_TEST_CLANG_SANITIZED 1
#endif
#endif
#ifndef PODLINK_TEST_CLANG_SANITIZED
  EXPECT_LT(n, 200) << "static helpers (proto, common, gRPC templates) leak into the dynamic symbol table";
#else
  // Under clang's sanitizers the library's own code exports more that is no helper: the type descriptors of its
  // function types (-fsanitize=function) and the standard templates -O1 leaves out of line (270 on 2026-12-02).
  EXPECT_LT(n, 400);
#endif
}

}  // namespace
