// GPU memory an application already has, over a fake CUDA driver table (no GPU): the cuMem allocations
// FindExistingRange finds under a range laid out as torch's expandable segments lay it out (allocations of one
// chunk size mapped back to back), what it refuses and how, that it releases every allocation it retained; and
// the layout podlinkd checks before it looks at a chunked export's descriptors (CheckChunkLayout).
#include "client-lib/engine/existing_range.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "daemon/gpu/memory_object.h"

namespace podlink {
namespace {

struct Allocation {
  uint64_t base;
  uint64_t size;
  bool cumem = true;             // false: cudaMalloc memory (no allocation handle)
  int handle_types = cu::kHandleTypePosixFd;
  int device = 0;
};

struct Fake {
  std::vector<Allocation> allocations;
  std::map<cu::MemHandle, int> retained;  // handle (index + 1) -> references held
};
Fake* fake = nullptr;

const Allocation* Find(uint64_t p, cu::MemHandle* handle = nullptr) {
  for (size_t i = 0; i < fake->allocations.size(); ++i) {
    const Allocation& a = fake->allocations[i];
    if (p >= a.base && p < a.base + a.size) {
      if (handle != nullptr) *handle = i + 1;
      return &a;
    }
  }
  return nullptr;
}

cu::Result AddressRange(cu::DevicePtr* base, size_t* size, cu::DevicePtr p) {
  const Allocation* a = Find(p);
  if (a == nullptr) return cu::kErrorInvalidValue;
  *base = a->base;
  *size = a->size;
  return cu::kSuccess;
}
cu::Result Retain(cu::MemHandle* h, void* p) {
  const Allocation* a = Find(reinterpret_cast<uint64_t>(p), h);
  if (a == nullptr || !a->cumem) return cu::kErrorInvalidValue;
  ++fake->retained[*h];
  return cu::kSuccess;
}
cu::Result Release(cu::MemHandle h) {
  if (--fake->retained[h] == 0) fake->retained.erase(h);
  return cu::kSuccess;
}
cu::Result Properties(cu::MemAllocationProp* prop, cu::MemHandle h) {
  const Allocation& a = fake->allocations.at(h - 1);
  prop->type = cu::kAllocationTypePinned;
  prop->requestedHandleTypes = a.handle_types;
  prop->location = {cu::kLocationTypeDevice, a.device};
  return cu::kSuccess;
}
cu::Result ErrorName(cu::Result, const char** s) {
  *s = "CUDA_ERROR_INVALID_VALUE";
  return cu::kSuccess;
}

constexpr uint64_t kBase = 0x7f0000000000;
constexpr uint64_t kChunk = 20 << 20;  // torch's large-pool segment size

class ExistingRangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake = &state_;
    driver_.MemGetAddressRange = AddressRange;
    driver_.MemRetainAllocationHandle = Retain;
    driver_.MemRelease = Release;
    driver_.MemGetAllocationPropertiesFromHandle = Properties;
    driver_.GetErrorName = ErrorName;
    driver_.GetErrorString = ErrorName;
  }
  void TearDown() override {
    EXPECT_TRUE(state_.retained.empty()) << state_.retained.size() << " allocations still retained";
    fake = nullptr;
  }
  // `n` chunks of `size` back to back from kBase.
  void Segment(size_t n, uint64_t size = kChunk) {
    for (size_t i = 0; i < n; ++i) state_.allocations.push_back({kBase + i * size, size});
  }

  Fake state_;
  cu::Driver driver_{};
};

TEST_F(ExistingRangeTest, ARangeInsideOneChunkIsThatChunkFromItsOffset) {
  Segment(3);
  auto r = FindExistingRange(driver_, kBase + kChunk + 4096, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->chunks.size(), 1u);
  EXPECT_EQ(r->chunks[0].base, kBase + kChunk);
  EXPECT_EQ(r->chunks[0].size, kChunk);
  EXPECT_EQ(r->offset, 4096u);
  EXPECT_EQ(r->device, 0);
  EXPECT_FALSE(r->Whole(1 << 20));
  EXPECT_EQ(state_.retained.size(), 1u);  // held while the range lives
}

TEST_F(ExistingRangeTest, AWholeAllocationIsOnePlainHandle) {
  Segment(1);
  auto r = FindExistingRange(driver_, kBase, kChunk);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->Whole(kChunk));
}

TEST_F(ExistingRangeTest, ARangeFromInsideOneChunkToInsideAnotherTakesEveryChunkBetween) {
  Segment(5);
  const uint64_t start = kBase + kChunk + 512;        // inside chunk 1
  const uint64_t size = 2 * kChunk + 100;             // ends inside chunk 3
  auto r = FindExistingRange(driver_, start, size);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->chunks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r->chunks[i].base, kBase + (i + 1) * kChunk);
  EXPECT_EQ(r->offset, 512u);
  std::vector<uint64_t> sizes;
  for (const ExistingChunk& c : r->chunks) sizes.push_back(c.size);
  // What podlinkd accepts is exactly what the client found.
  EXPECT_TRUE(CheckChunkLayout(sizes, r->offset, size).ok());
}

TEST_F(ExistingRangeTest, TwoHundredChunksAreFoundAndEachReleased) {
  Segment(210);
  const uint64_t start = kBase + 7 * kChunk + 3;
  const uint64_t size = 200 * kChunk - 6;  // 200 chunks, from byte 3 of the first to 3 before the last's end
  {
    auto r = FindExistingRange(driver_, start, size);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->chunks.size(), 200u);
    EXPECT_EQ(r->offset, 3u);
    EXPECT_EQ(r->chunks.back().base + r->chunks.back().size, start - 3 + 200 * kChunk);
    EXPECT_EQ(state_.retained.size(), 200u);
    ExistingRange moved(std::move(*r));
    EXPECT_EQ(moved.chunks.size(), 200u);
  }
  EXPECT_TRUE(state_.retained.empty());
}

TEST_F(ExistingRangeTest, OneChunkFromCudaMallocRefusesTheWholeRangeWithTheWayOut) {
  Segment(4);
  state_.allocations[2].cumem = false;
  auto r = FindExistingRange(driver_, kBase + 100, 3 * kChunk);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(r.status().message());
  EXPECT_NE(m.find("cudaMalloc"), std::string::npos) << m;
  EXPECT_NE(m.find("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), std::string::npos) << m;
  EXPECT_NE(m.find("alloc_gpu"), std::string::npos) << m;
  EXPECT_NE(m.find("byte " + std::to_string(2 * kChunk - 100)), std::string::npos) << m;  // where in the range
}

TEST_F(ExistingRangeTest, AChunkWithoutAShareableHandleTypeIsRefused) {
  Segment(3);
  state_.allocations[1].handle_types = 0;  // vLLM's CuMemAllocator: cuMemCreate with no requestedHandleTypes
  auto r = FindExistingRange(driver_, kBase, 3 * kChunk);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("without a shareable handle type"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("expandable_segments"), absl::string_view::npos) << r.status();
}

TEST_F(ExistingRangeTest, AHoleOrTheEndOfTheMappingIsRefused) {
  Segment(2);
  state_.allocations.push_back({kBase + 3 * kChunk, kChunk});  // a gap where chunk 2 would be
  auto r = FindExistingRange(driver_, kBase, 4 * kChunk);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not GPU memory mapped"), absl::string_view::npos) << r.status();
  EXPECT_FALSE(FindExistingRange(driver_, kBase + 10 * kChunk, 4096).ok());  // nothing there
  EXPECT_FALSE(FindExistingRange(driver_, kBase, 0).ok());
  EXPECT_FALSE(FindExistingRange(driver_, ~uint64_t{0} - 10, 4096).ok());  // wraps
}

TEST_F(ExistingRangeTest, ARangeOverTwoGpusIsRefused) {
  Segment(2);
  state_.allocations[1].device = 1;
  auto r = FindExistingRange(driver_, kBase, 2 * kChunk);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("two GPUs"), absl::string_view::npos) << r.status();
}

TEST_F(ExistingRangeTest, MoreChunksThanTheBoundAreRefusedNamingIt) {
  Segment(9, 2 << 20);
  auto r = FindExistingRange(driver_, kBase, 9 * (2 << 20), /*max_chunks=*/8);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 8 cuMem allocations"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("register it in parts"), absl::string_view::npos) << r.status();
  EXPECT_TRUE(FindExistingRange(driver_, kBase, 8 * (2 << 20), 8).ok());
}

TEST(ChunkLayout, WhatPodlinkdAcceptsBeforeLookingAtDescriptors) {
  const uint64_t c = kChunk;
  EXPECT_TRUE(CheckChunkLayout({c}, 0, c).ok());
  EXPECT_TRUE(CheckChunkLayout({c}, c - 1, 1).ok());
  EXPECT_TRUE(CheckChunkLayout({c, c, c}, 5, 2 * c + 1).ok());
  EXPECT_FALSE(CheckChunkLayout({}, 0, 1).ok());
  EXPECT_FALSE(CheckChunkLayout({c}, c, 1).ok());          // offset past the first
  EXPECT_FALSE(CheckChunkLayout({c}, 0, c + 1).ok());      // past the end
  EXPECT_FALSE(CheckChunkLayout({c}, 0, 0).ok());
  EXPECT_FALSE(CheckChunkLayout({c, c}, 0, c).ok());       // the second lies wholly past the end
  EXPECT_FALSE(CheckChunkLayout({c, 0, c}, 0, 3 * c).ok());
  EXPECT_FALSE(CheckChunkLayout({~uint64_t{0}, c}, 0, c).ok());  // sizes overflow
  EXPECT_FALSE(CheckChunkLayout({c, c}, 1, ~uint64_t{0}).ok());
}

}  // namespace
}  // namespace podlink
