// The NCCL plugin's mesh transport against a hostile peer on its control
// socket (a socketpair; no daemon): whatever the other pod sends — a
// malformed or lying node message, clear-to-send frames out of range, out of
// order or without end, completions for receives that do not exist, twice,
// or larger than the buffer — fails that comm with an error, never a crash,
// and never completes a receive that did not get its bytes.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/transport_mesh.h"
#include "gtest/gtest.h"

namespace podlink::ncclnet {
namespace {

class MeshWire : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    mine_.Reset(fds[0]);
    theirs_.Reset(fds[1]);
    State& s = S();
    s.node_id = "node-here";
    RegionDescriptor d;
    d.node_id = "node-here";
    d.node_name = "here";
    d.mesh_port = 7000;
    d.mesh_addresses = {"10.0.0.1/24"};
    s.mesh_node = d.Serialize();
  }
  void TearDown() override {
    S().node_id.clear();
    S().mesh_node.clear();
  }

  void Peer(const void* p, size_t n) { ASSERT_EQ(::write(theirs_.get(), p, n), static_cast<ssize_t>(n)); }
  void PeerNode(const std::string& text, uint32_t magic = kMeshNodeMagic, uint32_t len = ~0u) {
    MeshNode m{};
    m.magic = magic;
    m.len = len == ~0u ? static_cast<uint32_t>(text.size()) : len;
    std::memcpy(m.text, text.data(), std::min(text.size(), sizeof(m.text)));
    Peer(&m, sizeof(m));
  }
  static std::string OtherNode() {
    RegionDescriptor d;
    d.node_id = "node-there";
    d.node_name = "there";
    d.mesh_port = 7000;
    d.mesh_addresses = {"10.0.0.2/24"};
    return d.Serialize();
  }
  static MeshFrame Cts(uint64_t seq, uint32_t n, int tag = 7) {
    MeshFrame f{};
    f.type = kMeshCts;
    f.seq = seq;
    f.n = n;
    for (uint32_t i = 0; i < n && i < kMaxRecvs; ++i) {
      f.tags[i] = tag;
      f.sizes[i] = 4096;
      f.exports[i] = 100 + i;
    }
    return f;
  }
  // A sender's isend of 16 bytes: its result and whether a request came back.
  Result Send(MeshComm& c, bool* got_request) {
    static char data[16];
    PodlinkMr mr;
    mr.base = data;
    mr.size = sizeof(data);
    mr.type = nccl_abi::kPtrHost;
    void* req = nullptr;
    Result r = c.Isend(data, sizeof(data), 7, &mr, &req);
    *got_request = req != nullptr;
    return r;
  }

  UniqueFd mine_, theirs_;
};

TEST_F(MeshWire, ASenderRefusesALyingOrMalformedNodeMessage) {
  struct Case {
    const char* what;
    std::string text;
    uint32_t magic;
    uint32_t len;
  };
  const Case cases[] = {
      {"wrong magic", OtherNode(), 0x41414141, ~0u},
      {"length past the message", OtherNode(), kMeshNodeMagic, 5000},
      {"not a descriptor", "hello", kMeshNodeMagic, ~0u},
      {"no mesh addresses", "podlink1;node-there;0;0;3;", kMeshNodeMagic, ~0u},
      {"this very node", [] {
         RegionDescriptor d;
         d.node_id = "node-here";
         d.node_name = "here";
         d.mesh_port = 7000;
         d.mesh_addresses = {"10.0.0.1/24"};
         return d.Serialize();
       }(),
       kMeshNodeMagic, ~0u},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TearDown();
    SetUp();
    MeshComm comm(/*send=*/true, 0, "peer", std::move(mine_));
    PeerNode(c.text, c.magic, c.len);
    bool req = false;
    EXPECT_EQ(Send(comm, &req), nccl_abi::kRemoteError);
    EXPECT_FALSE(req);
    EXPECT_EQ(comm.failed, nccl_abi::kRemoteError);
  }
}

TEST_F(MeshWire, ASenderRefusesClearToSendFramesOutOfRangeOrOrder) {
  struct Case {
    const char* what;
    MeshFrame f;
  };
  MeshFrame wrong_type = Cts(0, 1);
  wrong_type.type = kMeshDone;
  const Case cases[] = {
      {"no buffers", Cts(0, 0)},
      {"more buffers than a grouped receive has", Cts(0, kMaxRecvs + 1)},
      {"a completion frame", wrong_type},
      {"out of order", Cts(5, 1)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TearDown();
    SetUp();
    MeshComm comm(true, 0, "peer", std::move(mine_));
    PeerNode(OtherNode());
    Peer(&c.f, sizeof(c.f));
    bool req = false;
    EXPECT_NE(Send(comm, &req), nccl_abi::kSuccess);
    EXPECT_FALSE(req);
  }
}

TEST_F(MeshWire, ASenderBoundsTheClearToSendItQueues) {
  MeshComm comm(true, 0, "peer", std::move(mine_));
  PeerNode(OtherNode());
  // More receives than NCCL ever posts at once, all queued before the sender looks.
  for (uint64_t i = 0; i <= 2 * kMaxRequests; ++i) {
    MeshFrame f = Cts(i, 1);
    Peer(&f, sizeof(f));
  }
  bool req = false;
  EXPECT_EQ(Send(comm, &req), nccl_abi::kRemoteError);
  EXPECT_FALSE(req);
}

TEST_F(MeshWire, ASenderWhoseReceiverWentAwayFails) {
  MeshComm comm(true, 0, "peer", std::move(mine_));
  PeerNode(OtherNode());
  theirs_.Reset();
  bool req = false;
  EXPECT_EQ(Send(comm, &req), nccl_abi::kRemoteError);
  EXPECT_FALSE(req);
}

class MeshWireRecv : public MeshWire {
 protected:
  // Posts one receive of `n` buffers of 4096 bytes (fake exports; no daemon is asked).
  void* Post(MeshComm& c, int n) {
    void* data[kMaxRecvs];
    size_t sizes[kMaxRecvs];
    int tags[kMaxRecvs];
    Mr* mrs[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
      mrs_[i].base = bufs_[i];
      mrs_[i].size = sizeof(bufs_[i]);
      mrs_[i].type = nccl_abi::kPtrHost;
      mrs_[i].region.export_id = 200 + i;
      data[i] = bufs_[i];
      sizes[i] = sizeof(bufs_[i]);
      tags[i] = 7;
      mrs[i] = &mrs_[i];
    }
    void* req = nullptr;
    EXPECT_EQ(c.Irecv(n, data, sizes, tags, mrs, &req), nccl_abi::kSuccess);
    return req;
  }
  static MeshFrame Done(uint64_t seq, uint32_t index, uint64_t size) {
    MeshFrame f{};
    f.type = kMeshDone;
    f.seq = seq;
    f.index = index;
    f.sizes[0] = size;
    return f;
  }
  Result Test(MeshComm& c, void* req, int* done) {
    int sizes[kMaxRecvs] = {};
    *done = 0;
    return c.Test(*static_cast<Request*>(req), done, sizes);
  }
  // Host bounce buffers are not needed here: the buffers are "exported" as they are.
  PodlinkMr mrs_[kMaxRecvs];
  char bufs_[kMaxRecvs][4096];
};

TEST_F(MeshWireRecv, AReceiverCompletesOnlyWhatItPostedOnceEach) {
  MeshComm comm(/*send=*/false, 0, "peer", std::move(mine_));
  Welcome w{};
  ASSERT_EQ(comm.SetupReceiver(w), nccl_abi::kSuccess);
  void* req = Post(comm, 2);
  ASSERT_NE(req, nullptr);
  // The node message and one clear-to-send reached the peer.
  MeshNode node{};
  ASSERT_EQ(::read(theirs_.get(), &node, sizeof(node)), static_cast<ssize_t>(sizeof(node)));
  EXPECT_EQ(node.magic, kMeshNodeMagic);
  MeshFrame cts{};
  ASSERT_EQ(::read(theirs_.get(), &cts, sizeof(cts)), static_cast<ssize_t>(sizeof(cts)));
  EXPECT_EQ(cts.type, kMeshCts);
  EXPECT_EQ(cts.n, 2u);
  EXPECT_EQ(cts.exports[1], 201u);
  MeshFrame one = Done(0, 0, 4096);
  Peer(&one, sizeof(one));
  int done = 0;
  EXPECT_EQ(Test(comm, req, &done), nccl_abi::kSuccess);
  EXPECT_EQ(done, 0) << "one of two buffers is not a complete receive";
  MeshFrame two = Done(0, 1, 100);
  Peer(&two, sizeof(two));
  EXPECT_EQ(Test(comm, req, &done), nccl_abi::kSuccess);
  EXPECT_EQ(done, 1);
}

TEST_F(MeshWireRecv, AReceiverRefusesLyingCompletions) {
  struct Case {
    const char* what;
    MeshFrame f;
  };
  MeshFrame cts_type = Done(0, 0, 1);
  cts_type.type = kMeshCts;
  const Case cases[] = {
      {"an unknown receive", Done(3, 0, 1)},
      {"a buffer past the receive's", Done(0, 1, 1)},
      {"more bytes than the buffer holds", Done(0, 0, 4097)},
      {"a clear-to-send frame", cts_type},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TearDown();
    SetUp();
    MeshComm comm(false, 0, "peer", std::move(mine_));
    void* req = Post(comm, 1);
    ASSERT_NE(req, nullptr);
    Peer(&c.f, sizeof(c.f));
    int done = 0;
    EXPECT_EQ(Test(comm, req, &done), nccl_abi::kRemoteError);
    EXPECT_EQ(done, 0);
  }
  // The same completion twice.
  TearDown();
  SetUp();
  MeshComm comm(false, 0, "peer", std::move(mine_));
  void* a = Post(comm, 2);
  ASSERT_NE(a, nullptr);
  MeshFrame f = Done(0, 0, 1);
  Peer(&f, sizeof(f));
  Peer(&f, sizeof(f));
  int done = 0;
  EXPECT_EQ(Test(comm, a, &done), nccl_abi::kRemoteError);
  EXPECT_EQ(done, 0);
}

TEST_F(MeshWireRecv, AFailedSendIsAnErrorForTheReceive) {
  MeshComm comm(false, 0, "peer", std::move(mine_));
  void* req = Post(comm, 1);
  ASSERT_NE(req, nullptr);
  MeshFrame f = Done(0, 0, kSizeError);
  Peer(&f, sizeof(f));
  int done = 0;
  EXPECT_EQ(Test(comm, req, &done), nccl_abi::kInvalidUsage);
  EXPECT_EQ(done, 1);
}

TEST_F(MeshWireRecv, AReceiverWhoseSenderWentAwayFailsInsteadOfWaiting) {
  MeshComm comm(false, 0, "peer", std::move(mine_));
  void* req = Post(comm, 1);
  ASSERT_NE(req, nullptr);
  theirs_.Reset();
  int done = 0;
  EXPECT_EQ(Test(comm, req, &done), nccl_abi::kRemoteError);
  EXPECT_EQ(done, 0);
}

}  // namespace
}  // namespace podlink::ncclnet
