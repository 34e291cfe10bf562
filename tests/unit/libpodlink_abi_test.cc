// The shared library exposes the C API (and only a small surface) to dlopen.
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace {

TEST(LibpodlinkAbi, CEntryPointsResolveThroughDlopen) {
  void* lib = dlopen(LIBPODLINK_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  for (const char* sym : {"podlink_abi_version", "podlink_last_error", "podlink_connect", "podlink_disconnect",
                          "podlink_alloc", "podlink_buffer_host_ptr", "podlink_buffer_device_ptr",
                          "podlink_buffer_size", "podlink_free", "podlink_export", "podlink_import_map",
                          "podlink_mapping_host_ptr", "podlink_mapping_device_ptr", "podlink_mapping_size",
                          "podlink_unmap", "podlink_release"}) {
    EXPECT_NE(dlsym(lib, sym), nullptr) << sym;
  }
  auto version = reinterpret_cast<int (*)()>(dlsym(lib, "podlink_abi_version"));
  ASSERT_NE(version, nullptr);
  EXPECT_EQ(version(), 1);
  auto connect = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib, "podlink_connect"));
  auto last_error = reinterpret_cast<const char* (*)()>(dlsym(lib, "podlink_last_error"));
  void* client = nullptr;
  EXPECT_EQ(connect("/nonexistent-podlink", &client), 14);
  EXPECT_NE(std::string(last_error()).find("cannot reach podlinkd"), std::string::npos);
  // Internals stay hidden.
  EXPECT_EQ(dlsym(lib, "_ZN7podlink13SendFdMessageEiRKNS_9FdMessageEib"), nullptr);
  dlclose(lib);
}

TEST(LibpodlinkAbi, ExportedSymbolTableIsSmall) {
  std::string cmd = std::string("nm -D --defined-only ") + LIBPODLINK_PATH + " | wc -l";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  int n = 0;
  ASSERT_EQ(fscanf(p, "%d", &n), 1);
  pclose(p);
  EXPECT_GT(n, 16);
  EXPECT_LT(n, 200) << "static helpers (proto, common, gRPC templates) leak into the dynamic symbol table";
}

}  // namespace
