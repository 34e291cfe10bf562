// Hostile and broken clients against a live podlinkd: malformed and
// oversized requests, forged credentials, descriptors that lie, floods,
// clients vanishing mid-call. Each gets a clear error; others keep being
// served; the daemon leaks nothing.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
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
  EXPECT_EQ(::posix_fallocate(fd.get(), 0, size), 0);
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
      // The mesh affinity hint: a PCI bus id as sysfs names one, nothing else
      // (it becomes a sysfs path in the mesh's link ranking).
      {[](auto& r) { r.set_mesh_affinity("../../../../etc"); }, grpc::StatusCode::INVALID_ARGUMENT, "mesh_affinity"},
      {[](auto& r) { r.set_mesh_affinity("0000:18:00.0/..."); }, grpc::StatusCode::INVALID_ARGUMENT, "mesh_affinity"},
      {[](auto& r) { r.set_mesh_affinity("0000:1G:00.0"); }, grpc::StatusCode::INVALID_ARGUMENT, "mesh_affinity"},
      {[](auto& r) { r.set_mesh_affinity("0000:1A:00.0"); }, grpc::StatusCode::INVALID_ARGUMENT, "mesh_affinity"},
      {[](auto& r) { r.set_mesh_affinity("0000:18:00.8"); }, grpc::StatusCode::INVALID_ARGUMENT, "mesh_affinity"},
      {[](auto& r) { r.set_mesh_affinity(std::string(4096, '0')); }, grpc::StatusCode::INVALID_ARGUMENT,
       "mesh_affinity"},
      {[](auto& r) {
         r.set_handle_type(v1::HANDLE_TYPE_POSIX_FD);
         r.set_gpu_uuid("GPU-00000000-0000-0000-0000-000000000000");
         r.set_mesh_affinity("0000:18:00.0");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "mesh_affinity is for host memory"},
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
  // Only memory and eventfds may be offered: pipes and sockets are refused
  // at the offer (a socket held by podlinkd could keep a session alive).
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  UniqueFd r(p[0]), w(p[1]);
  EXPECT_EQ(c.Offer(r.get(), 1), static_cast<uint64_t>(EINVAL));
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  UniqueFd s0(sv[0]), s1(sv[1]);
  EXPECT_EQ(c.Offer(s0.get(), 1), static_cast<uint64_t>(EINVAL));
  // A regular file passes the offer but is not a memfd.
  char tmpl[] = "/tmp/podlink-lie-XXXXXX";
  UniqueFd file(::mkstemp(tmpl));
  ::unlink(tmpl);
  ASSERT_EQ(::posix_fallocate(file.get(), 0, 4096), 0);
  ASSERT_EQ(c.Offer(file.get(), 1), 0u);
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


// ---------------------------------------------------------------------------
// The attacks found on 2026-11-23 (issue 11), one test or more each, named
// by the issue's numbers. Relay attacks (3, 4, 6, 8, 9) are in relay_test.

using json = nlohmann::json;

// The node's counters as an operator sees them (the test process is root on
// the host). The connection asking counts as one session; it is left out.
Client::NodeStats StatsOf(const Daemon& d) {
  auto c = Client::Connect({.socket_dir = d.dir()});
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return {};
  auto s = (*c)->GetStats();
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  --s->sessions;
  return *s;
}

bool WaitForSessions(const Daemon& d, uint64_t n) {
  for (int i = 0; i < 500; ++i) {
    if (StatsOf(d).sessions == n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Lets processes of other uids reach the daemon's sockets.
void OpenSocketDir(const Daemon& d) { ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0); }

// podlink-demo `args` as uid/gid 65534 in the cgroup at `cgroup_path`.
std::unique_ptr<Pod> NobodyPod(const Daemon& d, const std::string& cgroup_path, std::vector<std::string> args) {
  std::vector<std::string> full = {"--reuid=65534", "--regid=65534", "--clear-groups", DemoPath()};
  full.insert(full.end(), args.begin(), args.end());
  return std::make_unique<Pod>(d, cgroup_path, full, "setpriv");
}

std::string PodRule(const PodCgroup& cg, const std::string& ns, const std::string& name, const std::string& group) {
  return absl::StrFormat(
      R"({"match": {"pod_uid": "%s"}, "namespace": "%s", "name": "%s", "annotations": {"podlink.io/peer-group": "%s"}})",
      cg.pod_uid(), ns, name, group);
}

// 1. A client that can create cgroups below its own names another pod.
TEST(Attacks, A01_CgroupsBelowAContainerCannotClaimAnotherPod) {
  PodCgroup victim(RandomPodUid(), "besteffort"), attacker(RandomPodUid(), "besteffort");
  Daemon d("{\"pods\": [" + PodRule(victim, "ml", "victim", "g") + "]}");
  Pod exporter(d, &victim, {"export", "--size", "65536", "--name", "kv", "--seed", "3", "--commands"});
  ASSERT_EQ(exporter.Expect("exported")["event"], "exported");
  std::string u = absl::StrReplaceAll(victim.pod_uid(), {{"-", "_"}});
  std::string scope = "cri-containerd-" + std::string(64, 'e') + ".scope";
  // <its scope>/x-pod<VICTIM>.slice, as in the attack, and a whole fake
  // kubelet hierarchy below its container.
  std::vector<std::string> made;
  std::string flat = attacker.path() + "/x-pod" + u + ".slice";
  std::string deep = attacker.path() + "/kubepods.slice";
  for (const std::string& dir : {flat, deep, deep + "/kubepods-pod" + u + ".slice",
                                 deep + "/kubepods-pod" + u + ".slice/" + scope}) {
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
    made.push_back(dir);
  }
  for (const std::string& where : {flat, made.back()}) {
    Pod p(d, where, {"import", "--name", "kv", "--verify", "3"}, "");
    json j = p.Expect("imported");
    EXPECT_EQ(j["event"], "error") << where << ": " << j.dump();
    EXPECT_NE(p.Wait(), 0);
  }
  EXPECT_TRUE(d.WaitForLog("names a pod or kubepods cgroup")) << d.Log();
  EXPECT_EQ(d.Log().find("event=import "), std::string::npos) << "an import was granted:\n" << d.Log();
  for (auto it = made.rbegin(); it != made.rend(); ++it) {
    for (int i = 0; i < 100 && ::rmdir(it->c_str()) != 0 && errno == EBUSY; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

// 1. "The same-pod check ignores the uid": another user in the same pod is
// not the exporter for the same-pod rule.
TEST(Attacks, A01_AnotherUidInTheSamePodIsNotTheSamePod) {
  PodCgroup pod(RandomPodUid(), "besteffort");
  Daemon d("{}");
  OpenSocketDir(d);
  Pod exporter(d, &pod, {"export", "--size", "65536", "--name", "kv", "--seed", "3", "--commands"});
  ASSERT_EQ(exporter.Expect("exported")["event"], "exported");
  auto other = NobodyPod(d, pod.path(), {"import", "--name", "kv", "--verify", "3"});
  json j = other->Expect("imported");
  EXPECT_EQ(j["code"], "PERMISSION_DENIED") << j.dump();
  // The same uid in the same pod still is the same pod.
  Pod same(d, &pod, {"import", "--name", "kv", "--verify", "3"});
  EXPECT_EQ(same.Expect("verified")["mismatches"], 0);
}

// 2. Sparse memfds: an export claiming 1 TiB it never allocated.
TEST_F(HostileClients, A02_SparseExportsAreRefused) {
  RawClient c(daemon_.dir());
  UniqueFd fd(::memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(fd.get(), off_t{1} << 40), 0);
  ASSERT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  ASSERT_EQ(c.Offer(fd.get(), 1), 0u);
  v1::ExportResponse er;
  grpc::Status s = c.Call(&v1::Broker::Stub::Export, HostExport(uint64_t{1} << 40, 1), &er);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("not fully allocated"), std::string::npos) << s.error_message();
  // Partly populated is not enough either.
  UniqueFd half(::memfd_create("half", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(half.get(), 1 << 20), 0);
  ASSERT_EQ(::posix_fallocate(half.get(), 0, 1 << 19), 0);
  ASSERT_EQ(::fcntl(half.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  ASSERT_EQ(c.Offer(half.get(), 2), 0u);
  EXPECT_EQ(c.Call(&v1::Broker::Stub::Export, HostExport(1 << 20, 2), &er).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ExpectHealthy();
}

// 12. Process memory (memory as it is, read and written by podlinkd through
// /proc/<pid>/mem, which bypasses page protection): only a range the caller
// itself can read and write, of the process that connected, with no
// descriptor and nothing that belongs to other kinds.
TEST_F(HostileClients, A12_ProcessMemoryOnlyWhereTheProcessCanWrite) {
  RawClient c(daemon_.dir());
  auto process = [](uint64_t address, uint64_t size) {
    v1::ExportRequest r;
    r.set_size(size);
    r.set_handle_type(v1::HANDLE_TYPE_PROCESS_MEMORY);
    r.set_address(address);
    return r;
  };
  v1::ExportResponse er;
  auto code = [&](const v1::ExportRequest& r) { return c.Call(&v1::Broker::Stub::Export, r, &er).error_code(); };
  static const char kReadOnly[8192] = "text";  // .rodata: r--p
  void* gone = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_EQ(::munmap(gone, 1 << 20), 0);
  std::vector<char> heap(1 << 16);
  EXPECT_EQ(code(process(0, 4096)), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(process(~uint64_t{0} - 100, 4096)), grpc::StatusCode::INVALID_ARGUMENT);  // wraps
  EXPECT_EQ(code(process(reinterpret_cast<uint64_t>(kReadOnly), 4096)), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(code(process(reinterpret_cast<uint64_t>(&HostExport), 64)), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(code(process(reinterpret_cast<uint64_t>(gone), 4096)), grpc::StatusCode::FAILED_PRECONDITION);
  // Far past the heap: over max_export_size, or through unmapped gaps.
  EXPECT_NE(code(process(reinterpret_cast<uint64_t>(heap.data()), uint64_t{1} << 40)), grpc::StatusCode::OK);
  v1::ExportRequest with_slot = process(reinterpret_cast<uint64_t>(heap.data()), heap.size());
  with_slot.set_fd_slot(1);
  EXPECT_EQ(code(with_slot), grpc::StatusCode::INVALID_ARGUMENT);
  v1::ExportRequest with_gpu = process(reinterpret_cast<uint64_t>(heap.data()), heap.size());
  with_gpu.set_gpu_uuid("GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(code(with_gpu), grpc::StatusCode::INVALID_ARGUMENT);
  UniqueFd memfd = SealedMemfd(4096);
  ASSERT_EQ(c.Offer(memfd.get(), 1), 0u);
  v1::ExportRequest memfd_with_address = HostExport(4096, 1);
  memfd_with_address.set_address(reinterpret_cast<uint64_t>(heap.data()));
  EXPECT_EQ(code(memfd_with_address), grpc::StatusCode::INVALID_ARGUMENT);
  // What the process owns is accepted, and an importer gets no descriptor for it.
  ASSERT_TRUE(c.Call(&v1::Broker::Stub::Export, process(reinterpret_cast<uint64_t>(heap.data()), heap.size()), &er)
                  .ok());
  v1::ImportRequest ir;
  ir.set_export_id(er.export_id());
  v1::ImportResponse resp;
  ASSERT_TRUE(c.Call(&v1::Broker::Stub::Import, ir, &resp).ok());
  EXPECT_EQ(resp.delivery_slot(), 0u);
  EXPECT_EQ(resp.export_().handle_type(), v1::HANDLE_TYPE_PROCESS_MEMORY);
  ExpectHealthy();
}

// 13. A chunked GPU export (torch's expandable segments: one descriptor per cuMem allocation) whose layout lies:
// refused before any descriptor is looked at, every offered descriptor consumed (the session's offers are free
// again), the daemon unharmed. A layout that holds reaches the GPU backend, which this daemon has none of.
TEST_F(HostileClients, A13_ChunkedExportsWhoseLayoutLiesAreRefused) {
  RawClient c(daemon_.dir());
  const uint64_t chunk = 2 << 20;
  uint64_t next_slot = 1000;
  std::vector<UniqueFd> memfds;
  auto chunked = [&](const std::vector<uint64_t>& sizes, uint64_t offset, uint64_t size, bool offer = true) {
    v1::ExportRequest r;
    r.set_size(size);
    r.set_gpu_uuid("GPU-00000000-0000-0000-0000-000000000000");
    r.set_handle_type(v1::HANDLE_TYPE_POSIX_FD);
    r.set_offset(offset);
    for (uint64_t sz : sizes) {
      const uint64_t slot = next_slot++;
      if (offer) {
        memfds.push_back(SealedMemfd(4096));
        EXPECT_EQ(c.Offer(memfds.back().get(), slot), 0u);
      }
      v1::ExportChunk* ch = r.add_chunks();
      ch->set_fd_slot(slot);
      ch->set_size(sz);
    }
    return r;
  };
  v1::ExportResponse er;
  auto call = [&](const v1::ExportRequest& r) { return c.Call(&v1::Broker::Stub::Export, r, &er); };
  auto refused = [&](const v1::ExportRequest& r, grpc::StatusCode want, const std::string& says) {
    grpc::Status st = call(r);
    EXPECT_EQ(st.error_code(), want) << st.error_message();
    EXPECT_NE(st.error_message().find(says), std::string::npos) << st.error_message();
  };
  refused(chunked({chunk}, chunk, 1), grpc::StatusCode::INVALID_ARGUMENT, "past the first allocation");
  refused(chunked({chunk, chunk}, 0, 2 * chunk + 1), grpc::StatusCode::INVALID_ARGUMENT, "does not fit");
  refused(chunked({chunk, chunk, chunk}, 0, chunk), grpc::StatusCode::INVALID_ARGUMENT, "wholly past its end");
  refused(chunked({chunk, 0}, 0, chunk + 1), grpc::StatusCode::INVALID_ARGUMENT, "size 0");
  refused(chunked({~uint64_t{0} - 1, chunk}, 0, chunk), grpc::StatusCode::INVALID_ARGUMENT, "overflow");
  v1::ExportRequest both = chunked({chunk}, 0, chunk);
  UniqueFd extra = SealedMemfd(4096);
  ASSERT_EQ(c.Offer(extra.get(), 1), 0u);
  both.set_fd_slot(1);
  refused(both, grpc::StatusCode::INVALID_ARGUMENT, "not both");
  ASSERT_TRUE(call(HostExport(4096, 1)).ok());  // slot 1 was not the chunked export's to take
  v1::ExportRequest host = chunked({chunk}, 0, chunk);
  host.set_handle_type(v1::HANDLE_TYPE_HOST_MEMFD);
  host.clear_gpu_uuid();
  refused(host, grpc::StatusCode::INVALID_ARGUMENT, "POSIX_FD exports");
  // Refused after its offer was taken (as every refused export's is: the check at the end sees it gone).
  UniqueFd host_fd = SealedMemfd(4096);
  ASSERT_EQ(c.Offer(host_fd.get(), 2), 0u);
  v1::ExportRequest offset_alone = HostExport(4096, 2);
  offset_alone.set_offset(64);
  refused(offset_alone, grpc::StatusCode::INVALID_ARGUMENT, "offset is given with chunks only");
  // Descriptors never offered; more allocations than max_export_chunks (1024) without reading any.
  refused(chunked({chunk, chunk}, 0, 2 * chunk, /*offer=*/false), grpc::StatusCode::FAILED_PRECONDITION,
          "no descriptor offered");
  refused(chunked(std::vector<uint64_t>(1025, chunk), 0, 1025 * chunk, /*offer=*/false),
          grpc::StatusCode::INVALID_ARGUMENT, "at most 1024");
  // A layout that holds gets to the GPU backend: this daemon has no CUDA.
  grpc::Status st = call(chunked({chunk, chunk}, 4096, chunk));
  EXPECT_NE(st.error_code(), grpc::StatusCode::OK);
  EXPECT_NE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  // Every offer above was consumed: the session may offer its whole allowance (16) again.
  std::vector<UniqueFd> again;
  for (uint64_t slot = 5000; slot < 5016; ++slot) {
    again.push_back(SealedMemfd(4096));
    EXPECT_EQ(c.Offer(again.back().get(), slot), 0u) << "slot " << slot;
  }
  ExpectHealthy();
}

// 14. One pod's sessions (64 of them) each holding their 1024 offers would
// hold 65536 of podlinkd's descriptors: offers are bounded per pod and on the
// node too, and every way an offer ends (used, expired, its session closed)
// gives its place back.
TEST(Attacks, A14_PendingOffersAreBoundedPerPodAndOnTheNode) {
  Daemon d(R"({"limits": {"max_pending_offers": 16, "max_pending_offers_per_pod": 40,
               "max_pending_offers_total": 100, "offer_ttl_seconds": 1}})");
  std::vector<UniqueFd> memfds;
  auto offer = [&](RawClient& c, uint64_t slot) {
    memfds.push_back(SealedMemfd(4096));
    return c.Offer(memfds.back().get(), slot);
  };
  auto offer_many = [&](RawClient& c, uint64_t first, int n) {
    int accepted = 0;
    for (int i = 0; i < n; ++i) {
      const uint64_t err = offer(c, first + i);
      if (err == 0) {
        ++accepted;
      } else {
        EXPECT_EQ(err, static_cast<uint64_t>(EMFILE)) << "slot " << first + i;
      }
    }
    return accepted;
  };
  // Three sessions of one pod (this test process): 16 + 16 + 8, then nothing more.
  auto a = std::make_unique<RawClient>(d.dir());
  RawClient b(d.dir()), c(d.dir());
  EXPECT_EQ(offer_many(*a, 1, 16), 16);
  EXPECT_EQ(offer_many(b, 1, 16), 16);
  EXPECT_EQ(offer_many(c, 1, 16), 8);
  // One used by an export: its place is free again.
  v1::ExportResponse er;
  ASSERT_TRUE(b.Call(&v1::Broker::Stub::Export, HostExport(4096, 1), &er).ok());
  EXPECT_EQ(offer(c, 100), 0u);
  EXPECT_EQ(offer(c, 101), static_cast<uint64_t>(EMFILE));
  // A session closed with 16 offers: 16 places back (c may take 7 more of its own 16).
  a.reset();
  ASSERT_TRUE(WaitForSessions(d, 2)) << "the closed session stayed";
  EXPECT_EQ(offer_many(c, 200, 10), 7);
  // Offers that expire give theirs back too: after the TTL every session may offer its whole allowance again.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(offer_many(b, 300, 16), 16);  // the first offer in a session expires its old ones
  EXPECT_EQ(offer_many(c, 300, 16), 16);

  // The node's bound, below one pod's here: 20 offers in all.
  Daemon small(R"({"limits": {"max_pending_offers": 16, "max_pending_offers_per_pod": 40,
                   "max_pending_offers_total": 20}})");
  RawClient x(small.dir()), y(small.dir());
  EXPECT_EQ(offer_many(x, 1, 16), 16);
  EXPECT_EQ(offer_many(y, 1, 16), 4);
  ASSERT_TRUE(x.Call(&v1::Broker::Stub::Export, HostExport(4096, 1), &er).ok());
  EXPECT_EQ(offer(y, 50), 0u);
  EXPECT_TRUE(d.Alive());
  EXPECT_TRUE(small.Alive());
}

// 5. A client offers its own end of the descriptor channel and never uses
// the offer: podlinkd would hold the socket open and never see the client go.
TEST_F(HostileClients, A05_OfferingItsOwnChannelCannotKeepTheSessionAlive) {
  uint64_t before = StatsOf(daemon_).sessions;
  {
    RawClient c(daemon_.dir());
    EXPECT_EQ(c.Offer(c.sock.get(), 1), static_cast<uint64_t>(EINVAL));
    UniqueFd dup(::fcntl(c.sock.get(), F_DUPFD_CLOEXEC, 0));
    EXPECT_EQ(c.Offer(dup.get(), 2), static_cast<uint64_t>(EINVAL));
    EXPECT_EQ(StatsOf(daemon_).sessions, before + 1);
  }
  EXPECT_TRUE(WaitForSessions(daemon_, before)) << "the session outlived its client";
}

TEST(Attacks, A05_UnusedOffersExpire) {
  Daemon d(R"({"limits": {"offer_ttl_seconds": 1}})");
  RawClient c(d.dir());
  UniqueFd m = SealedMemfd(4096);
  ASSERT_EQ(c.Offer(m.get(), 7), 0u);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  v1::ExportResponse er;
  grpc::Status s = c.Call(&v1::Broker::Stub::Export, HostExport(4096, 7), &er);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  // A fresh offer is used at once and works.
  ASSERT_EQ(c.Offer(m.get(), 8), 0u);
  EXPECT_TRUE(c.Call(&v1::Broker::Stub::Export, HostExport(4096, 8), &er).ok());
}

// 7. One pod taking every session; the descriptor limit never raised.
TEST(Attacks, A07_OnePodCannotTakeEverySession) {
  Daemon d(R"({"limits": {"max_sessions_per_pod": 3}})");
  OpenSocketDir(d);
  std::vector<std::unique_ptr<RawClient>> mine;
  for (int i = 0; i < 3; ++i) mine.push_back(std::make_unique<RawClient>(d.dir()));
  // The fourth connection of this pod is refused with a reason code.
  UniqueFd extra(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof(a.sun_path), "%s/podlink.fd.sock", d.dir().c_str());
  ASSERT_EQ(::connect(extra.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  pollfd p{extra.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
  auto bye = RecvFdMessage(extra.get(), false);
  ASSERT_TRUE(bye.ok() && bye->has_value());
  EXPECT_EQ((*bye)->msg.type, static_cast<uint16_t>(FdMsgType::kGoodbye));
  EXPECT_EQ((*bye)->msg.a, static_cast<uint64_t>(absl::StatusCode::kResourceExhausted));
  EXPECT_TRUE(d.WaitForLog("per-pod limit")) << d.Log();
  // Another pod is still served.
  auto other = NobodyPod(d, "", {"info"});
  json j = other->Expect("info");
  EXPECT_EQ(j["event"], "info") << j.dump();
  // Closing one of the pod's sessions makes room again.
  mine.pop_back();
  for (int i = 0; i < 500; ++i) {
    auto c = Client::Connect({.socket_dir = d.dir()});
    if (c.ok()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "no session after one of the pod's closed";
}

TEST(Attacks, A07_DescriptorLimitIsRaisedAtStart) {
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  if (old.rlim_max <= 256) GTEST_SKIP() << "hard descriptor limit too low to tell";
  rlimit low{256, old.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  Daemon d("{}");  // inherits the low soft limit
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  std::ifstream f("/proc/" + std::to_string(d.pid()) + "/limits");
  std::string line;
  bool found = false;
  while (std::getline(f, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    found = true;
    std::istringstream in(line.substr(14));
    std::string soft, hard;
    in >> soft >> hard;
    EXPECT_EQ(soft, hard) << line;
  }
  EXPECT_TRUE(found);
}

// A raw connection to the gRPC socket that never says anything.
UniqueFd IdleGrpcConnection(const Daemon& d) {
  UniqueFd c(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof(a.sun_path), "%s/podlink.sock", d.dir().c_str());
  EXPECT_EQ(::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return c;
}

// True once the daemon has closed `c` (EOF or reset), within `timeout_ms`.
bool ClosedByDaemon(int c, int timeout_ms) {
  pollfd p{c, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return false;
  char buf[256];
  ssize_t n;
  // gRPC may have sent its SETTINGS frame first; read until EOF or nothing.
  while ((n = ::recv(c, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
  }
  return n == 0 || (n < 0 && errno != EAGAIN);
}

// 7. Idle connections to the gRPC socket are counted per pod and in all;
// past the limit they are closed at once, so they cannot eat podlinkd's
// descriptors, and other pods are still served.
TEST(Attacks, A07_GrpcConnectionsAreBoundedPerPod) {
  Daemon d(R"({"limits": {"max_grpc_connections_per_pod": 8, "max_grpc_connections": 32}})",
           {"--metrics-addr", "127.0.0.1:0"});
  OpenSocketDir(d);
  int fds_before = d.OpenFds();
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 300; ++i) flood.push_back(IdleGrpcConnection(d));
  // The ninth and later are closed by the daemon; the first eight stay open.
  int closed = 0;
  for (size_t i = 8; i < flood.size(); ++i) closed += ClosedByDaemon(flood[i].get(), 5000);
  EXPECT_EQ(closed, 292);
  for (size_t i = 0; i < 8; ++i) EXPECT_FALSE(ClosedByDaemon(flood[i].get(), 0)) << i;
  EXPECT_LE(d.OpenFds(), fds_before + 2 * 8 + 4) << "each counted connection costs two fds, no more";
  EXPECT_TRUE(d.WaitForLog("per-pod limit")) << d.Log();
  EXPECT_EQ(d.Metric("podlink_grpc_connections"), std::optional<double>(8));
  EXPECT_GE(d.Metric("podlink_grpc_connections_refused_total").value_or(0), 292);
  // Another pod (another uid) is still served.
  auto other = NobodyPod(d, "", {"info"});
  json j = other->Expect("info");
  EXPECT_EQ(j["event"], "info") << j.dump();
  // Closing them gives the pod its share back.
  flood.clear();
  bool back = false;
  for (int i = 0; i < 500 && !back; ++i) {
    back = d.Metric("podlink_grpc_connections") == std::optional<double>(0);
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(back) << "connections still counted after the client closed them";
  auto c = Client::Connect({.socket_dir = d.dir()});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->GetStats().ok());
}

// 10. Probing exports of other namespaces by id and by name.
TEST(Attacks, A10_OtherNamespacesLearnNothingFromImports) {
  PodCgroup owner(RandomPodUid(), "besteffort"), stranger(RandomPodUid(), "besteffort");
  Daemon d("{\"pods\": [" + PodRule(owner, "ml", "owner-0", "g") + ", " + PodRule(stranger, "web", "stranger", "g") +
           "]}");
  Pod exporter(d, &owner, {"export", "--size", "65536", "--name", "kv", "--seed", "3", "--commands"});
  json e = exporter.Expect("exported");
  ASSERT_EQ(e["event"], "exported");
  uint64_t id = e["export_id"].get<uint64_t>();
  auto answer = [&](std::vector<std::string> args) {
    Pod p(d, &stranger, args);
    json j = p.Expect("imported");
    EXPECT_EQ(j["code"], "NOT_FOUND") << j.dump();
    std::string m = j["message"].get<std::string>();
    EXPECT_EQ(m.find("owner-0"), std::string::npos) << m;
    EXPECT_EQ(m.find("'g'"), std::string::npos) << m;
    return m;
  };
  std::string existing = answer({"import", "--id", std::to_string(id)});
  std::string unused = answer({"import", "--id", std::to_string(id + 1000)});
  EXPECT_EQ(absl::StrReplaceAll(existing, {{std::to_string(id), "N"}}),
            absl::StrReplaceAll(unused, {{std::to_string(id + 1000), "N"}}));
  std::string named = answer({"import", "--name", "ml/kv"});
  std::string never = answer({"import", "--name", "ml/zz"});
  EXPECT_EQ(absl::StrReplaceAll(named, {{"'kv'", "'X'"}}), absl::StrReplaceAll(never, {{"'zz'", "'X'"}}));
}

// 10. Write-sealed memfds used to be accepted and fail later.
TEST_F(HostileClients, A10_WriteSealedMemfdsAreRefusedAtExport) {
  RawClient c(daemon_.dir());
  for (int seal : {F_SEAL_WRITE, F_SEAL_FUTURE_WRITE}) {
    UniqueFd fd(::memfd_create("ro", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(::posix_fallocate(fd.get(), 0, 4096), 0);
    ASSERT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | seal | F_SEAL_SEAL), 0);
    ASSERT_EQ(c.Offer(fd.get(), 1), 0u);
    v1::ExportResponse er;
    grpc::Status s = c.Call(&v1::Broker::Stub::Export, HostExport(4096, 1), &er);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("sealed against writes"), std::string::npos) << s.error_message();
  }
}

// 11. The owner's own import fails to deliver (its channel is full): the
// export used to be deleted silently, under every other importer.
TEST_F(HostileClients, A11_AFailedDeliveryToTheOwnerKeepsTheExport) {
  RawClient c(daemon_.dir());  // never reads its channel
  UniqueFd m = SealedMemfd(4096);
  ASSERT_EQ(c.Offer(m.get(), 1), 0u);
  v1::ExportResponse er;
  ASSERT_TRUE(c.Call(&v1::Broker::Stub::Export, HostExport(4096, 1), &er).ok());
  v1::ImportRequest req;
  req.set_export_id(er.export_id());
  grpc::Status s;
  for (int i = 0; i < 100000; ++i) {
    v1::ImportResponse ir;
    s = c.Call(&v1::Broker::Stub::Import, req, &ir);
    if (!s.ok()) break;
  }
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // Still exported: another session imports it.
  auto other = Client::Connect({.socket_dir = daemon_.dir()});
  ASSERT_TRUE(other.ok());
  auto imp = (*other)->Import(er.export_id());
  EXPECT_TRUE(imp.ok()) << imp.status();
}

}  // namespace
}  // namespace podlink::testing
