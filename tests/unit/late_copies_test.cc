// The late-copy guard both transports' owners keep (daemon/mesh/links/late_copies.h), without sockets or queue pairs.
#include "daemon/mesh/links/late_copies.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace podlink::mesh {
namespace {

using Key = LateCopies::Key;

TEST(LateCopies, AWriteOfAFinishedTransferIsLateAndOthersAreNot) {
  LateCopies late;
  const Key k{"node-a", 7, 1};
  EXPECT_FALSE(late.Finished(k));
  ASSERT_TRUE(late.BeginWrite(k));
  EXPECT_TRUE(late.Writing(k));
  late.Finish(k);
  EXPECT_TRUE(late.Finished(k));
  EXPECT_FALSE(late.BeginWrite(k)) << "a copy of a finished transfer would land";
  EXPECT_TRUE(late.EndWrite(k)) << "the one write in progress was the last";
  EXPECT_FALSE(late.Writing(k));
  // The same number of another link instance or node is another transfer.
  EXPECT_TRUE(late.BeginWrite({"node-a", 8, 1}));
  EXPECT_TRUE(late.BeginWrite({"node-b", 7, 1}));
  EXPECT_EQ(late.Entries(), 1u);
}

TEST(LateCopies, OnlyTheLastWriteEndsTheTransfersWritesAndADoneWaitsForIt) {
  LateCopies late;
  const Key k{"node-a", 7, 3};
  ASSERT_TRUE(late.BeginWrite(k));
  ASSERT_TRUE(late.BeginWrite(k));
  EXPECT_FALSE(late.EndWrite(k));
  EXPECT_FALSE(late.AwaitWrites(k, absl::Milliseconds(20))) << "one write is still landing";
  std::atomic<bool> ended{false};
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ended = true;
    EXPECT_TRUE(late.EndWrite(k));
  });
  EXPECT_TRUE(late.AwaitWrites(k, absl::Seconds(20)));
  EXPECT_TRUE(ended.load()) << "the wait ended before the write did";
  writer.join();
  EXPECT_FALSE(late.EndWrite(k)) << "an end without a begin counts nothing";
}

TEST(LateCopies, DoneFramesOfInventedTransfersAndInstancesGrowOnlyTheSendersShare) {
  LateCopies late(LateCopies::Limits{64, 4, 16, absl::Minutes(1)});
  const Key victim{"node-v", 1, 5};
  late.Finish(victim);
  // A flood from node-x: many transfers of one instance, then many instances.
  for (uint64_t t = 0; t < 1000; ++t) late.Finish({"node-x", 1, t});
  EXPECT_TRUE(late.Finished({"node-x", 1, 999}));
  EXPECT_FALSE(late.Finished({"node-x", 1, 0})) << "an instance keeps its newest transfers only";
  for (uint64_t i = 2; i < 100; ++i) late.Finish({"node-x", i, 0});
  EXPECT_LE(late.Entries(), 1u + 4 * 64);
  EXPECT_TRUE(late.Finished(victim)) << "another node's flood pushed out node-v's transfer";
  // Past the bound of senders in all, the table stays bounded.
  for (int n = 0; n < 40; ++n) late.Finish({"node-" + std::to_string(n), 1, 1});
  EXPECT_LE(late.Entries(), 16u * 64);
}

TEST(LateCopies, EndedTransfersAreForgottenOnceOlderThanKept) {
  LateCopies late(LateCopies::Limits{64, 4, 16, absl::Milliseconds(10)});
  late.Finish({"node-a", 1, 1});
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // expiry walks at most once a second
  late.Finish({"node-b", 1, 1});
  EXPECT_FALSE(late.Finished({"node-a", 1, 1}));
  EXPECT_TRUE(late.Finished({"node-b", 1, 1}));
  EXPECT_EQ(late.Entries(), 1u);
}

}  // namespace
}  // namespace podlink::mesh
