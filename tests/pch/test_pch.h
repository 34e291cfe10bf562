// The headers most test programs parse: the standard library, Abseil, GoogleTest, gRPC and podlink's generated
// service. Parsed once per build into a precompiled header that the test programs reuse
// (tests/CMakeLists.txt, podlink_use_test_pch): each program would otherwise spend about as long parsing these
// as compiling its own code. Each test still includes what it uses; this only makes those includes cheap.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "podlink/v1/podlink.grpc.pb.h"
