// Hostile and broken clients against a live podlinkd: malformed and
// oversized requests, forged credentials, descriptors that lie, floods,
// clients vanishing mid-call. Each gets a clear error; others keep being
// served; the daemon leaks nothing.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/fd_channel.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "podlink/client.h"
#include "podlink/v1/podlink.grpc.pb.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

// A client speaking the wire protocol by hand, so it can misbehave.
struct RawClient {
  UniqueFd sock;
  uint64_t session = 0;
  std::string cred;
  std::unique_ptr<v1::Broker::Stub> stub;

  explicit RawClient(const std::string& dir) {
    sock.Reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s/podlink.fd.sock", dir.c_str());
    EXPECT_EQ(::connect(sock.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    auto hello = RecvFdMessage(sock.get(), false);
    EXPECT_TRUE(hello.ok() && hello->has_value());
    if (hello.ok() && hello->has_value()) {
      session = (*hello)->msg.seq;
      cred = absl::StrFormat("%d.%016x%016x", session, (*hello)->msg.a, (*hello)->msg.b);
    }
    stub = v1::Broker::NewStub(grpc::CreateChannel("unix:" + dir + "/podlink.sock", grpc::InsecureChannelCredentials()));
  }

  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (v1::Broker::Stub::*m)(grpc::ClientContext*, const Req&, Resp*), const Req& req,
                    Resp* resp, const std::string& credential) {
    grpc::ClientContext ctx;
    if (!credential.empty()) ctx.AddMetadata("x-podlink-session", credential);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return (stub.get()->*m)(&ctx, req, resp);
  }
  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (v1::Broker::Stub::*m)(grpc::ClientContext*, const Req&, Resp*), const Req& req,
                    Resp* resp) {
    return Call(m, req, resp, cred);
  }

  // Offers `fd` in `slot`; returns the ack's errno (0 = accepted).
  uint64_t Offer(int fd, uint64_t slot) {
    FdMessage m;
    m.type = static_cast<uint16_t>(FdMsgType::kOffer);
    m.seq = slot;
    EXPECT_TRUE(SendFdMessage(sock.get(), m, fd, false).ok());
    for (;;) {
      pollfd p{sock.get(), POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) {
        ADD_FAILURE() << "no ack";
        return ~0ull;
      }
      auto r = RecvFdMessage(sock.get(), false);
      if (!r.ok() || !r->has_value()) return ~0ull;
      if ((*r)->msg.type == static_cast<uint16_t>(FdMsgType::kOfferAck) && (*r)->msg.seq == slot) return (*r)->msg.a;
    }
  }
};

UniqueFd SealedMemfd(size_t size) {
  UniqueFd fd(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_EQ(::ftruncate(fd.get(), size), 0);
  EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  return fd;
}

v1::ExportRequest HostExport(uint64_t size, uint64_t slot) {
  v1::ExportRequest r;
  r.set_size(size);
  r.set_handle_type(v1::HANDLE_TYPE_HOST_MEMFD);
  r.set_fd_slot(slot);
  return r;
}

class HostileClients : public ::testing::Test {
 protected:
  HostileClients() : daemon_(R"({"limits": {"max_exports_per_session": 100, "max_pending_offers": 16}})") {}

  // A well-behaved client still gets served.
  void ExpectHealthy() {
    ASSERT_TRUE(daemon_.Alive()) << daemon_.Log();
    auto c = Client::Connect({.socket_dir = daemon_.dir()});
    ASSERT_TRUE(c.ok()) << c.status();
    auto b = (*c)->AllocateHost(4096);
    ASSERT_TRUE(b.ok());
    static_cast<char*>((*b)->data())[0] = 'k';
    auto id = (*c)->Export(**b);
    ASSERT_TRUE(id.ok()) << id.status();
    auto imp = (*c)->Import(*id);
    ASSERT_TRUE(imp.ok()) << imp.status();
    auto m = (*c)->Map(*imp);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(static_cast<char*>((*m)->host_ptr())[0], 'k');
  }

  Daemon daemon_;
};

TEST_F(HostileClients, ForgedOrMissingCredentials) {
  RawClient c(daemon_.dir());
  v1::NodeInfo n;
  for (const std::string& cred : {std::string(""), std::string("garbage"), std::string("1.zz"),
                                  absl::StrFormat("%d.%032x", c.session, 0),
                                  absl::StrFormat("%d.%s", c.session + 1000, c.cred.substr(c.cred.find('.') + 1))}) {
    grpc::Status s = c.Call(&v1::Broker::Stub::GetNodeInfo, v1::GetNodeInfoRequest(), &n, cred);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << cred;
    EXPECT_NE(s.error_message().find("x-podlink-session"), std::string::npos) << s.error_message();
  }
  EXPECT_TRUE(c.Call(&v1::Broker::Stub::GetNodeInfo, v1::GetNodeInfoRequest(), &n).ok());
  // The credential dies with the descriptor channel.
  std::string cred = c.cred;
  c.sock.Reset();
  grpc::Status s;
  for (int i = 0; i < 100; ++i) {
    s = c.Call(&v1::Broker::Stub::GetNodeInfo, v1::GetNodeInfoRequest(), &n, cred);
    if (!s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ExpectHealthy();
}

TEST_F(HostileClients, MalformedAndOversizedRequests) {
  RawClient c(daemon_.dir());
  v1::ExportResponse er;
  // No descriptor offered.
  grpc::Status s = c.Call(&v1::Broker::Stub::Export, HostExport(4096, 99), &er);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("slot 99"), std::string::npos) << s.error_message();
  // Unspecified handle type, zero and absurd sizes, bad names, too many importers.
  struct Case {
    std::function<void(v1::ExportRequest&)> mutate;
    grpc::StatusCode code;
    std::string mentions;
  };
  std::vector<Case> cases = {
      {[](auto& r) { r.set_handle_type(v1::HANDLE_TYPE_UNSPECIFIED); }, grpc::StatusCode::INVALID_ARGUMENT,
       "handle_type"},
      {[](auto& r) { r.set_size(0); }, grpc::StatusCode::INVALID_ARGUMENT, "out of range"},
      {[](auto& r) { r.set_size(~0ull); }, grpc::StatusCode::INVALID_ARGUMENT, "out of range"},
      {[](auto& r) { r.set_name("has/slash"); }, grpc::StatusCode::INVALID_ARGUMENT, "export name"},
      {[](auto& r) { r.set_name(std::string(201, 'a')); }, grpc::StatusCode::INVALID_ARGUMENT, "export name"},
      {[](auto& r) {
         auto* p = r.add_allowed_importers();
         p->set_namespace_("BAD NS");
         p->set_name("x");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "allowed_importers"},
      {[](auto& r) {
         for (int i = 0; i < 65; ++i) {
           auto* p = r.add_allowed_importers();
           p->set_namespace_("ns");
           p->set_name("p" + std::to_string(i));
         }
       },
       grpc::StatusCode::INVALID_ARGUMENT, "at most 64"},
      {[](auto& r) { r.set_size(1 << 20); }, grpc::StatusCode::INVALID_ARGUMENT, "holds only 4096"},
      {[](auto& r) {
         r.set_handle_type(v1::HANDLE_TYPE_POSIX_FD);
         r.set_gpu_uuid("GPU-00000000-0000-0000-0000-000000000000");
       },
       grpc::StatusCode::FAILED_PRECONDITION, "not served"},
      {[](auto& r) {
         r.set_handle_type(v1::HANDLE_TYPE_FABRIC);
         r.set_fabric_handle(std::string(64, 'x'));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "fd_slot"},
  };
  uint64_t slot = 1;
  for (const Case& cs : cases) {
    UniqueFd fd = SealedMemfd(4096);
    ASSERT_EQ(c.Offer(fd.get(), slot), 0u);
    v1::ExportRequest req = HostExport(4096, slot);
    cs.mutate(req);
    s = c.Call(&v1::Broker::Stub::Export, req, &er);
    EXPECT_EQ(s.error_code(), cs.code) << cs.mentions << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(cs.mentions), std::string::npos) << s.error_message();
    ++slot;
  }
  // A request far above the size limit is refused by the transport.
  v1::ExportRequest huge = HostExport(4096, 1);
  huge.set_name(std::string(1 << 20, 'a'));
  s = c.Call(&v1::Broker::Stub::Export, huge, &er);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // Unknown ids and names.
  v1::ImportRequest ir;
  v1::ImportResponse iresp;
  ir.set_export_id(123456);
  s = c.Call(&v1::Broker::Stub::Import, ir, &iresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  ir.set_name("nope");
  EXPECT_EQ(c.Call(&v1::Broker::Stub::Import, ir, &iresp).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(c.Call(&v1::Broker::Stub::Import, v1::ImportRequest(), &iresp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::ReleaseRequest rr;
  v1::ReleaseResponse rresp;
  rr.set_export_id(777);
  EXPECT_EQ(c.Call(&v1::Broker::Stub::Release, rr, &rresp).error_code(), grpc::StatusCode::NOT_FOUND);
  ExpectHealthy();
}

TEST_F(HostileClients, DescriptorsThatLie) {
  RawClient c(daemon_.dir());
  v1::ExportResponse er;
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  UniqueFd r(p[0]), w(p[1]);
  ASSERT_EQ(c.Offer(r.get(), 1), 0u);
  grpc::Status s = c.Call(&v1::Broker::Stub::Export, HostExport(4096, 1), &er);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not a memfd"), std::string::npos) << s.error_message();
  // The slot was consumed: no second try with the same descriptor.
  EXPECT_EQ(c.Call(&v1::Broker::Stub::Export, HostExport(4096, 1), &er).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // Unsealed memfd: an importer's mapping could be truncated under it.
  UniqueFd unsealed(::memfd_create("u", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(unsealed.get(), 4096), 0);
  ASSERT_EQ(c.Offer(unsealed.get(), 2), 0u);
  s = c.Call(&v1::Broker::Stub::Export, HostExport(4096, 2), &er);
  EXPECT_NE(s.error_message().find("not sealed"), std::string::npos) << s.error_message();
  // A descriptor offered with a duplicate slot number is refused.
  UniqueFd m1 = SealedMemfd(4096), m2 = SealedMemfd(4096);
  ASSERT_EQ(c.Offer(m1.get(), 5), 0u);
  EXPECT_EQ(c.Offer(m2.get(), 5), static_cast<uint64_t>(EEXIST));
  ExpectHealthy();
}

TEST_F(HostileClients, GarbageOnTheDescriptorChannelEndsOnlyThatSession) {
  int fds_before = daemon_.OpenFds();
  {
    RawClient bad(daemon_.dir());
    ASSERT_EQ(::send(bad.sock.get(), "garbage!", 8, 0), 8);
    // The daemon hangs up on it.
    pollfd p{bad.sock.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    char b[64];
    EXPECT_EQ(::recv(bad.sock.get(), b, sizeof(b), 0), 0);
  }
  {
    RawClient bad(daemon_.dir());
    FdMessage m;
    m.type = static_cast<uint16_t>(FdMsgType::kDeliver);  // not a client's message
    ASSERT_TRUE(SendFdMessage(bad.sock.get(), m, -1, false).ok());
    pollfd p{bad.sock.get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
  }
  ExpectHealthy();
  for (int i = 0; i < 100 && daemon_.OpenFds() != fds_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(daemon_.OpenFds(), fds_before);
  EXPECT_NE(daemon_.Log().find("protocol violation"), std::string::npos);
}

TEST_F(HostileClients, FloodsHitLimitsNotTheDaemon) {
  RawClient c(daemon_.dir());
  // Offers without exports: capped at max_pending_offers (16).
  std::vector<UniqueFd> keep;
  int accepted = 0, refused = 0;
  for (uint64_t slot = 1; slot <= 40; ++slot) {
    keep.push_back(SealedMemfd(4096));
    uint64_t err = c.Offer(keep.back().get(), slot);
    if (err == 0) {
      ++accepted;
    } else {
      ++refused;
      EXPECT_EQ(err, static_cast<uint64_t>(EMFILE));
    }
  }
  EXPECT_EQ(accepted, 16);
  EXPECT_EQ(refused, 24);
  // Consume the pending offers as exports, then go past the export limit (100).
  for (uint64_t slot = 1; slot <= 16; ++slot) {
    v1::ExportResponse er;
    ASSERT_TRUE(c.Call(&v1::Broker::Stub::Export, HostExport(4096, slot), &er).ok());
  }
  grpc::Status last;
  int ok = 16;
  for (uint64_t slot = 100; slot < 200; ++slot) {
    UniqueFd fd = SealedMemfd(4096);
    ASSERT_EQ(c.Offer(fd.get(), slot), 0u);
    v1::ExportResponse er;
    last = c.Call(&v1::Broker::Stub::Export, HostExport(4096, slot), &er);
    if (!last.ok()) break;
    ++ok;
  }
  EXPECT_EQ(ok, 100);
  EXPECT_EQ(last.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(last.error_message().find("per-session limit"), std::string::npos) << last.error_message();
  // Many RPCs from many threads at once.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        v1::ListResponse lr;
        if (!c.Call(&v1::Broker::Stub::List, v1::ListRequest(), &lr).ok() || lr.exports_size() != 100) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ExpectHealthy();
}

TEST_F(HostileClients, ClientThatNeverReadsItsChannel) {
  // Exports to import, from a healthy client.
  auto owner = Client::Connect({.socket_dir = daemon_.dir()});
  ASSERT_TRUE(owner.ok());
  auto b = (*owner)->AllocateHost(4096);
  auto id = (*owner)->Export(**b);
  ASSERT_TRUE(id.ok());
  // A raw client imports over and over and never reads its deliveries: the
  // socket fills up and the daemon refuses further imports instead of blocking.
  RawClient c(daemon_.dir());
  int delivered = 0;
  grpc::Status s;
  for (int i = 0; i < 5000; ++i) {
    v1::ImportRequest ir;
    ir.set_export_id(*id);
    v1::ImportResponse resp;
    s = c.Call(&v1::Broker::Stub::Import, ir, &resp);
    if (!s.ok()) break;
    ++delivered;
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << "after " << delivered << " deliveries";
  EXPECT_NE(s.error_message().find("not reading"), std::string::npos) << s.error_message();
  EXPECT_GT(delivered, 0);
  ExpectHealthy();
}

TEST_F(HostileClients, ClientsVanishingMidCall) {
  int fds_before = daemon_.OpenFds();
  for (int i = 0; i < 50; ++i) {
    // Offer and vanish before the ack.
    RawClient c(daemon_.dir());
    UniqueFd fd = SealedMemfd(4096);
    FdMessage m;
    m.type = static_cast<uint16_t>(FdMsgType::kOffer);
    m.seq = 1;
    ASSERT_TRUE(SendFdMessage(c.sock.get(), m, fd.get(), false).ok());
  }
  for (int i = 0; i < 50; ++i) {
    // Start an Export and close the descriptor channel while it runs.
    RawClient c(daemon_.dir());
    UniqueFd fd = SealedMemfd(1 << 20);
    ASSERT_EQ(c.Offer(fd.get(), 1), 0u);
    std::thread t([&] {
      v1::ExportResponse er;
      c.Call(&v1::Broker::Stub::Export, HostExport(1 << 20, 1), &er);
    });
    c.sock.Reset();
    t.join();
  }
  // Connect and hang up before reading HELLO.
  for (int i = 0; i < 50; ++i) {
    int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s/podlink.fd.sock", daemon_.dir().c_str());
    ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::close(s);
  }
  ExpectHealthy();
  {
    // Every vanished client's exports were dropped.
    auto probe = Client::Connect({.socket_dir = daemon_.dir()});
    ASSERT_TRUE(probe.ok());
    absl::StatusOr<std::vector<ExportInfo>> list;
    for (int i = 0; i < 200; ++i) {
      list = (*probe)->List();
      ASSERT_TRUE(list.ok());
      if (list->empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(list->empty());
  }
  // And their descriptors: back to where we started once the probe is gone.
  int fds = daemon_.OpenFds();
  for (int i = 0; i < 300 && fds != fds_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    fds = daemon_.OpenFds();
  }
  EXPECT_EQ(fds, fds_before);
}

}  // namespace
}  // namespace podlink::testing
