// The NCCL plugin's TCP transport on its own sockets (socketpairs; no
// daemon, no NCCL): small sends from host memory travel inline behind their
// frame on the control socket, and a receiver takes them whole, split over
// any number of reads, mixed with payloads on the data sockets. A peer that
// announces an inline payload larger than the receive or than the limit, or
// closes in the middle of one, fails the comm with an error; no receive
// completes without its bytes.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "client-lib/nccl/net_socket.h"
#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/transport_tcp.h"
#include "gtest/gtest.h"

namespace podlink::ncclnet {
namespace {

std::pair<UniqueFd, UniqueFd> Pair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Reads exactly n bytes from a non-blocking socket, waiting at most ~2 s.
std::string ReadExactly(int fd, size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  for (int i = 0; i < 2000 && got < n; ++i) {
    ssize_t r = ::recv(fd, out.data() + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else {
      ::usleep(1000);
    }
  }
  out.resize(got);
  return out;
}

class TcpWire : public ::testing::Test {
 protected:
  // One comm of the given side, its control and data sockets' far ends kept
  // here for the test to play the peer.
  std::unique_ptr<TcpComm> Make(bool send) {
    auto [ctrl, ctrl_peer] = Pair();
    auto [data, data_peer] = Pair();
    ctrl_ = std::move(ctrl_peer);
    data_ = std::move(data_peer);
    std::vector<UniqueFd> d;
    d.push_back(std::move(data));
    return std::make_unique<TcpComm>(send, 0, "peer", std::move(ctrl), std::move(d));
  }
  void Peer(const void* p, size_t n) { ASSERT_EQ(::write(ctrl_.get(), p, n), static_cast<ssize_t>(n)); }
  static Frame Data(uint64_t seq, uint64_t size, uint32_t type = kFrameDataInline) {
    Frame f{};
    f.type = type;
    f.seq = seq;
    f.index = 0;
    f.sizes[0] = size;
    return f;
  }
  // Posts one receive of `room` bytes and takes its clear-to-send frame off
  // the control socket.
  void* Receive(TcpComm& c, std::vector<char>& buf, size_t room) {
    buf.assign(room, 0);
    Mr* mr = nullptr;
    EXPECT_EQ(c.RegMr(buf.data(), buf.size(), nccl_abi::kPtrHost, &mr), nccl_abi::kSuccess);
    mrs_.emplace_back(mr);
    void* data = buf.data();
    size_t size = room;
    int tag = 7;
    void* req = nullptr;
    EXPECT_EQ(c.Irecv(1, &data, &size, &tag, &mr, &req), nccl_abi::kSuccess);
    EXPECT_NE(req, nullptr);
    std::string cts = ReadExactly(ctrl_.get(), sizeof(Frame));
    EXPECT_EQ(cts.size(), sizeof(Frame));
    return req;
  }
  // Posts one send of `buf` (tag 7) from host memory, retried while the
  // comm has no clear-to-send yet (at most ~200 ms); its request or null.
  void* Send(TcpComm& c, std::vector<char>& buf) {
    Mr* mr = nullptr;
    EXPECT_EQ(c.RegMr(buf.data(), buf.size(), nccl_abi::kPtrHost, &mr), nccl_abi::kSuccess);
    mrs_.emplace_back(mr);
    void* req = nullptr;
    for (int i = 0; i < 200 && req == nullptr; ++i) {
      EXPECT_EQ(c.Isend(buf.data(), buf.size(), 7, mr, &req), nccl_abi::kSuccess);
      if (req == nullptr) ::usleep(1000);
    }
    return req;
  }
  static Result Poll(TcpComm& c, void* req, int* done, int* size, int rounds = 200) {
    Result r = nccl_abi::kSuccess;
    for (int i = 0; i < rounds && r == nccl_abi::kSuccess && !*done; ++i) {
      r = c.Test(*static_cast<Request*>(req), done, size);
      if (!*done) ::usleep(1000);
    }
    return r;
  }

  UniqueFd ctrl_, data_;
  std::vector<std::unique_ptr<Mr>> mrs_;
};

TEST_F(TcpWire, ASmallSendFromHostMemoryTravelsInlineAndIsDoneOnceWritten) {
  auto c = Make(/*send=*/true);
  Frame cts{};
  cts.type = kFrameCts;
  cts.seq = 0;
  cts.n = 1;
  cts.tags[0] = 7;
  cts.sizes[0] = 4096;
  Peer(&cts, sizeof(cts));
  std::vector<char> buf(100);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 3 + 1);
  void* req = Send(*c, buf);
  ASSERT_NE(req, nullptr);
  int done = 0, size = -1;
  ASSERT_EQ(Poll(*c, req, &done, &size), nccl_abi::kSuccess);
  ASSERT_EQ(done, 1);
  EXPECT_EQ(size, 100);
  std::memset(buf.data(), 0x55, buf.size());  // the buffer is NCCL's again: the bytes already left
  std::string wire = ReadExactly(ctrl_.get(), sizeof(Frame) + 100);
  ASSERT_EQ(wire.size(), sizeof(Frame) + 100);
  Frame f;
  std::memcpy(&f, wire.data(), sizeof(f));
  EXPECT_EQ(f.type, kFrameDataInline);
  EXPECT_EQ(f.seq, 0u);
  EXPECT_EQ(f.sizes[0], 100u);
  for (size_t i = 0; i < 100; ++i) ASSERT_EQ(wire[sizeof(Frame) + i], static_cast<char>(i * 3 + 1)) << i;
  char spare;
  EXPECT_EQ(::recv(data_.get(), &spare, 1, MSG_DONTWAIT), -1) << "nothing travels on the data socket";
}

TEST_F(TcpWire, ALargeSendStillGoesToTheDataSockets) {
  auto c = Make(true);
  Frame cts{};
  cts.type = kFrameCts;
  cts.n = 1;
  cts.tags[0] = 7;
  cts.sizes[0] = 1 << 20;
  Peer(&cts, sizeof(cts));
  std::vector<char> buf(kMaxInlinePayload + 1, 'x');
  void* req = Send(*c, buf);
  ASSERT_NE(req, nullptr);
  std::string wire = ReadExactly(ctrl_.get(), sizeof(Frame));
  ASSERT_EQ(wire.size(), sizeof(Frame));
  Frame f;
  std::memcpy(&f, wire.data(), sizeof(f));
  EXPECT_EQ(f.type, kFrameData);
  int done = 0, size = -1;
  std::string payload;
  for (int i = 0; i < 2000 && !done; ++i) {
    ASSERT_EQ(c->Test(*static_cast<Request*>(req), &done, &size), nccl_abi::kSuccess);
    char chunk[65536];
    ssize_t r = ::recv(data_.get(), chunk, sizeof(chunk), MSG_DONTWAIT);
    if (r > 0) payload.append(chunk, static_cast<size_t>(r));
  }
  payload += ReadExactly(data_.get(), buf.size() - payload.size());
  EXPECT_EQ(payload, std::string(buf.begin(), buf.end()));
}

TEST_F(TcpWire, AReceiverTakesAnInlinePayloadSplitOverReadsAndThenAPiece) {
  auto c = Make(/*send=*/false);
  std::vector<char> a, b;
  void* ra = Receive(*c, a, 4096);
  void* rb = Receive(*c, b, 4096);
  Frame f = Data(0, 100);
  Peer(&f, sizeof(f));
  std::string payload(100, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i + 9);
  Peer(payload.data(), 40);
  int done = 0, size = -1;
  EXPECT_EQ(Poll(*c, ra, &done, &size, 5), nccl_abi::kSuccess);
  EXPECT_EQ(done, 0) << "complete with 60 of its 100 bytes still due";
  Peer(payload.data() + 40, 60);
  // The second message's frame follows on the control socket; its bytes come
  // on the data socket.
  Frame g = Data(1, 3000, kFrameData);
  Peer(&g, sizeof(g));
  std::string piece(3000, 'p');
  ASSERT_EQ(::write(data_.get(), piece.data(), piece.size()), 3000);
  ASSERT_EQ(Poll(*c, ra, &done, &size), nccl_abi::kSuccess);
  ASSERT_EQ(done, 1);
  EXPECT_EQ(size, 100);
  EXPECT_EQ(std::string(a.data(), 100), payload);
  done = 0;
  ASSERT_EQ(Poll(*c, rb, &done, &size), nccl_abi::kSuccess);
  ASSERT_EQ(done, 1);
  EXPECT_EQ(size, 3000);
  EXPECT_EQ(std::string(b.data(), 3000), piece);
}

TEST_F(TcpWire, AnInlinePayloadTooLargeFailsTheComm) {
  struct Case {
    const char* what;
    size_t room;
    uint64_t size;
  };
  const Case cases[] = {
      {"larger than the receive", 4096, 4097},
      {"larger than any inline payload", 1 << 20, kMaxInlinePayload + 1},
      {"the error size", 4096, kSizeError},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    auto c = Make(false);
    std::vector<char> buf;
    void* req = Receive(*c, buf, k.room);
    Frame f = Data(0, k.size);
    Peer(&f, sizeof(f));
    int done = 0, size = -1;
    EXPECT_EQ(Poll(*c, req, &done, &size), nccl_abi::kRemoteError);
    EXPECT_EQ(done, 0);
    EXPECT_EQ(c->failed, nccl_abi::kRemoteError);
  }
}

TEST_F(TcpWire, APeerClosingInTheMiddleOfAnInlinePayloadFailsTheReceive) {
  auto c = Make(false);
  std::vector<char> buf;
  void* req = Receive(*c, buf, 4096);
  Frame f = Data(0, 1000);
  Peer(&f, sizeof(f));
  std::string half(500, 'h');
  Peer(half.data(), half.size());
  ctrl_.Reset();
  int done = 0, size = -1;
  EXPECT_EQ(Poll(*c, req, &done, &size), nccl_abi::kRemoteError);
  EXPECT_EQ(done, 0);
}

}  // namespace
}  // namespace podlink::ncclnet

namespace podlink::ncclnet {
namespace {

// Without podlinkd the plugin reports its interface's speed as NET/Socket
// does: NCCL's choice of protocol follows it.
TEST(TcpSpeed, TheInterfaceSpeedIsWhatNetSocketWouldReport) {
  char tmpl[] = "/tmp/podlink-sysfs-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  auto speed = [&](const std::string& dev, const std::string& text) {
    ASSERT_EQ(std::system(("mkdir -p " + root + "/" + dev).c_str()), 0);
    std::ofstream(root + "/" + dev + "/speed") << text;
  };
  speed("eth0", "100000\n");
  speed("veth0", "-1\n");  // what an unknown speed reads as
  speed("odd0", "fast\n");
  EXPECT_EQ(InterfaceSpeedMbps("eth0", root), 100000);
  EXPECT_EQ(InterfaceSpeedMbps("veth0", root), 10000);
  EXPECT_EQ(InterfaceSpeedMbps("odd0", root), 10000);
  EXPECT_EQ(InterfaceSpeedMbps("missing0", root), 10000);
  EXPECT_EQ(InterfaceSpeedMbps("../eth0", root + "/veth0"), 10000);  // a name is never a path
  EXPECT_EQ(InterfaceSpeedMbps("", root), 10000);
  std::system(("rm -rf " + root).c_str());
}

}  // namespace
}  // namespace podlink::ncclnet
