#include "daemon/mesh/mesh_engine.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/origin_sign.h"
#include "daemon/mesh/routes.h"
#include "daemon/metrics/metrics.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"

namespace podlink::mesh {
namespace {

const ComponentLog Log("mesh");

// How a relay says it cannot take a region over verbs (the importer then
// reaches it over TCP).
constexpr char kRelayCannotStage[] = " cannot stage over verbs: ";
// Two-hop striping (mesh.two_hop_stripe): transfers from this size, in
// chunks of this size, at most this many in flight per route.
constexpr uint64_t kTwoHopMinBytes = 8 << 20;
constexpr uint64_t kTwoHopChunk = 4 << 20;
constexpr uint32_t kTwoHopWindow = 4;

// A relay's refusal to stage a region over verbs for its caller (no bounce
// pool for it; or, from a relay of a version before staging, "relayed
// regions ride TCP links"): the hop to it can still go over TCP.
bool RelayCannotStage(const absl::Status& st) {
  return st.code() == absl::StatusCode::kFailedPrecondition &&
         (absl::StrContains(st.message(), kRelayCannotStage) ||
          absl::StrContains(st.message(), "relayed regions ride TCP links"));
}
namespace pb = podlink::mesh::v1;

absl::StatusOr<std::string> ReadPem(const std::string& dir, const char* name) {
  std::string path = dir + "/" + name;
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("mesh certificate file ", path, " cannot be read: ",
                                                      std::strerror(errno), " (mesh.cert_dir needs ca.crt, tls.crt, tls.key)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN") == std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not PEM"));
  }
  return ss.str();
}

// A callback answered exactly once: by a call, or — when the last holder
// lets go unanswered (a task dropped because the engine stopped, a peer
// evicted before its task ran) — with UNAVAILABLE and `dropped`. Shared by
// the tasks that may answer; never copied (a copy would answer too).
template <typename T>
class AnswerOnce {
 public:
  using Fn = std::function<void(absl::StatusOr<T>)>;
  AnswerOnce(Fn fn, std::string dropped) : fn_(std::move(fn)), dropped_(std::move(dropped)) {}
  AnswerOnce(const AnswerOnce&) = delete;
  AnswerOnce& operator=(const AnswerOnce&) = delete;
  ~AnswerOnce() {
    if (fn_) fn_(absl::UnavailableError(dropped_));
  }
  void operator()(absl::StatusOr<T> r) {
    Fn fn = std::move(fn_);
    fn_ = nullptr;
    if (fn) fn(std::move(r));
  }

 private:
  Fn fn_;
  const std::string dropped_;
};

absl::Status FromGrpc(const grpc::Status& s, const std::string& node) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat("node ", node, ": ", s.error_message()));
}

grpc::Status ToGrpc(const absl::Status& s) {
  return s.ok() ? grpc::Status::OK : grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

uint64_t RandomU64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::string RandomCookie() {
  std::random_device rd;
  std::string c(kCookieBytes, '\0');
  for (size_t i = 0; i < kCookieBytes; i += 4) {
    uint32_t v = rd();
    std::memcpy(c.data() + i, &v, 4);
  }
  return c;
}

void TuneDataSocket(int fd, absl::Duration io_timeout) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  unsigned timeout_ms = static_cast<unsigned>(absl::ToInt64Milliseconds(io_timeout));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof(timeout_ms));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = std::max(1, static_cast<int>(absl::ToInt64Seconds(io_timeout)) / 2), intvl = 1, cnt = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

socklen_t ToSockaddr(const IpPrefix& a, uint16_t port, sockaddr_storage* ss) {
  std::memset(ss, 0, sizeof(*ss));
  if (a.family == AF_INET) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    std::memcpy(&s4->sin_addr, a.addr.data(), 4);
    return sizeof(*s4);
  }
  auto* s6 = reinterpret_cast<sockaddr_in6*>(ss);
  s6->sin6_family = AF_INET6;
  s6->sin6_port = htons(port);
  std::memcpy(&s6->sin6_addr, a.addr.data(), 16);
  return sizeof(*s6);
}

std::string HostPort(const IpPrefix& a, uint32_t port) {
  return a.family == AF_INET6 ? absl::StrCat("[", a.AddressText(), "]:", port) : absl::StrCat(a.AddressText(), ":", port);
}

// Connects `path` to `port` within `timeout`; the socket is blocking after.
absl::StatusOr<UniqueFd> Dial(const Path& path, uint16_t port, absl::Duration timeout) {
  UniqueFd fd(::socket(path.remote.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket");
  if (!path.fallback) {
    sockaddr_storage local;
    socklen_t len = ToSockaddr(path.local, 0, &local);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), len) != 0) {
      return ErrnoStatus(errno, absl::StrCat("bind ", path.local.AddressText()));
    }
  }
  sockaddr_storage remote;
  socklen_t len = ToSockaddr(path.remote, port, &remote);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&remote), len) != 0 && errno != EINPROGRESS) {
    return ErrnoStatus(errno, absl::StrCat("connect ", HostPort(path.remote, port)));
  }
  pollfd p{fd.get(), POLLOUT, 0};
  int n = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (n <= 0) {
    return absl::UnavailableError(absl::StrCat("connect ", HostPort(path.remote, port), ": no answer within ",
                                               absl::FormatDuration(timeout)));
  }
  int err = 0;
  socklen_t elen = sizeof(err);
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
  if (err != 0) {
    return absl::UnavailableError(absl::StrCat("connect ", HostPort(path.remote, port), ": ", std::strerror(err)));
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// ReadFull with an absolute deadline over the whole read.
// GPU exports served to other nodes, and writes on a fenceable route's grant:
// the bytes pass through a host buffer of the connection's thread, a chunk at
// a time (MemoryObject::CopyIn/Out; LandFenceable).
constexpr uint64_t kGpuChunk = uint64_t{4} << 20;
constexpr uint64_t kMaxGpuFrame = uint64_t{64} << 20;
char* ChunkBuffer() {
  thread_local std::unique_ptr<char[]> buf;
  if (buf == nullptr) buf.reset(new char[kGpuChunk]);
  return buf.get();
}

absl::Status ReadFullBefore(int fd, void* buf, size_t len, absl::Time deadline) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("deadline");
    pollfd pf{fd, POLLIN, 0};
    int r = ::poll(&pf, 1, static_cast<int>(ms));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::DeadlineExceededError("deadline");
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return absl::UnavailableError("closed");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

bool ValidNodeName(const std::string& n) {
  if (n.empty() || n.size() > 253) return false;
  for (char ch : n) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.')) return false;
  }
  return true;
}

std::string PathName(const Path& path) {
  return absl::StrCat(path.fallback ? "routed" : path.local.AddressText(), "->", path.remote.AddressText());
}

absl::Status SendAck(int fd, uint64_t tag, const absl::Status& st) {
  std::string text(st.message().substr(0, 4096));
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = static_cast<uint16_t>(FrameType::kAck);
  h.length = static_cast<uint32_t>(text.size());
  h.status = static_cast<int32_t>(st.code());
  h.tag = tag;
  return WriteFrame(fd, h, text.data(), text.size());
}

}  // namespace

// ---------------------------------------------------------------------------
// Answers on a data connection. Frames of the serving thread and of
// completions of forwarded requests (other threads) never interleave, and
// nothing is written once the serving thread has let the connection go (its
// descriptor is closed and its number may be reused).
class MeshEngine::ConnWriter {
 public:
  explicit ConnWriter(int fd) : fd_(fd) {}
  absl::Status Ack(uint64_t tag, const absl::Status& st) {
    absl::MutexLock l(&mu_);
    if (closed_) return absl::UnavailableError("connection closed");
    return SendAck(fd_, tag, st);
  }
  absl::Status Frame(const FrameHeader& h, const void* payload, size_t len) {
    absl::MutexLock l(&mu_);
    if (closed_) return absl::UnavailableError("connection closed");
    return WriteFrame(fd_, h, payload, len);
  }
  // Held while the serving thread writes a frame in pieces.
  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }
  void Close() {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }

 private:
  absl::Mutex mu_;
  const int fd_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------
std::vector<pb::LinkInfo> MeshEngine::PeerLinkInfo(const pb::HelloResponse& hello) {
  std::vector<pb::LinkInfo> out;
  for (const pb::LinkInfo& l : hello.links()) {
    if (out.size() == 64) break;
    pb::LinkInfo c = l;
    for (std::string* f :
         {c.mutable_address(), c.mutable_netdev(), c.mutable_pci_path(), c.mutable_rdma_device(), c.mutable_gid_type()}) {
      if (f->size() > 256) f->resize(256);
      for (char& ch : *f) {
        if (ch < 0x20 || ch == 0x7f) ch = '?';
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The control service: authenticates by the TLS peer and calls the engine.

class MeshEngine::Service final : public pb::Mesh::CallbackService {
 public:
  explicit Service(MeshEngine* e) : e_(e) {}

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* ctx, const pb::HelloRequest* req,
                                  pb::HelloResponse* resp) override {
    return Run(ctx, [&](const std::string& node) {
      if (node != e_->node_name_) e_->SeenInstance(node, req->instance());
      if (node != e_->node_name_) e_->AcceptAdverts(node, req->adverts());
      e_->AddAdverts(resp->mutable_adverts());
      resp->set_node_name(e_->node_name_);
      resp->set_version(PODLINK_VERSION);
      resp->set_instance(e_->instance_);
      resp->set_data_port(e_->data_port_);
      for (const std::string& a : e_->AdvertisedAddresses()) resp->add_addresses(a);
      resp->set_control_port(e_->control_port_);
      for (pb::LinkInfo& l : e_->LocalLinks()) *resp->add_links() = std::move(l);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* OpenLink(grpc::CallbackServerContext* ctx, const pb::OpenLinkRequest* req,
                                     pb::OpenLinkResponse* resp) override {
    return Run(ctx, [&](const std::string& node) -> absl::Status {
      PODLINK_ASSIGN_OR_RETURN(std::vector<std::string> cookies, e_->IssueCookies(node, req->connections()));
      for (auto& c : cookies) resp->add_cookies(std::move(c));
      resp->set_data_port(e_->data_port_);
      resp->set_instance(e_->instance_);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* OpenRegion(grpc::CallbackServerContext* ctx, const pb::OpenRegionRequest* req,
                                       pb::OpenRegionResponse* resp) override {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    absl::StatusOr<std::string> node = PeerNode(ctx);
    if (!node.ok()) {
      r->Finish(ToGrpc(node.status()));
      return r;
    }
    // A relayed open is answered later, from a mesh thread; if its task is
    // dropped (the engine stopping), the answer's owner still finishes it.
    struct Answer {
      Answer(grpc::ServerUnaryReactor* r, pb::OpenRegionResponse* resp) : r(r), resp(resp) {}
      Answer(const Answer&) = delete;
      Answer& operator=(const Answer&) = delete;
      ~Answer() {
        if (!done) r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping"));
      }
      grpc::ServerUnaryReactor* const r;
      pb::OpenRegionResponse* const resp;
      bool done = false;
    };
    auto answer = std::make_shared<Answer>(r, resp);
    // In flight until answered (a relayed open waits on the next hop).
    const bool peer = *node != e_->node_name_;
    if (peer) e_->BeginCall(*node);
    e_->OpenRegionFor(*node, *req, [answer, e = e_, peer, n = *node](absl::StatusOr<pb::OpenRegionResponse> out) {
      if (answer->done) return;
      answer->done = true;
      if (peer) e->EndCall(n);
      if (out.ok()) *answer->resp = *std::move(out);
      answer->r->Finish(ToGrpc(out.status()));
    });
    return r;
  }
  grpc::ServerUnaryReactor* OpenVerbs(grpc::CallbackServerContext* ctx, const pb::OpenVerbsRequest* req,
                                      pb::OpenVerbsResponse* resp) override {
    return Run(ctx, [&](const std::string& node) -> absl::Status {
      PODLINK_ASSIGN_OR_RETURN(*resp, e_->AcceptVerbs(node, *req));
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* FenceRoute(grpc::CallbackServerContext* ctx, const pb::FenceRouteRequest* req,
                                       pb::FenceRouteResponse* resp) override {
    return Run(ctx, [&](const std::string& node) -> absl::Status {
      PODLINK_ASSIGN_OR_RETURN(uint32_t closed, e_->FenceRoute(node, req->nonce()));
      resp->set_grants_closed(closed);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* CloseRegion(grpc::CallbackServerContext* ctx, const pb::CloseRegionRequest* req,
                                        pb::CloseRegionResponse*) override {
    return Run(ctx, [&](const std::string& node) {
      e_->CloseRegion(node, req->grant());
      return absl::OkStatus();
    });
  }

 private:
  // The peer's node name: the identity of its verified certificate.
  static absl::StatusOr<std::string> PeerNode(grpc::CallbackServerContext* ctx) {
    std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
    std::vector<grpc::string_ref> ids;
    if (auth != nullptr && auth->IsPeerAuthenticated()) ids = auth->GetPeerIdentity();
    if (ids.empty()) return absl::UnauthenticatedError("mesh peers must present a node certificate");
    // A certificate names exactly one node (its first SAN, else its CN).
    return std::string(ids.front().data(), ids.front().size());
  }
  template <typename F>
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, F&& f) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    absl::StatusOr<std::string> node = PeerNode(ctx);
    // Alive for as long as a call that may take long (an owner registering
    // memory for RDMA) runs, while its keepalives may wait behind it.
    const bool peer = node.ok() && *node != e_->node_name_;
    if (peer) e_->BeginCall(*node);
    absl::Status st = node.ok() ? f(*node) : node.status();
    if (peer) e_->EndCall(*node);
    r->Finish(ToGrpc(st));
    return r;
  }
  MeshEngine* const e_;
};

// ---------------------------------------------------------------------------
// A peer daemon as the importing side sees it. Its worker thread does every
// blocking exchange with the peer (dial, TLS, OpenLink, OpenRegion), one at a
// time, so no caller's thread ever waits on a handshake.

class MeshEngine::Peer : public std::enable_shared_from_this<MeshEngine::Peer> {
 public:
  static constexpr size_t kMaxQueued = 256;

  Peer(std::string node, bool tcp) : node_(std::move(node)), tcp_(tcp), worker_([this] { Run(); }) {}
  // Tasks never hold a reference to their peer, so this never runs on the
  // peer's own worker; the engine stops every peer before it goes away.
  ~Peer() {
    Stop();
    absl::MutexLock l(&mu_);
    links_.reset();
  }
  // Drops queued tasks and waits for the running one.
  void Stop() {
    std::deque<std::function<void()>> dropped;
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      dropped.swap(tasks_);
    }
    if (worker_.joinable()) {
      if (worker_.get_id() == std::this_thread::get_id()) {
        worker_.detach();
      } else {
        worker_.join();
      }
    }
  }
  const std::string& node() const { return node_; }
  bool tcp() const { return tcp_; }
  // False when stopping or too many tasks wait already.
  bool Post(std::function<void()> task) {
    absl::MutexLock l(&mu_);
    if (stop_ || tasks_.size() >= kMaxQueued) return false;
    tasks_.push_back(std::move(task));
    return true;
  }
  bool idle() const {
    absl::MutexLock l(&mu_);
    return tasks_.empty() && !busy_;
  }
  std::shared_ptr<DataLinks> links() const {
    absl::MutexLock l(&mu_);
    return links_;
  }
  void set_links(std::shared_ptr<DataLinks> links) {
    std::shared_ptr<DataLinks> old;
    {
      absl::MutexLock l(&mu_);
      old = std::move(links_);
      links_ = std::move(links);
    }
    // `old` is destroyed here, outside the lock: its threads are joined.
  }
  std::shared_ptr<pb::Mesh::Stub> stub() const {
    absl::MutexLock l(&mu_);
    return stub_;
  }
  void set_stub(std::shared_ptr<pb::Mesh::Stub> s) {
    absl::MutexLock l(&mu_);
    stub_ = std::move(s);
  }
  // The peer daemon's instance as of the last Hello: a new one means it
  // restarted, and grants from before are void.
  std::atomic<uint64_t> instance{0};
  // The direct paths its links run over, and what it says of its NICs.
  void set_paths(std::vector<Path> paths, std::vector<pb::LinkInfo> advertised) {
    absl::MutexLock l(&mu_);
    paths_ = std::move(paths);
    advertised_ = std::move(advertised);
    prefs_.clear();
  }
  std::vector<Path> paths() const {
    absl::MutexLock l(&mu_);
    return paths_;
  }
  std::vector<pb::LinkInfo> advertised() const {
    absl::MutexLock l(&mu_);
    return advertised_;
  }
  // After no RDMA path came up: opens go over TCP without trying RDMA again
  // until then (mesh.verbs_tcp_fallback).
  absl::Time verbs_retry_after() const {
    absl::MutexLock l(&mu_);
    return verbs_retry_after_;
  }
  void set_verbs_retry_after(absl::Time t) {
    absl::MutexLock l(&mu_);
    verbs_retry_after_ = t;
  }
  // Which of the paths a transfer from or to memory at `place` (a GPU's PCI
  // bus id; empty: host memory) uses; made once per place and path set.
  std::shared_ptr<const PathPreference> Preference(
      const std::string& place, const std::function<PathPreference(const std::vector<Path>&)>& rank) {
    absl::MutexLock l(&mu_);
    auto it = prefs_.find(place);
    if (it != prefs_.end()) return it->second;
    if (prefs_.size() >= 64) prefs_.clear();  // GPUs of this node: a handful
    auto p = std::make_shared<const PathPreference>(rank(paths_));
    prefs_[place] = p;
    return p;
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> task;
      {
        absl::MutexLock l(&mu_);
        busy_ = false;
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
        busy_ = true;
      }
      task();
    }
  }
  const std::string node_;
  const bool tcp_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<DataLinks> links_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<pb::Mesh::Stub> stub_ ABSL_GUARDED_BY(mu_);
  std::vector<Path> paths_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::LinkInfo> advertised_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const PathPreference>> prefs_ ABSL_GUARDED_BY(mu_);
  absl::Time verbs_retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread worker_;
};

namespace {

// Gives back a grant this node holds from `peer`: its verbs keys at once, the
// grant itself on the peer's worker, best effort (grants also die with their
// export).
void ReleaseRemoteGrant(MeshEngine::Peer* peer, uint64_t grant) {
  if (auto vl = std::dynamic_pointer_cast<verbs::VerbsLinks>(peer->links())) vl->DropRegion(grant);
  (void)peer->Post([peer, grant] {
    std::shared_ptr<pb::Mesh::Stub> stub = peer->stub();
    if (stub == nullptr) return;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::CloseRegionRequest req;
    req.set_grant(grant);
    pb::CloseRegionResponse ignored;
    (void)stub->CloseRegion(&ctx, req, &ignored);
  });
}

}  // namespace

// ---------------------------------------------------------------------------

MeshEngine::MeshEngine(MeshOptions options, std::string node_name, MeshHost* host)
    : options_(std::move(options)), node_name_(std::move(node_name)), host_(host), instance_(RandomU64()) {}

absl::StatusOr<std::unique_ptr<MeshEngine>> MeshEngine::Start(MeshOptions options, std::string node_name,
                                                              MeshHost* host) {
  if (node_name.empty()) return absl::InvalidArgumentError("the mesh needs this node's name (--node-name or $NODE_NAME)");
  if (options.connections_per_path == 0 || options.connections_per_path > 16) {
    return absl::InvalidArgumentError("mesh.connections_per_path must be 1 to 16");
  }
  std::unique_ptr<MeshEngine> e(new MeshEngine(std::move(options), std::move(node_name), host));
  const MeshOptions& o = e->options_;
  {
    Pems p;
    PODLINK_ASSIGN_OR_RETURN(p.ca, ReadPem(o.cert_dir, "ca.crt"));
    PODLINK_ASSIGN_OR_RETURN(p.cert, ReadPem(o.cert_dir, "tls.crt"));
    PODLINK_ASSIGN_OR_RETURN(p.key, ReadPem(o.cert_dir, "tls.key"));
    absl::MutexLock l(&e->pem_mu_);
    e->pems_ = std::move(p);
    e->pems_read_ = absl::Now();
  }
  if (!o.addresses.empty()) {
    for (const std::string& a : o.addresses) {
      PODLINK_ASSIGN_OR_RETURN(IpPrefix p, IpPrefix::Parse(a));
      // The netdev that holds the address, if one does (its NIC is ranked
      // and shown); an address no interface holds stays without.
      for (const IpPrefix& mine : LocalAddresses({})) {
        if (mine.family == p.family && mine.addr == p.addr) p.netdev = mine.netdev;
      }
      e->advertised_.push_back(p);
    }
  } else {
    e->advertised_ = LocalAddresses(o.interfaces);
  }
  if (e->advertised_.empty()) {
    return absl::FailedPreconditionError("the mesh has no address to advertise (no interface is up, or "
                                         "mesh.interfaces names none that has an address)");
  }
  {
    std::vector<pb::LinkInfo> links = e->ReadLocalLinks();  // before the first Hello is answered
    absl::MutexLock l(&e->links_mu_);
    e->local_links_ = std::move(links);
    e->local_links_read_ = absl::Now();
  }

  // Data port: plain TCP, every connection authenticated by its first frame.
  e->listen_fd_ = UniqueFd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!e->listen_fd_.valid()) return ErrnoStatus(errno, "mesh data socket");
  int one = 1, zero = 0;
  ::setsockopt(e->listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ::setsockopt(e->listen_fd_.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_port = htons(static_cast<uint16_t>(o.data_port));
  sa.sin6_addr = in6addr_any;
  if (::bind(e->listen_fd_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind mesh data port ", o.data_port));
  }
  if (::listen(e->listen_fd_.get(), 128) != 0) return ErrnoStatus(errno, "listen on the mesh data port");
  socklen_t slen = sizeof(sa);
  ::getsockname(e->listen_fd_.get(), reinterpret_cast<sockaddr*>(&sa), &slen);
  e->data_port_ = ntohs(sa.sin6_port);

  // Control plane: gRPC over mutual TLS. The files are watched (a
  // cert-manager secret rotated in place, or a new CA bundle, takes effect
  // for new connections within cert_refresh, without a restart).
  e->cert_files_ = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.cert_dir + "/tls.key", o.cert_dir + "/tls.crt", o.cert_dir + "/ca.crt",
      static_cast<unsigned>(std::max<int64_t>(1, absl::ToInt64Seconds(o.cert_refresh))));
  grpc::experimental::TlsServerCredentialsOptions tls(e->cert_files_);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  e->service_ = std::make_unique<Service>(e.get());
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(o.listen, grpc::experimental::TlsServerCredentials(tls), &port);
  b.RegisterService(e->service_.get());
  b.AddChannelArgument(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 1 << 20);
  b.AddChannelArgument("grpc.server_handshake_timeout_ms", 5000);
  e->server_ = b.BuildAndStart();
  if (e->server_ == nullptr || port == 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot serve the mesh control plane on ", o.listen,
                                                      " (address in use, or the certificates do not load)"));
  }
  e->control_port_ = static_cast<uint32_t>(port);
  e->accept_thread_ = std::thread([p = e.get()] { p->AcceptLoop(); });
  if (o.transport == "verbs") {
    // Said at start, not at the first pod's open: this node cannot use verbs.
    absl::StatusOr<const verbs::VerbsApi*> api = verbs::LoadVerbs();
    if (!api.ok()) return api.status();
  } else if (o.transport != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat("mesh.transport '", o.transport, "': tcp or verbs"));
  }
  e->RefreshOwnAdvert();  // before the first Hello it could be asked for
  e->repair_thread_ = std::thread([p = e.get()] { p->RepairLoop(); });
  e->housekeeping_thread_ = std::thread([p = e.get()] { p->HousekeepingLoop(); });
  if (e->options_.two_hop_stripe) {
    absl::MutexLock l(&e->pump_mu_);
    e->pump_running_ = true;
    e->pump_thread_ = std::thread([p = e.get()] { p->PumpLoop(); });
  }
  for (const PeerEntry& peer : o.peers) e->Learn(peer.node, peer.addresses, peer.port);
  std::vector<std::string> adv;
  for (const IpPrefix& a : e->advertised_) adv.push_back(a.ToString());
  Log()->info("event=mesh_ready node={} control={} data_port={} addresses={} transport={}", e->node_name_, o.listen,
              e->data_port_, absl::StrJoin(adv, ","), o.transport);
  return e;
}

MeshEngine::~MeshEngine() {
  Stop();
  // The two-hop thread outlives Stop: a striped transfer started meanwhile
  // still ends on it, never inside its Start. Nothing is queued after this.
  {
    absl::MutexLock l(&pump_mu_);
    pump_stop_ = true;
  }
  if (pump_thread_.joinable()) pump_thread_.join();
}

void MeshEngine::Stop() {
  if (stopped_.exchange(true, std::memory_order_acq_rel)) return;
  stopping_.store(true, std::memory_order_release);
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  ::shutdown(listen_fd_.get(), SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    absl::MutexLock l(&mu_);  // wakes RepairLoop and HousekeepingLoop, which see stopping_
  }
  if (repair_thread_.joinable()) repair_thread_.join();
  if (housekeeping_thread_.joinable()) housekeeping_thread_.join();
  {
    // Advert trades still in flight (started by the housekeeping thread, now gone).
    absl::MutexLock l(&advert_calls_mu_);
    for (grpc::ClientContext* c : advert_calls_) c->TryCancel();
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(advert_calls_mu_) { return advert_calls_.empty(); };
    advert_calls_mu_.Await(absl::Condition(&none));
  }
  std::map<std::string, std::shared_ptr<Peer>> peers;
  {
    absl::MutexLock l(&mu_);
    for (int fd : serving_fds_) ::shutdown(fd, SHUT_RDWR);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return serving_ == 0; };
    mu_.Await(absl::Condition(&done));
    peers.swap(peers_);
  }
  // Workers first (a queued open finds the engine stopping and answers so; one
  // dropped is answered as its holder goes), then the links, which fail what
  // is in flight into the relay, still alive.
  for (auto& [node, p] : peers) p->Stop();
  for (auto& [node, p] : peers) p->set_links(nullptr);
  // Striped transfers still waiting for submissions find no links now and
  // end (on the two-hop thread, which the destructor stops).
  peers.clear();
  // Relay grants hold their next node; it was one of the peers above. Pods'
  // handles go too (an open finishing meanwhile was refused: stopping).
  std::map<uint64_t, Grant> grants;
  {
    absl::MutexLock l(&mu_);
    grants.swap(grants_);
    routed_grants_.clear();
    handles_.clear();
    handles_per_session_.clear();
  }
  grants.clear();
  // Other nodes' access to this node's memory ends now, not when the daemon
  // object goes: the exports are withdrawn next (sessions closing).
  std::unique_ptr<verbs::VerbsServer> verbs;
  {
    absl::MutexLock l(&verbs_mu_);
    verbs.swap(verbs_server_);
  }
  verbs.reset();
}

absl::Status MeshEngine::StoppingStatus() { return absl::UnavailableError("podlinkd is stopping"); }

absl::Status MeshEngine::NoPeer() const {
  if (stopping_.load(std::memory_order_acquire)) return StoppingStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("this podlinkd talks to too many other nodes already (", kMaxPeers, ")"));
}

absl::Status MeshEngine::NotQueued(const std::string& node) const {
  if (stopping_.load(std::memory_order_acquire)) return StoppingStatus();
  return absl::ResourceExhaustedError(absl::StrCat("too many opens of node ", node, " wait already"));
}

void MeshEngine::SeenInstance(const std::string& node, uint64_t instance) {
  if (instance == 0) return;  // an older daemon: it does not say
  std::vector<uint64_t> stale;
  {
    absl::MutexLock l(&mu_);
    uint64_t& seen = caller_instances_[node];
    if (seen == instance) return;
    const bool restarted = seen != 0;
    seen = instance;
    if (!restarted) return;
    for (const auto& [g, grant] : grants_) {
      if (grant.node == node && grant.caller_instance != 0 && grant.caller_instance != instance) stale.push_back(g);
    }
    restarted_peer_grants_dropped_ += stale.size();
  }
  Log()->info("event=mesh_peer_restarted node={} dropped_grants={}", node, stale.size());
  for (uint64_t g : stale) CloseRegion(node, g);
}

void MeshEngine::Learn(const std::string& node, const std::vector<std::string>& addresses, uint32_t port) {
  constexpr size_t kMaxKnown = 1024;
  if (!ValidNodeName(node) || node == node_name_ || port == 0 || port > 65535 || addresses.empty() ||
      addresses.size() > 64) {
    return;
  }
  for (const std::string& a : addresses) {
    if (!IpPrefix::Parse(a).ok()) return;
  }
  absl::MutexLock l(&mu_);
  if (!known_.contains(node) && known_.size() >= kMaxKnown) return;
  known_[node] = Known{addresses, port};
}

std::vector<IpPrefix> MeshEngine::LocalForPaths() const {
  return options_.addresses.empty() ? LocalAddresses(options_.interfaces) : advertised_;
}

std::vector<std::string> MeshEngine::AdvertisedAddresses() const {
  std::vector<std::string> out;
  for (const IpPrefix& a : advertised_) out.push_back(a.ToString());
  return out;
}

std::vector<pb::LinkInfo> MeshEngine::LocalLinks() const {
  absl::MutexLock l(&links_mu_);
  return local_links_;
}

void MeshEngine::RefreshLocalLinks() {
  {
    absl::MutexLock l(&links_mu_);
    if (absl::Now() - local_links_read_ < absl::Seconds(60)) return;
    local_links_read_ = absl::Now();
  }
  std::vector<pb::LinkInfo> links = ReadLocalLinks();
  absl::MutexLock l(&links_mu_);
  local_links_ = std::move(links);
}

// Reads sysfs: a GID table can hold a thousand entries per port, so this is
// never done on a call's thread (RefreshLocalLinks, on the housekeeping thread).
std::vector<pb::LinkInfo> MeshEngine::ReadLocalLinks() const {
  std::vector<pb::LinkInfo> out;
  for (const IpPrefix& a : advertised_) {
    NicInfo nic = ReadNic(options_.sysfs, a.netdev);
    pb::LinkInfo l;
    l.set_address(a.ToString());
    l.set_netdev(nic.netdev);
    l.set_speed_mbps(nic.speed_mbps);
    l.set_pci_path(nic.pci_path);
    l.set_numa_node(nic.numa_node);
    l.set_gid_index(-1);
    if (absl::StatusOr<verbs::GidChoice> gid = verbs::ChooseGid(options_.verbs.sysfs, a); gid.ok()) {
      l.set_rdma_device(gid->device);
      l.set_gid_index(gid->index);
      l.set_gid_type(gid->roce_v2 ? "RoCE v2" : "RoCE v1");
    }
    out.push_back(std::move(l));
  }
  return out;
}

PathPreference MeshEngine::RankFor(const std::vector<Path>& paths, const std::string& gpu_bus_id) const {
  std::vector<RankedPath> ranked;
  for (const Path& p : paths) ranked.push_back({PathName(p), ReadNic(options_.sysfs, p.local.netdev)});
  MemoryPlace place = gpu_bus_id.empty() ? MemoryPlace{} : GpuPlace(options_.sysfs, gpu_bus_id);
  return RankPaths(ranked, place);
}

// --- exporting side ----------------------------------------------------------

std::unique_ptr<MeshEngine> MeshEngine::ForTesting(MeshOptions options, std::string node_name, MeshHost* host) {
  return std::unique_ptr<MeshEngine>(new MeshEngine(std::move(options), std::move(node_name), host));
}

uint64_t MeshEngine::GrantForTesting(const std::string& node, std::shared_ptr<const ExportRecord> rec) {
  absl::MutexLock l(&mu_);
  uint64_t g = 0;
  while (g == 0 || grants_.contains(g)) g = RandomU64();
  grants_[g] = Grant{node, rec, node + "/test", nullptr, 0, {}, 0};
  SeenLocked(node);  // a grant given is a sign of life, however long the node was quiet
  ++grants_per_node_[node];
  return g;
}

absl::StatusOr<std::vector<std::string>> MeshEngine::IssueCookies(const std::string& node, uint32_t n) {
  if (n == 0 || n > 64) return absl::InvalidArgumentError("OpenLink: 1 to 64 connections");
  absl::Time now = absl::Now();
  absl::MutexLock l(&mu_);
  size_t mine = 0;
  for (auto it = cookies_.begin(); it != cookies_.end();) {
    if (it->second.expires < now) {
      it = cookies_.erase(it);
      continue;
    }
    mine += it->second.node == node;
    ++it;
  }
  if (mine + n > 256) {
    return absl::ResourceExhaustedError(absl::StrCat("node ", node, " holds ", mine, " unused link cookies"));
  }
  std::vector<std::string> out;
  for (uint32_t i = 0; i < n; ++i) {
    std::string c = RandomCookie();
    cookies_[c] = Cookie{node, now + absl::Seconds(10)};
    out.push_back(std::move(c));
  }
  return out;
}

void MeshEngine::OpenRegionFor(const std::string& node, const pb::OpenRegionRequest& req, RegionDone done) {
  if (node != node_name_) SeenInstance(node, req.caller_instance());
  if (!req.has_route()) return done(OpenRegion(node, req));
  absl::StatusOr<CheckedClaim> claim = CheckClaim(node, req.route());
  if (!claim.ok()) {
    Log()->warn("event=mesh_deny peer={} reason={}", node, LogQuoted(claim.status().message()));
    {
      absl::MutexLock l(&mu_);
      ++remote_denials_;
    }
    return done(claim.status());
  }
  if (claim->next.empty()) return done(OpenRegion(node, req, &claim->claim));
  Relay(node, *claim, req, std::move(done));
}

absl::StatusOr<MeshEngine::CheckedClaim> MeshEngine::CheckClaim(const std::string& caller,
                                                                const pb::Route& route) const {
  constexpr size_t kMaxClaim = 64 << 10;
  CheckedClaim out;
  pb::OriginClaim& claim = out.claim;
  if (route.claim().size() > kMaxClaim || !claim.ParseFromString(route.claim())) {
    return absl::PermissionDeniedError("the route's claim does not parse");
  }
  if (!ValidNodeName(claim.origin()) || !ValidNodeName(claim.destination().node())) {
    return absl::PermissionDeniedError("the claim names no valid origin or destination");
  }
  PODLINK_RETURN_IF_ERROR(VerifyNodeSignature(CurrentPems().ca, route.origin_cert(), claim.origin(), route.claim(),
                                              route.signature()));
  // Fresh: a claim is used within seconds of being made (a minute for
  // clocks that differ).
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  if (claim.issued_unix_seconds() < now - 60 || claim.issued_unix_seconds() > now + 60) {
    return absl::PermissionDeniedError(absl::StrCat("the claim of node ", claim.origin(), " is stale or from the future"));
  }
  if (claim.importer().node() != claim.origin()) {
    return absl::PermissionDeniedError(absl::StrCat("node ", claim.origin(), " cannot open regions for pods of node '",
                                                    claim.importer().node(), "'"));
  }
  const auto& via = claim.via();
  if (via.empty() || static_cast<size_t>(via.size()) > kMaxRelays) {
    return absl::PermissionDeniedError(absl::StrCat("a route has 1 to ", kMaxRelays, " relays"));
  }
  std::set<std::string> seen = {claim.origin(), claim.destination().node()};
  if (seen.size() != 2) return absl::PermissionDeniedError("a route's origin is its destination");
  for (const std::string& v : via) {
    if (!seen.insert(v).second) return absl::PermissionDeniedError("a route names a node twice");
  }
  // This node's place on the route, and the caller must be the node before it.
  std::string before;
  if (claim.destination().node() == node_name_) {
    before = via.Get(via.size() - 1);
  } else {
    int at = 0;
    while (at < via.size() && via.Get(at) != node_name_) ++at;
    if (at == via.size()) {
      return absl::PermissionDeniedError(absl::StrCat("node ", node_name_, " is not on the route of node ",
                                                      claim.origin(), "'s claim"));
    }
    before = at == 0 ? claim.origin() : via.Get(at - 1);
    out.next_is_relay = at + 1 < via.size();
    out.relays_after = via.size() - at - 1;
    out.next = out.next_is_relay ? via.Get(at + 1) : claim.destination().node();
  }
  if (caller != before) {
    return absl::PermissionDeniedError(absl::StrCat("node ", caller, " is not the hop before this node on node ",
                                                    claim.origin(), "'s route (", before, " is)"));
  }
  return out;
}

absl::StatusOr<pb::OpenRegionResponse> MeshEngine::OpenRegion(const std::string& node,
                                                              const pb::OpenRegionRequest& plain,
                                                              const pb::OriginClaim* claim) {
  if (node == node_name_) {
    return absl::PermissionDeniedError(absl::StrCat("a peer presented this node's own name '", node, "'"));
  }
  if (plain.has_route() && claim == nullptr) return absl::PermissionDeniedError("a relayed open without its checked claim");
  // Relayed: the importer and the target are what the origin signed (its
  // claim was checked by OpenRegionFor), and the pod is the origin's.
  std::string origin = node;
  pb::OpenRegionRequest req = plain;
  if (claim != nullptr) {
    origin = claim->origin();
    *req.mutable_importer() = claim->importer();
    if (claim->target_case() == pb::OriginClaim::kName) {
      req.set_name(claim->name());
    } else {
      req.set_export_id(claim->export_id());
    }
    if (origin == node_name_) {
      return absl::PermissionDeniedError("a relay presented a claim of this node's own pods");
    }
    absl::MutexLock l(&mu_);
    if (fenced_nonces_.contains({origin, claim->nonce()})) {
      ++remote_denials_;
      return absl::PermissionDeniedError(absl::StrCat("node ", origin, " fenced this route"));
    }
  }
  const pb::ForwardedIdentity& who = req.importer();
  if (who.node() != origin) {
    Log()->warn("event=mesh_deny peer={} claimed_node={} reason=\"a daemon speaks only for its own node's pods\"",
                node, LogQuoted(who.node()));
    absl::MutexLock l(&mu_);
    ++remote_denials_;
    return absl::PermissionDeniedError(absl::StrCat("the daemon of node ", node,
                                                    " cannot open regions for pods of node '", who.node(), "'"));
  }
  if (who.key().empty() || who.namespace_().empty() || who.pod_name().empty()) {
    return absl::InvalidArgumentError("the forwarded identity needs key, namespace and pod name");
  }
  PodInfo pod;
  pod.key = absl::StrCat("mesh/", origin, "/", who.key());  // never the same pod as a local one
  pod.uid = who.pod_uid();
  pod.namespace_ = who.namespace_();
  pod.name = who.pod_name();
  pod.annotations.insert(who.annotations().begin(), who.annotations().end());
  pod.source = origin == node ? "mesh:" + node : absl::StrCat("mesh:", origin, " via ", node);
  absl::StatusOr<std::shared_ptr<const ExportRecord>> rec = host_->AuthorizeRemote(pod, req);
  if (!rec.ok()) {
    absl::MutexLock l(&mu_);
    ++remote_denials_;
    return rec.status();
  }
  pb::OpenRegionResponse resp;
  {
    absl::MutexLock l(&mu_);
    uint32_t& count = grants_per_node_[node];
    if (count >= options_.max_grants_per_peer) {
      return absl::ResourceExhaustedError(absl::StrCat("node ", node, " holds ", count, " grants (the limit)"));
    }
    uint32_t& mine = grants_per_pod_[pod.key];
    if (mine >= options_.max_grants_per_pod) {
      return absl::ResourceExhaustedError(absl::StrCat("pod ", pod.Ref(), " holds ", mine, " regions of this node (the limit)"));
    }
    ++count;
    ++mine;
    uint64_t g = 0;
    while (g == 0 || grants_.contains(g)) g = RandomU64();  // unguessable, never reused across restarts
    // A fenceable route's grant: known by its nonce, its writes landing
    // chunk by chunk (LandFenceable), never registered for RDMA below.
    const bool fenceable = claim != nullptr && claim->fenceable() && claim->nonce() != 0;
    grants_[g] = Grant{node, *rec, pod.key, nullptr, req.caller_instance(), fenceable ? origin : std::string(),
                       fenceable ? claim->nonce() : 0};
    if (fenceable) routed_grants_.emplace(claim->nonce(), g);
    SeenLocked(node);  // a grant given is a sign of life, however long the node was quiet
    resp.set_grant(g);
  }
  if (req.verbs()) {
    absl::Status st = RegisterForVerbs(node, resp.grant(), *rec, req.accepts_over_tcp(), req.accepts_staged(),
                                       /*may_register=*/claim == nullptr || !claim->fenceable(), &resp);
    if (!st.ok()) {
      CloseRegion(node, resp.grant());
      return st;
    }
  }
  resp.set_export_id((*rec)->id);
  resp.set_size((*rec)->size);
  resp.set_handle_type(3);  // podlink.v1.HANDLE_TYPE_HOST_MEMFD
  resp.set_owner_namespace((*rec)->owner.namespace_);
  resp.set_owner_name((*rec)->owner.name);
  resp.set_instance(instance_);
  Log()->info("event=mesh_grant peer={} pod={}/{} export={} grant={} origin={}", node, pod.namespace_, pod.name,
              (*rec)->id, resp.grant(), origin);
  return resp;
}

void MeshEngine::Relay(const std::string& caller, const CheckedClaim& checked, const pb::OpenRegionRequest& req,
                       RegionDone done) {
  // Over the caller's queue pairs a relay's grant is staged: its bounce
  // pool for the caller holds each slice until the next node took it (a
  // relay has no memory of its own to register). An importer that cannot
  // take staged grants, or a relay that cannot pin a pool, uses TCP to here.
  uint64_t staged_slice = 0;
  if (req.verbs()) {
    absl::Status st = req.accepts_staged() ? absl::OkStatus()
                                           : absl::FailedPreconditionError(
                                                 "relayed regions ride TCP links to a relay unless staged over verbs");
    absl::StatusOr<verbs::VerbsServer*> server = VerbsServing();
    if (st.ok()) st = server.ok() ? (*server)->PrepareStaging(caller) : server.status();
    if (!st.ok()) {
      return done(absl::FailedPreconditionError(absl::StrCat("relay ", node_name_, kRelayCannotStage, st.message())));
    }
    staged_slice = (*server)->stage_slot_bytes();
  }
  // The next node: the relay after this one (it must be known here), or the
  // destination (whose addresses the origin signed).
  const pb::OriginClaim& claim = checked.claim;
  RemoteTarget next;
  next.node_name = checked.next;
  if (checked.next_is_relay) {
    bool known = false;
    {
      absl::MutexLock l(&mu_);
      if (auto it = known_.find(next.node_name); it != known_.end()) {
        known = true;
        next.addresses = it->second.addresses;
        next.port = it->second.port;
      }
    }
    if (!known) {
      return done(absl::FailedPreconditionError(
          absl::StrCat("relay ", node_name_, " does not know node ", next.node_name, " (mesh.peers)")));
    }
  } else {
    next.addresses.assign(claim.destination().addresses().begin(), claim.destination().addresses().end());
    next.port = claim.destination().port();
  }
  if (next.port == 0 || next.port > 65535 || next.addresses.size() > 64) {
    return done(absl::InvalidArgumentError("the route's next node has no valid port or too many addresses"));
  }
  const std::string pod = absl::StrCat("mesh/", claim.origin(), "/", claim.importer().key());
  {
    absl::MutexLock l(&mu_);
    if (grants_per_node_[caller] >= options_.max_grants_per_peer || grants_per_pod_[pod] >= options_.max_grants_per_pod) {
      return done(absl::ResourceExhaustedError(absl::StrCat("node ", caller, " or its pod holds its limit of grants")));
    }
  }
  // Over this node's transport to the next node, a relay too: over verbs
  // the next relay stages the region for this one (as this one does for the
  // caller); one that cannot is reached over TCP instead (below).
  std::shared_ptr<Peer> peer = PeerFor(next, /*tcp=*/false);
  if (peer == nullptr) return done(NoPeer());
  auto answer = std::make_shared<RegionDone>(std::move(done));
  Peer* p = peer.get();
  bool posted = p->Post([this, p, caller, next, req, pod, answer, origin = claim.origin(), staged_slice,
                         destination = claim.destination().node(), next_is_relay = checked.next_is_relay,
                         relays_after = checked.relays_after] {
    std::shared_ptr<Peer> peer = p->shared_from_this();
    RegionDone done = std::move(*answer);
    *answer = nullptr;
    if (stopping_.load(std::memory_order_acquire)) return done(StoppingStatus());
    // Onward as for this node's own pods: direct paths (the kernel's routing
    // only where mesh.fallback says so), over TCP where no RDMA path comes up.
    // `self`: this lambda, to open again over TCP.
    auto open_on = [this, caller, next, req, pod, done, origin, staged_slice, destination, next_is_relay,
                    relays_after](const auto& self, const std::shared_ptr<Peer>& peer) -> void {
      // Onward over this node's own transport: over verbs the owner registers
      // the export for this node's queue pairs, as for its own pods.
      std::shared_ptr<verbs::VerbsLinks> vl = std::dynamic_pointer_cast<verbs::VerbsLinks>(peer->links());
      pb::OpenRegionResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.open_per_hop * (1 + relays_after)));
      std::shared_ptr<pb::Mesh::Stub> stub = peer->stub();
      pb::OpenRegionRequest onward = req;
      onward.set_caller_instance(instance_);
      onward.set_verbs(vl != nullptr);
      onward.set_accepts_over_tcp(true);
      onward.set_accepts_staged(vl != nullptr);
      if (absl::Status st = FromGrpc(stub->OpenRegion(&ctx, onward, &resp), next.node_name); !st.ok()) {
        // The next relay cannot stage over verbs (no bounce pool for this
        // node, or an older version): the hop to it goes over TCP.
        if (vl != nullptr && next_is_relay && RelayCannotStage(st)) {
          Log()->info("event=mesh_relay_over_tcp relay={} destination={} why={}", next.node_name, destination,
                      LogQuoted(std::string(st.message()).substr(0, 256)));
          return OverTcp(next, [self, done](absl::StatusOr<std::shared_ptr<Peer>> tcp) {
            if (!tcp.ok()) return done(tcp.status());
            self(self, *tcp);
          });
        }
        return done(st);
      }
      // The relay's grant, forwarding to the next node's grant on `carrier`.
      auto install = [this, caller, req, pod, done, origin, next, staged_slice](const std::shared_ptr<Peer>& carrier,
                                                                   pb::OpenRegionResponse resp) {
        auto fwd = std::make_shared<Forward>(Forward{carrier, resp.grant(), resp.size(), resp.instance()});
        bool over = false;
        uint64_t g = 0;
        {
          absl::MutexLock l(&mu_);
          uint32_t& count = grants_per_node_[caller];
          uint32_t& mine = grants_per_pod_[pod];
          if (stopping_.load(std::memory_order_acquire) || count >= options_.max_grants_per_peer ||
              mine >= options_.max_grants_per_pod) {
            over = true;
          } else {
            ++count;
            ++mine;
            while (g == 0 || grants_.contains(g)) g = RandomU64();
            grants_[g] = Grant{caller, {}, pod, fwd, req.caller_instance(), {}, 0};
            SeenLocked(caller);  // a grant given is a sign of life, however long the node was quiet
            ++relayed_opens_;
          }
        }
        if (over) {
          ReleaseRemoteGrant(carrier.get(), resp.grant());
          if (stopping_.load(std::memory_order_acquire)) return done(StoppingStatus());
          return done(absl::ResourceExhaustedError(absl::StrCat("node ", caller, " or its pod holds its limit of grants")));
        }
        Log()->info("event=mesh_relay_grant peer={} origin={} next={} grant={}", caller, origin, next.node_name, g);
        resp.set_grant(g);
        resp.set_instance(instance_);
        resp.clear_verbs_keys();
        resp.clear_over_tcp_reason();
        resp.clear_staged_reason();
        resp.clear_staged_slice_bytes();
        if (staged_slice != 0) {
          resp.set_staged_reason(absl::StrCat("relay ", node_name_, " stores and forwards"));
          resp.set_staged_slice_bytes(staged_slice);
        }
        done(std::move(resp));
      };
      CarryGrant(peer, next, resp, [install, resp](const std::shared_ptr<Peer>& carrier) { install(carrier, resp); },
                 [done](absl::Status st) { done(std::move(st)); });
    };
    ConnectOrOverTcp(
        peer, next, [open_on](const std::shared_ptr<Peer>& peer) { open_on(open_on, peer); },
        [done](absl::Status st) { done(std::move(st)); });
  });
  if (!posted) {
    (*answer)(NotQueued(next.node_name));
  }
}

bool MeshEngine::ReserveRelay(const std::string& node, uint64_t n) {
  absl::MutexLock l(&mu_);
  const uint64_t cap = options_.relay_staging_bytes, per_node = std::max<uint64_t>(cap / 2, kMaxFramePayload);
  auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_.load(std::memory_order_acquire) ||
           (relay_staged_ + n <= std::max(cap, n) && relay_staged_by_node_[node] + n <= per_node);
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&room), options_.answer_timeout) ||
      stopping_.load(std::memory_order_acquire)) {
    return false;
  }
  relay_staged_ += n;
  relay_staged_by_node_[node] += n;
  return true;
}

void MeshEngine::ReleaseRelay(const std::string& node, uint64_t n) {
  absl::MutexLock l(&mu_);
  relay_staged_ -= n;
  if ((relay_staged_by_node_[node] -= n) == 0) relay_staged_by_node_.erase(node);
}

absl::Status MeshEngine::ServeForward(const std::shared_ptr<ConnWriter>& writer, int fd, const FrameHeader& h,
                                      const std::string& node, uint64_t link_instance, const Forward& fwd) {
  const auto type = static_cast<FrameType>(h.type);
  const LinkKey key{node, link_instance};
  const uint32_t transfer = TransferOfTag(h.tag);
  const uint64_t n = type == FrameType::kNotify ? 0 : h.length;
  // A write was registered by the caller (BeginWrite); whatever happens, it
  // ends once, here or in its completion.
  auto end = [this, key, transfer, type] {
    if (type == FrameType::kWrite) EndWrite(key, transfer);
  };
  absl::Status st;
  if (type != FrameType::kNotify &&
      (h.length == 0 || h.offset > fwd.size || h.length > fwd.size - h.offset)) {
    st = absl::OutOfRangeError(absl::StrCat("range [", h.offset, ", +", h.length, ") exceeds the region of ",
                                            fwd.size, " bytes"));
  } else if (fwd.peer->instance.load(std::memory_order_acquire) != fwd.instance) {
    st = absl::UnavailableError(absl::StrCat("node ", fwd.peer->node(), "'s podlinkd restarted: open the region again"));
  } else if (auto links = fwd.peer->links(); links == nullptr || links->live() == 0) {
    st = absl::UnavailableError(absl::StrCat("this relay has no link up to node ", fwd.peer->node()));
  } else if (n > 0 && !ReserveRelay(node, n)) {
    st = absl::ResourceExhaustedError("the relay's staging stayed full");
  }
  if (!st.ok()) {
    absl::Status io = type == FrameType::kWrite ? Discard(fd, h.length) : absl::OkStatus();
    end();
    return io.ok() ? writer->Ack(h.tag, st) : io;
  }
  std::shared_ptr<char[]> buf(n > 0 ? new char[n] : nullptr);
  if (type == FrameType::kWrite) {
    if (absl::Status io = ReadFull(fd, buf.get(), n); !io.ok()) {
      ReleaseRelay(node, n);
      end();
      return io;
    }
  }
  LinkOp op;
  op.type = type;
  op.grant = fwd.grant;
  op.offset = h.offset;
  op.length = n;
  op.local = buf.get();
  op.keep = buf;
  const uint64_t tag = h.tag;
  op.done = [this, writer, buf, tag, type, n, node, key, transfer, end](const absl::Status& result) {
    if (type == FrameType::kRead && result.ok()) {
      FrameHeader d{};
      d.magic = kFrameMagic;
      d.type = static_cast<uint16_t>(FrameType::kData);
      d.length = static_cast<uint32_t>(n);
      d.tag = tag;
      (void)writer->Frame(d, buf.get(), n);
    } else {
      if (type == FrameType::kNotify && result.ok()) MarkFinished(key, transfer);
      (void)writer->Ack(tag, result);
    }
    if (n > 0) ReleaseRelay(node, n);
    if (result.ok()) {
      absl::MutexLock l(&mu_);
      relay_forwarded_bytes_ += n;
    }
    end();
  };
  std::shared_ptr<DataLinks> links = fwd.peer->links();
  absl::Status submitted = links == nullptr ? absl::UnavailableError("the relay's link went down") : absl::OkStatus();
  auto failed = op.done;
  if (submitted.ok()) submitted = links->Submit(std::move(op));
  if (!submitted.ok()) failed(submitted);  // Submit calls `done` only when it queued the request
  return absl::OkStatus();
}

void MeshEngine::CloseRegion(const std::string& node, uint64_t grant) {
  {
    absl::MutexLock l(&verbs_mu_);
    if (verbs_server_ != nullptr) verbs_server_->Unregister(grant, node);
  }
  std::shared_ptr<const Forward> fwd;
  {
    absl::MutexLock l(&mu_);
    auto it = grants_.find(grant);
    if (it == grants_.end() || it->second.node != node) return;
    --grants_per_node_[node];
    if (auto p = grants_per_pod_.find(it->second.pod); p != grants_per_pod_.end() && --p->second == 0) {
      grants_per_pod_.erase(p);
    }
    fwd = std::move(it->second.forward);
    if (const uint64_t nonce = it->second.nonce; nonce != 0) {
      auto [from, to] = routed_grants_.equal_range(nonce);
      for (auto r = from; r != to; ++r) {
        if (r->second == grant) {
          routed_grants_.erase(r);
          break;
        }
      }
    }
    grants_.erase(it);
  }
  // A relay closes its own grant onward.
  if (fwd != nullptr) ReleaseRemoteGrant(fwd->peer.get(), fwd->grant);
}

absl::StatusOr<MeshEngine::Granted> MeshEngine::LookupGrant(const std::string& node, uint64_t grant) {
  Granted g;
  {
    absl::MutexLock l(&mu_);
    auto it = grants_.find(grant);
    if (it == grants_.end() || it->second.node != node) {
      return absl::NotFoundError(absl::StrCat("no grant ", grant, " for node ", node));
    }
    if (it->second.forward != nullptr) {
      g.forward = it->second.forward;
      return g;
    }
    g.record = it->second.record.lock();
    g.fenceable = it->second.nonce != 0;
  }
  if (g.record == nullptr || !host_->ExportLive(*g.record)) {
    CloseRegion(node, grant);
    return absl::NotFoundError(absl::StrCat("the export behind grant ", grant, " was withdrawn"));
  }
  return g;
}

bool MeshEngine::BeginLanding(uint64_t grant) {
  absl::MutexLock l(&mu_);
  if (!grants_.contains(grant)) return false;
  ++grant_writes_[grant];
  return true;
}

void MeshEngine::EndLanding(uint64_t grant) {
  absl::MutexLock l(&mu_);
  auto it = grant_writes_.find(grant);
  if (it != grant_writes_.end() && --it->second == 0) grant_writes_.erase(it);
}

absl::Status MeshEngine::LandFenceable(int fd, uint64_t grant, char* dst, uint64_t n, absl::Status* landed) {
  for (uint64_t done = 0; done < n;) {
    const uint64_t chunk = std::min<uint64_t>(kGpuChunk, n - done);
    char* buf = ChunkBuffer();
    PODLINK_RETURN_IF_ERROR(ReadFull(fd, buf, chunk));
    if (landed->ok() && !BeginLanding(grant)) *landed = absl::FailedPreconditionError("the route was fenced");
    if (landed->ok()) {
      std::memcpy(dst + done, buf, chunk);
      EndLanding(grant);
    }
    done += chunk;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> MeshEngine::FenceRoute(const std::string& origin, uint64_t nonce) {
  if (nonce == 0) return absl::InvalidArgumentError("a route's nonce is not 0");
  std::vector<std::pair<std::string, uint64_t>> fenced;  // holder (the last relay), grant
  {
    absl::MutexLock l(&mu_);
    // The wait below holds a gRPC thread: one per origin at a time.
    if (!fencing_.insert(origin).second) {
      return absl::ResourceExhaustedError(absl::StrCat("node ", origin, " has a fence waiting here already"));
    }
    // A relay presenting the claim again gets nothing (claims live a minute).
    constexpr size_t kFencedNonces = 4096;
    const absl::Time now = absl::Now();
    for (auto it = fenced_nonces_.begin(); it != fenced_nonces_.end();) {
      it = now - it->second > absl::Minutes(2) ? fenced_nonces_.erase(it) : std::next(it);
    }
    if (fenced_nonces_.size() >= kFencedNonces) fenced_nonces_.erase(fenced_nonces_.begin());
    fenced_nonces_[{origin, nonce}] = now;
    auto [from, to] = routed_grants_.equal_range(nonce);
    for (auto r = from; r != to; ++r) {
      auto it = grants_.find(r->second);
      if (it != grants_.end() && it->second.origin == origin) fenced.emplace_back(it->second.node, r->second);
    }
  }
  // Closed first: frames on them are refused from now on, and a frame
  // already being read lands no further chunk (BeginLanding). Then the
  // chunks being copied in right now finish.
  for (const auto& [holder, g] : fenced) CloseRegion(holder, g);
  absl::MutexLock l(&mu_);
  fenced_grants_ += fenced.size();
  auto quiet = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& f : fenced) {
      if (grant_writes_.contains(f.second)) return false;
    }
    return true;
  };
  const bool landed = mu_.AwaitWithTimeout(absl::Condition(&quiet), 2 * options_.io_timeout);
  fencing_.erase(origin);
  if (!landed) {
    Log()->warn("event=mesh_fence_timeout origin={} grants={}", origin, fenced.size());
    return absl::DeadlineExceededError(absl::StrCat("node ", node_name_, ": a chunk on node ", origin,
                                                    "'s fenced route is still being copied in"));
  }
  Log()->info("event=mesh_fence origin={} grants={}", origin, fenced.size());
  return static_cast<uint32_t>(fenced.size());
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> MeshEngine::GrantedExport(const std::string& node,
                                                                              uint64_t grant) {
  PODLINK_ASSIGN_OR_RETURN(Granted g, LookupGrant(node, grant));
  if (g.forward != nullptr) {
    return absl::NotFoundError(absl::StrCat("grant ", grant, " is a relay's: no export of this node behind it"));
  }
  return g.record;
}

void MeshEngine::AcceptLoop() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load(std::memory_order_acquire)) return;
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      Log()->error("event=mesh_accept_failed error={}", LogQuoted(std::strerror(errno)));
      return;
    }
    auto conn = std::make_shared<UniqueFd>(fd);
    absl::MutexLock l(&mu_);
    // Connections not yet authenticated have a small bound of their own, so
    // strangers cannot take the slots of peers.
    if (stopping_.load(std::memory_order_acquire) || serving_ >= options_.max_data_connections ||
        unauthenticated_ >= kMaxUnauthenticated) {
      ++refused_connections_;
      continue;  // closed: over the bound
    }
    ++serving_;
    ++unauthenticated_;
    serving_fds_.insert(fd);
    std::thread([this, conn] {
      ServeConnection(conn->get());
      // Forgotten and closed under one lock: the number cannot be reused by a
      // new connection while it is still listed.
      absl::MutexLock l(&mu_);
      serving_fds_.erase(conn->get());
      conn->Reset();
      --serving_;
    }).detach();
  }
}

void MeshEngine::ServeConnection(int fd) {
  // Nothing but AUTH, whole, within 2 s; a stranger gets no answer at all.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  FrameHeader h;
  std::string cookie(kCookieBytes, '\0');
  bool ok = ReadFullBefore(fd, &h, sizeof(h), deadline).ok() && h.magic == kFrameMagic &&
            h.type == static_cast<uint16_t>(FrameType::kAuth) && h.length == kCookieBytes &&
            ReadFullBefore(fd, cookie.data(), cookie.size(), deadline).ok();
  std::string node;
  const uint64_t link_instance = h.grant;
  {
    absl::MutexLock l(&mu_);
    --unauthenticated_;
    auto it = ok ? cookies_.find(cookie) : cookies_.end();
    if (it == cookies_.end() || it->second.expires < absl::Now()) {
      ++refused_connections_;
      if (ok) Log()->warn("event=mesh_data_refused reason=\"unknown or expired cookie\"");
      return;
    }
    node = it->second.node;
    cookies_.erase(it);
  }
  TuneDataSocket(fd, options_.io_timeout);
  Log()->info("event=mesh_data_connection peer={}", node);
  {
    absl::MutexLock l(&mu_);
    ++data_conns_of_[node];
  }
  ServeFrames(fd, node, link_instance);
  absl::MutexLock l(&mu_);
  if (--data_conns_of_[node] == 0) data_conns_of_.erase(node);
  last_seen_[node] = absl::Now();
}

MeshEngine::Pems MeshEngine::CurrentPems() const {
  absl::MutexLock l(&pem_mu_);
  return pems_;
}

void MeshEngine::ReloadPems() {
  {
    absl::MutexLock l(&pem_mu_);
    if (absl::Now() - pems_read_ < options_.cert_refresh) return;
    pems_read_ = absl::Now();
  }
  Pems p;
  absl::StatusOr<std::string> ca = ReadPem(options_.cert_dir, "ca.crt"), cert = ReadPem(options_.cert_dir, "tls.crt"),
                              key = ReadPem(options_.cert_dir, "tls.key");
  if (!ca.ok() || !cert.ok() || !key.ok()) {
    // Half-written or missing (a rotation in progress): keep what works.
    return;
  }
  p.ca = *std::move(ca);
  p.cert = *std::move(cert);
  p.key = *std::move(key);
  // The key must sign what the certificate vouches for, or claims made with
  // it would be refused everywhere: keep the old pair until both match.
  if (!SignWithKey(p.key, "podlink").ok() || !KeyMatchesCertificate(p.key, p.cert)) return;
  bool changed = false;
  {
    absl::MutexLock l(&pem_mu_);
    changed = p.ca != pems_.ca || p.cert != pems_.cert || p.key != pems_.key;
    if (changed) pems_ = std::move(p);
  }
  if (changed) Log()->info("event=mesh_certificates_reloaded dir={}", options_.cert_dir);
}

void MeshEngine::SeenLocked(const std::string& node) {
  if (last_seen_.contains(node) || last_seen_.size() < 4096) last_seen_[node] = absl::Now();
}

void MeshEngine::Touch(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
}

void MeshEngine::BeginCall(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
  ++calls_of_[node];  // authenticated nodes only, each a handful of calls
}

void MeshEngine::EndCall(const std::string& node) {
  absl::MutexLock l(&mu_);
  SeenLocked(node);
  auto it = calls_of_.find(node);
  if (it != calls_of_.end() && --it->second == 0) calls_of_.erase(it);
}

void MeshEngine::SweepIdleImporters() {
  const absl::Time now = absl::Now();
  std::map<std::string, std::vector<uint64_t>> idle;
  {
    absl::MutexLock l(&mu_);
    // By node (a handful), then the grants of idle ones only.
    for (const auto& [node, n] : grants_per_node_) {
      if (n == 0 || data_conns_of_.contains(node) || calls_of_.contains(node)) continue;
      auto seen = last_seen_.find(node);
      // A grant is given in a control call, which counts as seen.
      if (seen != last_seen_.end() && now - seen->second < options_.grant_idle_timeout) continue;
      idle[node];
    }
    if (idle.empty()) return;
    for (const auto& [g, grant] : grants_) {
      if (auto it = idle.find(grant.node); it != idle.end()) it->second.push_back(g);
    }
    for (const auto& [node, gs] : idle) {
      idle_peer_grants_dropped_ += gs.size();
      last_seen_.erase(node);
    }
  }
  for (const auto& [node, gs] : idle) {
    Log()->warn("event=mesh_importer_gone node={} dropped_grants={} idle_for=\"more than {}\"", node, gs.size(),
                absl::FormatDuration(options_.grant_idle_timeout));
    for (uint64_t g : gs) CloseRegion(node, g);
  }
}

void MeshEngine::KeepAlive() {
  std::set<std::shared_ptr<Peer>> peers;
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() - last_keepalive_ < options_.keepalive) return;
    last_keepalive_ = absl::Now();
    for (const auto& [id, h] : handles_) {
      peers.insert(h.peer);
      if (h.two_hop != nullptr) peers.insert(h.two_hop->peer);
    }
    for (const auto& [id, g] : grants_) {
      if (g.forward != nullptr) peers.insert(g.forward->peer);  // a relay holds grants onward too
    }
  }
  // Asynchronous calls on the peers' channels: never queued behind a peer
  // worker's long task, never blocking this thread.
  struct Call {
    std::shared_ptr<pb::Mesh::Stub> stub;
    grpc::ClientContext ctx;
    pb::HelloRequest req;
    pb::HelloResponse resp;
  };
  for (const std::shared_ptr<Peer>& p : peers) {
    std::shared_ptr<pb::Mesh::Stub> stub = p->stub();
    if (stub == nullptr) continue;
    auto call = std::make_shared<Call>();
    call->stub = stub;
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
    call->req.set_version(PODLINK_VERSION);
    call->req.set_instance(instance_);
    Call* c = call.get();
    stub->async()->Hello(&c->ctx, &c->req, &c->resp, [call](grpc::Status) mutable { call.reset(); });
  }
}

// --- node adverts ------------------------------------------------------------

namespace {
constexpr size_t kMaxAdvertsPerMessage = 48;
constexpr size_t kMaxAdvertEntry = 4 << 10;
constexpr int kAdvertLifetimes = 10;  // an advert older than this many intervals is stale
}  // namespace

std::shared_ptr<pb::Mesh::Stub> MeshEngine::NewStub(const std::string& node, const std::string& endpoint) const {
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(cert_files_);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  // The certificate must name the node we mean (the target name below).
  tls.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(node);
  return pb::Mesh::NewStub(grpc::CreateCustomChannel(endpoint, grpc::experimental::TlsCredentials(tls), args));
}

void MeshEngine::RefreshOwnAdvert() {
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() - own_advert_signed_ < options_.advert_interval) return;
    own_advert_signed_ = absl::Now();
  }
  pb::AdvertEntry entry;
  entry.mutable_node()->set_node(node_name_);
  for (const IpPrefix& a : advertised_) entry.mutable_node()->add_addresses(a.ToString());
  entry.mutable_node()->set_port(control_port_);
  const int64_t issued = absl::ToUnixSeconds(absl::Now());
  entry.set_issued_unix_seconds(issued);
  StoredAdvert own;
  own.issued = issued;
  entry.SerializeToString(own.advert.mutable_entry());
  const Pems pems = CurrentPems();
  absl::StatusOr<std::string> sig = SignWithKey(pems.key, own.advert.entry());
  if (!sig.ok()) {
    Log()->warn("event=mesh_advert_unsigned why={}", LogQuoted(sig.status().message()));
    return;
  }
  own.advert.set_signature(*std::move(sig));
  own.advert.set_cert(pems.cert);
  const int64_t oldest = issued - kAdvertLifetimes * absl::ToInt64Seconds(options_.advert_interval);
  absl::MutexLock l(&mu_);
  adverts_[node_name_] = std::move(own);
  for (auto it = adverts_.begin(); it != adverts_.end();) {
    it = it->second.issued < oldest ? adverts_.erase(it) : std::next(it);  // stale: its node went quiet
  }
}

void MeshEngine::AcceptAdverts(const std::string& from,
                               const google::protobuf::RepeatedPtrField<pb::NodeAdvert>& adverts) {
  if (adverts.empty()) return;
  const absl::Time now = absl::Now();
  const int64_t now_s = absl::ToUnixSeconds(now);
  const int64_t oldest = now_s - kAdvertLifetimes * absl::ToInt64Seconds(options_.advert_interval);
  {
    // Verifying costs a signature check per advert: one batch per sender a second.
    absl::MutexLock l(&mu_);
    auto it = adverts_from_.find(from);
    if (it != adverts_from_.end() && now - it->second < absl::Seconds(1)) return;
    if (it == adverts_from_.end() && adverts_from_.size() >= 4096) return;
    adverts_from_[from] = now;
  }
  const std::string ca = CurrentPems().ca;
  uint64_t refused = 0;
  int n = 0;
  for (const pb::NodeAdvert& a : adverts) {
    if (++n > static_cast<int>(kMaxAdvertsPerMessage)) break;
    pb::AdvertEntry entry;
    if (a.entry().size() > kMaxAdvertEntry || a.cert().size() > kMaxCertPem || a.signature().size() > kMaxSignature ||
        !entry.ParseFromString(a.entry())) {
      ++refused;
      continue;
    }
    const std::string& node = entry.node().node();
    const int64_t issued = entry.issued_unix_seconds();
    if (!ValidNodeName(node) || issued < oldest || issued > now_s + 60) {
      refused += ValidNodeName(node) ? 0 : 1;  // stale or early: simply not new
      continue;
    }
    if (node == node_name_) continue;  // this node's word about itself is its own
    {
      absl::MutexLock l(&mu_);
      auto it = adverts_.find(node);
      if (it != adverts_.end() && it->second.issued >= issued) continue;  // known already: no check again
      if (it == adverts_.end() && adverts_.size() >= 1024) continue;
    }
    if (absl::Status st = VerifyNodeSignature(ca, a.cert(), node, a.entry(), a.signature()); !st.ok()) {
      Log()->warn("event=mesh_advert_refused from={} node={} why={}", from, node, LogQuoted(st.message()));
      ++refused;
      continue;
    }
    std::vector<std::string> addresses(entry.node().addresses().begin(), entry.node().addresses().end());
    bool fresh = false;
    {
      absl::MutexLock l(&mu_);
      StoredAdvert& s = adverts_[node];
      if (s.issued >= issued) continue;  // a newer one came in meanwhile
      fresh = s.issued == 0;
      s.advert = a;
      s.issued = issued;
    }
    // Said by the node itself, whoever passed it on: routes may go through it.
    Learn(node, addresses, entry.node().port());
    if (fresh) {
      Log()->info("event=mesh_node_learned node={} from={} addresses={}", node, from,
                  LogQuoted(absl::StrJoin(addresses, ",")));
    }
  }
  if (refused > 0) {
    absl::MutexLock l(&mu_);
    adverts_refused_ += refused;
  }
}

void MeshEngine::AddAdverts(google::protobuf::RepeatedPtrField<pb::NodeAdvert>* out) const {
  const int64_t oldest =
      absl::ToUnixSeconds(absl::Now()) - kAdvertLifetimes * absl::ToInt64Seconds(options_.advert_interval);
  absl::MutexLock l(&mu_);
  std::vector<const StoredAdvert*> others;
  for (const auto& [node, s] : adverts_) {
    if (node == node_name_) continue;
    if (s.issued >= oldest) others.push_back(&s);
  }
  std::sort(others.begin(), others.end(),
            [](const StoredAdvert* a, const StoredAdvert* b) { return a->issued > b->issued; });
  if (auto own = adverts_.find(node_name_); own != adverts_.end()) *out->Add() = own->second.advert;
  for (const StoredAdvert* s : others) {
    if (static_cast<size_t>(out->size()) >= kMaxAdvertsPerMessage) break;
    *out->Add() = s->advert;
  }
}

void MeshEngine::TradeAdverts() {
  std::map<std::string, Known> neighbours;
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() - adverts_traded_ < options_.advert_interval) return;
    adverts_traded_ = absl::Now();
    neighbours = known_;
  }
  const std::vector<IpPrefix> local = LocalForPaths();
  struct Call {
    std::shared_ptr<pb::Mesh::Stub> stub;
    grpc::ClientContext ctx;
    pb::HelloRequest req;
    pb::HelloResponse resp;
  };
  for (const auto& entry : neighbours) {
    const std::string node = entry.first;  // a copy: the callback below keeps it (clang cannot capture a binding)
    const Known& k = entry.second;
    std::vector<IpPrefix> remote = ParsePrefixes(k.addresses);
    // Cabled to this node (a shared subnet): adverts travel hop by hop.
    std::vector<Path> paths = ChoosePaths(local, remote, false);
    if (paths.empty()) continue;
    std::shared_ptr<pb::Mesh::Stub> stub;
    {
      absl::MutexLock l(&mu_);
      stub = advert_stubs_[node];
    }
    if (stub == nullptr) {
      stub = NewStub(node, HostPort(paths.front().remote, k.port));
      absl::MutexLock l(&mu_);
      advert_stubs_[node] = stub;  // known_ is bounded, so is this
    }
    auto call = std::make_shared<Call>();
    call->stub = stub;
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
    call->req.set_version(PODLINK_VERSION);
    call->req.set_instance(instance_);
    AddAdverts(call->req.mutable_adverts());
    Call* c = call.get();
    {
      // The destructor cancels these and waits for their callbacks, which use the engine.
      absl::MutexLock l(&advert_calls_mu_);
      if (stopping_.load(std::memory_order_acquire)) return;
      advert_calls_.insert(&c->ctx);
    }
    stub->async()->Hello(&c->ctx, &c->req, &c->resp, [this, call, node](grpc::Status st) mutable {
      if (st.ok() && call->resp.node_name() == node && !stopping_.load(std::memory_order_acquire)) {
        AcceptAdverts(node, call->resp.adverts());
      }
      absl::MutexLock l(&advert_calls_mu_);
      advert_calls_.erase(&call->ctx);
      call.reset();
    });
  }
}

void MeshEngine::ServeFrames(int fd, const std::string& node, uint64_t link_instance) {
  auto writer = std::make_shared<ConnWriter>(fd);
  // Completions of forwarded requests write nothing after this returns.
  struct CloseOnExit {
    ConnWriter* w;
    ~CloseOnExit() { w->Close(); }
  } close_on_exit{writer.get()};
  FrameHeader h;
  auto refuse = [&](const char* why) {
    absl::MutexLock l(&mu_);
    ++refused_frames_;
    Log()->warn("event=mesh_protocol_error peer={} reason=\"{}\" type={}", node, why, h.type);
  };
  for (;;) {
    if (!ReadFull(fd, &h, sizeof(h)).ok()) return;
    if (h.magic != kFrameMagic || h.flags != 0) return refuse("bad magic or flags");
    auto type = static_cast<FrameType>(h.type);
    if ((type == FrameType::kWrite || type == FrameType::kRead) && h.length > kMaxFramePayload) {
      return refuse("length over the frame cap");
    }
    if ((type == FrameType::kNotify || type == FrameType::kDone) && h.length != 0) {
      return refuse("notify or done with payload");
    }
    if (type != FrameType::kWrite && type != FrameType::kRead && type != FrameType::kNotify &&
        type != FrameType::kDone) {
      return refuse("unexpected frame type");
    }
    const LinkKey key{node, link_instance};
    const uint32_t transfer = TransferOfTag(h.tag);
    if (type == FrameType::kDone) {
      MarkFinished(key, transfer);
      // Writes of this transfer already past the check finish first.
      if (!AwaitWrites(key, transfer, 2 * options_.io_timeout)) return refuse("DONE while writes still hang");
      if (!writer->Ack(h.tag, absl::OkStatus()).ok()) return;
      continue;
    }
    // A write of an unfinished transfer is registered before its bytes land,
    // so a DONE for the transfer waits for it (BeginWrite and Finished are
    // one decision under the lock).
    const bool late = type == FrameType::kWrite ? !BeginWrite(key, transfer)
                                                : type == FrameType::kNotify && Finished(key, transfer);
    if (late) {
      // A late copy (its connection failed after the slice went out again)
      // of a finished transfer, or a notification already delivered.
      {
        absl::MutexLock l(&mu_);
        ++(type == FrameType::kWrite ? late_slices_dropped_ : duplicate_notifies_);
      }
      absl::Status io = type == FrameType::kWrite ? Discard(fd, h.length) : absl::OkStatus();
      if (io.ok()) io = writer->Ack(h.tag, absl::OkStatus());
      if (!io.ok()) return;
      continue;
    }
    // One look at the grant: a relay's goes on to the next node.
    absl::StatusOr<Granted> granted = LookupGrant(node, h.grant);
    if (granted.ok() && granted->forward != nullptr) {
      if (!ServeForward(writer, fd, h, node, link_instance, *granted->forward).ok()) return;
      continue;
    }
    struct EndWriteOnExit {
      MeshEngine* e;
      const LinkKey& key;
      uint32_t transfer;
      bool active;
      ~EndWriteOnExit() {
        if (active) e->EndWrite(key, transfer);
      }
    } end_write{this, key, transfer, type == FrameType::kWrite};
    const bool fenceable = granted.ok() && granted->fenceable;
    absl::StatusOr<std::shared_ptr<const ExportRecord>> rec =
        granted.ok() ? absl::StatusOr<std::shared_ptr<const ExportRecord>>(granted->record) : granted.status();
    absl::StatusOr<RelayView> view = rec.ok() ? (*rec)->memory->MapForRelay() : rec.status();
    absl::Status st = view.status();
    if (st.ok() && type != FrameType::kNotify) {
      if (h.length == 0) {
        st = absl::InvalidArgumentError("length must be > 0");
      } else if (h.offset > (*rec)->size || h.length > (*rec)->size - h.offset) {
        st = absl::OutOfRangeError(absl::StrCat("range [", h.offset, ", +", h.length, ") exceeds export ",
                                                (*rec)->id, " of ", (*rec)->size, " bytes"));
      } else if (view->on_gpu && h.length > kMaxGpuFrame) {
        st = absl::InvalidArgumentError(absl::StrCat("a frame for GPU memory carries at most ", kMaxGpuFrame, " bytes"));
      } else if (!view->on_gpu) {
        // As the local relay does per copy: a range whose pages the owner
        // punched out is refused, never faulted in at podlinkd's expense.
        st = (*rec)->memory->CheckPopulated(h.offset, h.length);
      }
    }
    absl::Status io;
    switch (type) {
      case FrameType::kWrite:
        if (!st.ok()) {
          io = Discard(fd, h.length);
          if (io.ok()) io = writer->Ack(h.tag, st);
          break;
        }
        if (view->on_gpu) {
          // Through this thread's staging buffer, a chunk at a time, copied
          // to the GPU by its copy engine; a failed copy still reads the frame.
          // A fenceable grant's chunk is copied only while the grant is open.
          absl::Status copy;
          for (uint64_t done = 0; done < h.length && io.ok();) {
            uint64_t n = std::min<uint64_t>(kGpuChunk, h.length - done);
            char* buf = ChunkBuffer();
            io = ReadFull(fd, buf, n);
            if (io.ok() && copy.ok() && fenceable && !BeginLanding(h.grant)) {
              copy = absl::FailedPreconditionError("the route was fenced");
            } else if (io.ok() && copy.ok()) {
              copy = TimedGpuCopy([&] { return (*rec)->memory->CopyIn(h.offset + done, buf, n); });
              if (fenceable) EndLanding(h.grant);
            }
            done += n;
          }
          if (io.ok()) io = writer->Ack(h.tag, copy);
          if (!copy.ok()) break;
        } else if (fenceable) {
          absl::Status landed;
          io = LandFenceable(fd, h.grant, reinterpret_cast<char*>(view->address) + h.offset, h.length, &landed);
          if (io.ok()) io = writer->Ack(h.tag, landed);
          if (!landed.ok()) break;
        } else {
          io = ReadFull(fd, reinterpret_cast<char*>(view->address) + h.offset, h.length);
          if (io.ok()) io = writer->Ack(h.tag, absl::OkStatus());
        }
        if (io.ok()) {
          absl::MutexLock l(&mu_);
          bytes_written_in_ += h.length;
          ++frames_served_;
        }
        break;
      case FrameType::kRead: {
        if (!st.ok()) {
          io = writer->Ack(h.tag, st);
          break;
        }
        FrameHeader d{};
        d.magic = kFrameMagic;
        d.type = static_cast<uint16_t>(FrameType::kData);
        d.length = h.length;
        d.tag = h.tag;
        if (view->on_gpu) {
          // The first chunk is copied before the header goes, so an export
          // that cannot be copied is refused instead of cut off.
          uint64_t n = std::min<uint64_t>(kGpuChunk, h.length);
          char* buf = ChunkBuffer();
          if (absl::Status c = TimedGpuCopy([&] { return (*rec)->memory->CopyOut(h.offset, buf, n); }); !c.ok()) {
            io = writer->Ack(h.tag, c);
            break;
          }
          absl::MutexLock whole_frame(&writer->mu());
          io = WriteFull(fd, &d, sizeof(d));
          for (uint64_t done = 0; io.ok();) {
            io = WriteFull(fd, buf, n);
            done += n;
            if (!io.ok() || done == h.length) break;
            n = std::min<uint64_t>(kGpuChunk, h.length - done);
            if (absl::Status c = TimedGpuCopy([&] { return (*rec)->memory->CopyOut(h.offset + done, buf, n); });
                !c.ok()) {
              io = c;  // the peer sees the connection end and sends the slice again elsewhere
            }
          }
        } else {
          // Copied into the kernel, never sent from the pages themselves: a
          // zero-copy answer still queued when the grant ends would carry
          // whatever the owning pod writes there afterwards.
          io = writer->Frame(d, reinterpret_cast<const char*>(view->address) + h.offset, h.length);
        }
        if (io.ok()) {
          absl::MutexLock l(&mu_);
          bytes_read_out_ += h.length;
          ++frames_served_;
        }
        break;
      }
      default:  // kNotify
        if (st.ok()) st = host_->NotifyOwner(**rec, h.offset);
        if (st.ok()) MarkFinished(key, transfer);
        io = writer->Ack(h.tag, st);
        break;
    }
    if (!io.ok()) return;
  }
}

bool MeshEngine::Finished(const LinkKey& key, uint32_t transfer) const {
  absl::MutexLock l(&mu_);
  auto it = finished_.find(key);
  return it != finished_.end() && it->second.contains(transfer);
}

bool MeshEngine::BeginWrite(const LinkKey& key, uint32_t transfer) {
  absl::MutexLock l(&mu_);
  auto it = finished_.find(key);
  if (it != finished_.end() && it->second.contains(transfer)) return false;
  ++writing_[{key, transfer}];
  return true;
}

void MeshEngine::EndWrite(const LinkKey& key, uint32_t transfer) {
  absl::MutexLock l(&mu_);
  auto it = writing_.find({key, transfer});
  if (it != writing_.end() && --it->second == 0) writing_.erase(it);
}

bool MeshEngine::AwaitWrites(const LinkKey& key, uint32_t transfer, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto none = [this, &key, transfer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !writing_.contains({key, transfer});
  };
  return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
}

void MeshEngine::MarkFinished(const LinkKey& key, uint32_t transfer) {
  // Late copies can only be in flight for about the senders' io_timeout:
  // a minute of memory is plenty, and bounded per sender and in all.
  constexpr size_t kPerSender = 65536, kSenders = 1024;
  const absl::Time now = absl::Now(), old = now - absl::Minutes(1);
  absl::MutexLock l(&mu_);
  // Expiry walks everything: at most once a second, not per frame.
  for (auto it = now - last_prune_ < absl::Seconds(1) ? finished_.end() : finished_.begin();
       it != finished_.end();) {
    auto& m = it->second;
    for (auto e = m.begin(); e != m.end();) e = e->second < old ? m.erase(e) : std::next(e);
    it = m.empty() && it->first != key ? finished_.erase(it) : std::next(it);
  }
  if (now - last_prune_ >= absl::Seconds(1)) last_prune_ = now;
  if (!finished_.contains(key) && finished_.size() >= kSenders) finished_.erase(finished_.begin());
  auto& m = finished_[key];
  m[transfer] = now;
  if (m.size() > kPerSender) m.erase(m.begin());
}

// --- importing side ----------------------------------------------------------

std::shared_ptr<MeshEngine::Peer> MeshEngine::PeerFor(const RemoteTarget& target, bool tcp) {
  tcp = tcp && options_.transport != "tcp";  // with TCP links anyway, one peer serves both
  const std::string key = tcp ? target.node_name + "/tcp" : target.node_name;
  std::vector<std::shared_ptr<Peer>> evicted;  // destroyed outside the lock (their workers are joined)
  absl::MutexLock l(&mu_);
  // Stopping: the peers were taken away already (a worker's open that
  // needs another peer, OverTcp, gets none).
  if (stopping_.load(std::memory_order_acquire)) return nullptr;
  if (auto it = peers_.find(key); it != peers_.end()) return it->second;
  if (peers_.size() >= kMaxPeers) {
    // Forget peers that are idle, hold no connection and back no handle
    // (names pods asked for that never answered, for example).
    std::set<const Peer*> in_use;
    for (const auto& [id, h] : handles_) {
      in_use.insert(h.peer.get());
      if (h.two_hop != nullptr) in_use.insert(h.two_hop->peer.get());
    }
    for (const auto& [id, g] : grants_) {
      if (g.forward != nullptr) in_use.insert(g.forward->peer.get());
    }
    for (auto it = peers_.begin(); it != peers_.end();) {
      std::shared_ptr<DataLinks> links = it->second->links();
      if (it->second->idle() && !in_use.count(it->second.get()) && (links == nullptr || links->live() == 0)) {
        evicted.push_back(std::move(it->second));
        it = peers_.erase(it);
      } else {
        ++it;
      }
    }
    if (peers_.size() >= kMaxPeers) return nullptr;
  }
  std::shared_ptr<Peer>& p = peers_[key];
  p = std::make_shared<Peer>(target.node_name, tcp);
  return p;
}

void MeshEngine::CarryGrant(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                            const pb::OpenRegionResponse& resp,
                            std::function<void(const std::shared_ptr<Peer>&)> install,
                            std::function<void(absl::Status)> failed) {
  std::shared_ptr<verbs::VerbsLinks> vl = std::dynamic_pointer_cast<verbs::VerbsLinks>(peer->links());
  if (vl == nullptr) return install(peer);
  if (!resp.staged_reason().empty()) {
    // The owner moves each slice between the export and its bounce pool;
    // this node's queue pairs carry it as for any other grant.
    Log()->info("event=mesh_region_staged node={} export={} grant={} why={}", target.node_name, resp.export_id(),
                resp.grant(), LogQuoted(resp.staged_reason().substr(0, 256)));
    vl->AddStagedRegion(resp.grant(), resp.staged_slice_bytes());
    return install(peer);
  }
  if (resp.over_tcp_reason().empty()) {
    std::vector<verbs::RegionKey> keys;
    for (const pb::VerbsKey& k : resp.verbs_keys()) keys.push_back(verbs::RegionKey{k.device(), k.rkey(), k.base()});
    vl->AddRegion(resp.grant(), std::move(keys));
    return install(peer);
  }
  // The owner cannot register this export for RDMA (a GPU export its NICs
  // cannot reach by dma-buf, memory it may not pin): the grant is carried by
  // this node's TCP links to it instead.
  Log()->info("event=mesh_region_over_tcp node={} export={} grant={} why={}", target.node_name, resp.export_id(),
              resp.grant(), LogQuoted(resp.over_tcp_reason().substr(0, 256)));
  OverTcp(target, [peer, grant = resp.grant(), install = std::move(install),
                   failed = std::move(failed)](absl::StatusOr<std::shared_ptr<Peer>> tcp) {
    if (!tcp.ok()) {
      ReleaseRemoteGrant(peer.get(), grant);
      return failed(tcp.status());
    }
    install(*tcp);
  });
}

void MeshEngine::ConnectOrOverTcp(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                                  std::function<void(const std::shared_ptr<Peer>&)> then,
                                  std::function<void(absl::Status)> failed) {
  // The node answered, but no RDMA path to it came up lately (no RDMA
  // device or GID for this node's address, the owner refusing the queue
  // pairs): over the TCP links to it instead, said and counted, without
  // trying RDMA again for kVerbsRetry.
  constexpr absl::Duration kVerbsRetry = absl::Seconds(30);
  bool verbs_failed = false;
  absl::Status st;
  if (options_.verbs_tcp_fallback && !peer->tcp() && absl::Now() < peer->verbs_retry_after() &&
      (peer->links() == nullptr || peer->links()->live() == 0)) {
    verbs_failed = true;
    st = absl::UnavailableError(absl::StrCat("no RDMA path to node ", target.node_name, " came up lately"));
  } else {
    st = Connect(peer, target, &verbs_failed);
    if (verbs_failed) peer->set_verbs_retry_after(absl::Now() + kVerbsRetry);
  }
  if (st.ok()) return then(peer);
  if (!verbs_failed || !options_.verbs_tcp_fallback) return failed(st);
  verbs_fallbacks_.fetch_add(1, std::memory_order_relaxed);
  if (fallback_log_.Due()) {
    Log()->warn("event=mesh_verbs_fallback node={} why={} (opens over TCP so far: {})", target.node_name,
                LogQuoted(st.message().substr(0, 512)), verbs_fallbacks_.load(std::memory_order_relaxed));
  }
  OverTcp(target, [then = std::move(then), failed = std::move(failed), st](absl::StatusOr<std::shared_ptr<Peer>> tcp) {
    if (!tcp.ok()) {
      return failed(absl::Status(tcp.status().code(),
                                 absl::StrCat(tcp.status().message(), " (over RDMA before: ", st.message(), ")")));
    }
    then(*tcp);
  });
}

void MeshEngine::OverTcp(const RemoteTarget& target,
                         std::function<void(absl::StatusOr<std::shared_ptr<Peer>>)> next) {
  std::shared_ptr<Peer> tcp = PeerFor(target, /*tcp=*/true);
  if (tcp == nullptr) {
    return next(NoPeer());
  }
  auto answer = std::make_shared<AnswerOnce<std::shared_ptr<Peer>>>(
      std::move(next), "the open over TCP was dropped (podlinkd is stopping)");
  // Connected on that peer's own worker, as every dial of it is; the task
  // holds no reference to its own peer (a worker must not outlive it).
  std::weak_ptr<Peer> weak = tcp;
  bool posted = tcp->Post([this, weak, target, answer] {
    std::shared_ptr<Peer> peer = weak.lock();
    if (peer == nullptr) return;  // going away: the answer's last holder says so
    if (stopping_.load(std::memory_order_acquire)) return (*answer)(StoppingStatus());
    if (absl::Status st = Connect(peer, target); !st.ok()) return (*answer)(st);
    (*answer)(std::move(peer));
  });
  if (!posted) {
    (*answer)(NotQueued(target.node_name));
  }
}

absl::Status MeshEngine::Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget& target, bool* verbs_failed) {
  Peer& p = *peer;
  if (auto links = p.links(); links != nullptr && links->live() > 0 && p.stub() != nullptr) return absl::OkStatus();
  std::vector<IpPrefix> remote = ParsePrefixes(target.addresses);
  std::vector<IpPrefix> local = LocalForPaths();
  std::vector<Path> paths = ChoosePaths(local, remote, options_.fallback);
  if (paths.empty()) {
    std::vector<std::string> mine;
    for (const IpPrefix& a : local) mine.push_back(a.ToString());
    return absl::FailedPreconditionError(absl::StrCat(
        "no direct link reaches node ", target.node_name, ": it advertises [", absl::StrJoin(target.addresses, ", "),
        "], this node has [", absl::StrJoin(mine, ", "), "] (set mesh.fallback to let the kernel route)"));
  }
  std::string endpoint = HostPort(paths.front().remote, target.port);
  std::shared_ptr<pb::Mesh::Stub> stub = NewStub(target.node_name, endpoint);
  auto deadline = [this] { return absl::ToChronoTime(absl::Now() + options_.connect_timeout); };
  pb::HelloResponse hello;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    pb::HelloRequest req;
    req.set_version(PODLINK_VERSION);
    req.set_instance(instance_);
    AddAdverts(req.mutable_adverts());
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub->Hello(&ctx, req, &hello), target.node_name));
  }
  if (hello.node_name() != target.node_name) {
    return absl::PermissionDeniedError(absl::StrCat("the daemon at ", endpoint, " is node '", hello.node_name(),
                                                    "', not '", target.node_name, "'"));
  }
  // Said by the node itself (its certificate names it): routes may go
  // through it to the nodes it is cabled to.
  Learn(target.node_name, {hello.addresses().begin(), hello.addresses().end()}, hello.control_port());
  AcceptAdverts(target.node_name, hello.adverts());
  p.set_paths(paths, PeerLinkInfo(hello));
  if (options_.transport == "verbs" && !p.tcp()) {
    auto open = [&](const pb::OpenVerbsRequest& req) -> absl::StatusOr<pb::OpenVerbsResponse> {
      grpc::ClientContext ctx;
      // The owner may open its device and make QPs first: more than a
      // handshake (seconds on emulated soft-RoCE).
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout + absl::Seconds(25)));
      pb::OpenVerbsResponse resp;
      PODLINK_RETURN_IF_ERROR(FromGrpc(stub->OpenVerbs(&ctx, req, &resp), target.node_name));
      return resp;
    };
    absl::StatusOr<std::shared_ptr<verbs::VerbsLinks>> made = ConnectVerbs(target.node_name, paths, open);
    if (!made.ok()) {
      if (verbs_failed != nullptr) *verbs_failed = true;
      return made.status();
    }
    std::shared_ptr<verbs::VerbsLinks> vl = *std::move(made);
    // A path whose QPs all failed gets new ones in the background (the
    // owner drops the failed ones), while the other paths carry on.
    vl->set_on_path_down(RepairOnDown(peer, vl, paths, 0));
    Log()->info("event=mesh_peer_connected node={} control={} transport=verbs paths={} qps={}", target.node_name,
                endpoint, paths.size(), vl->live());
    p.set_stub(std::move(stub));
    p.instance.store(hello.instance(), std::memory_order_release);
    p.set_links(std::move(vl));
    return absl::OkStatus();
  }
  uint32_t per_path = options_.connections_per_path;
  pb::OpenLinkResponse link;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    pb::OpenLinkRequest req;
    req.set_connections(static_cast<uint32_t>(std::min<size_t>(64, paths.size() * per_path)));
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub->OpenLink(&ctx, req, &link), target.node_name));
  }
  auto links = std::make_shared<PeerLinks>(target.node_name, options_.slice_bytes, options_.slices_in_flight,
                                           options_.answer_timeout, options_.tcp_zero_copy);
  int cookie = 0;
  absl::Status last;
  for (const Path& path : paths) {
    for (uint32_t i = 0; i < per_path && cookie < link.cookies_size(); ++i) {
      absl::StatusOr<UniqueFd> fd = DialData(path, link.data_port(), link.cookies(cookie++), links->instance(),
                                             options_.connect_timeout);
      if (fd.ok()) {
        links->AddConnection(*std::move(fd), PathName(path));
      } else {
        last = fd.status();
      }
    }
  }
  if (links->live() == 0) {
    return absl::UnavailableError(absl::StrCat("no data connection to node ", target.node_name, ": ", last.message()));
  }
  Log()->info("event=mesh_peer_connected node={} control={} paths={} connections={}", target.node_name, endpoint,
              paths.size(), links->live());
  // A connection that fails later is dialed again over its path.
  links->set_on_down(RepairOnDown(peer, links, paths, link.data_port()));
  p.set_stub(std::move(stub));
  p.instance.store(hello.instance(), std::memory_order_release);
  p.set_links(std::move(links));
  return absl::OkStatus();
}

void MeshEngine::OpenRemote(uint64_t session, const PodInfo& pod, RemoteTarget target, OpenDone done) {
  if (target.node_name.empty() || target.node_name == node_name_) {
    return done(absl::InvalidArgumentError("a remote region names another node"));
  }
  if (target.port == 0 || target.port > 65535) return done(absl::InvalidArgumentError("bad mesh port"));
  if (!ValidNodeName(target.node_name)) {
    return done(absl::InvalidArgumentError("a node name is 1 to 253 of a-z, 0-9, '-' and '.'"));
  }
  pb::OpenRegionRequest req;
  pb::ForwardedIdentity* who = req.mutable_importer();
  who->set_node(node_name_);
  who->set_key(pod.key);
  who->set_pod_uid(pod.uid);
  who->set_namespace_(pod.namespace_);
  who->set_pod_name(pod.name);
  who->mutable_annotations()->insert(pod.annotations.begin(), pod.annotations.end());
  who->set_source(pod.source);
  if (!target.name.empty()) {
    req.set_name(target.name);
  } else {
    req.set_export_id(target.export_id);
  }
  const pb::OpenRegionRequest unrouted = req;
  // The node to call: the owner when a cable reaches it, else the first
  // relay of the shortest route through nodes this one knows, else (only if
  // configured) the owner through the kernel's routing.
  RemoteTarget hop = target;
  std::vector<std::string> relays;  // the route's, first hop first; empty: direct
  std::vector<IpPrefix> local = LocalForPaths();
  std::vector<IpPrefix> remote = ParsePrefixes(target.addresses);
  const bool cabled = !ChoosePaths(local, remote, false).empty();
  if (!cabled) {
    std::map<std::string, std::vector<IpPrefix>> graph;
    std::map<std::string, Known> known;
    {
      absl::MutexLock l(&mu_);
      known = known_;
    }
    for (const auto& [name, k] : known) graph[name] = ParsePrefixes(k.addresses);
    graph[target.node_name] = remote;  // the descriptor's word, for this open only
    std::optional<std::vector<std::string>> via = RelayPath(node_name_, local, graph, target.node_name);
    if (via.has_value() && !via->empty()) {
      uint64_t nonce = 0;
      if (absl::Status st = SignRoute(target, *via, &req, &nonce); !st.ok()) return done(st);
      relays = *via;
      hop.node_name = via->front();
      hop.addresses = known[hop.node_name].addresses;
      hop.port = known[hop.node_name].port;
      Log()->info("event=mesh_route destination={} via={}", target.node_name, absl::StrJoin(*via, ","));
      absl::MutexLock l(&mu_);
      ++routed_opens_;
    } else if (!options_.fallback) {
      std::vector<std::string> mine;
      for (const IpPrefix& a : local) mine.push_back(a.ToString());
      return done(absl::FailedPreconditionError(absl::StrCat(
          "no direct link reaches node ", target.node_name, ": it advertises [", absl::StrJoin(target.addresses, ", "),
          "], this node has [", absl::StrJoin(mine, ", "),
          "], and no node this one knows (mesh.peers, or a daemon it talked to) relays to it (set mesh.fallback to "
          "let the kernel route)")));
    }
  }
  const bool two_hop = cabled && options_.two_hop_stripe && options_.transport == "tcp";
  OpenThrough(hop, req, target.node_name, relays.size(),
              [this, session, done = std::move(done), destination = target.node_name, via = relays, two_hop, target,
               unrouted](absl::StatusOr<Carried> opened) {
                if (!opened.ok()) return done(opened.status());
                const pb::OpenRegionResponse& resp = opened->resp;
                RemoteRegionInfo info;
                bool over = false;
                {
                  absl::MutexLock l(&mu_);
                  uint32_t& mine = handles_per_session_[session];
                  if (stopping_.load(std::memory_order_acquire) || mine >= options_.max_handles_per_session) {
                    over = true;
                  } else {
                    ++mine;
                    info.handle = kRemoteHandleBit | next_handle_++;
                    handles_[info.handle] =
                        Handle{session, opened->carrier, resp.grant(), resp.size(), resp.instance(),
                               destination, via, nullptr};
                  }
                }
                if (over) {
                  ReleaseRemoteGrant(opened->carrier.get(), resp.grant());  // its verbs keys too
                  if (stopping_.load(std::memory_order_acquire)) return done(StoppingStatus());
                  return done(absl::ResourceExhaustedError(absl::StrCat(
                      "this session holds ", options_.max_handles_per_session, " remote regions (the limit)")));
                }
                info.export_id = resp.export_id();
                info.size = resp.size();
                info.handle_type = resp.handle_type();
                info.owner_namespace = resp.owner_namespace();
                info.owner_name = resp.owner_name();
                const uint64_t handle = info.handle, export_id = info.export_id, size = info.size;
                done(info);
                if (two_hop) AddTwoHop(session, handle, target, unrouted, export_id, size);
              });
}

absl::Status MeshEngine::SignRoute(const RemoteTarget& target, const std::vector<std::string>& via,
                                   pb::OpenRegionRequest* req, uint64_t* nonce, bool fenceable) const {
  pb::OriginClaim claim;
  claim.set_origin(node_name_);
  *claim.mutable_importer() = req->importer();
  claim.mutable_destination()->set_node(target.node_name);
  for (const std::string& a : target.addresses) claim.mutable_destination()->add_addresses(a);
  claim.mutable_destination()->set_port(target.port);
  for (const std::string& v : via) claim.add_via(v);
  if (!target.name.empty()) {
    claim.set_name(target.name);
  } else {
    claim.set_export_id(target.export_id);
  }
  claim.set_issued_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  do {
    *nonce = RandomU64();
  } while (*nonce == 0);
  claim.set_nonce(*nonce);
  claim.set_fenceable(fenceable);
  pb::Route* route = req->mutable_route();
  claim.SerializeToString(route->mutable_claim());
  const Pems pems = CurrentPems();
  PODLINK_ASSIGN_OR_RETURN(std::string sig, SignWithKey(pems.key, route->claim()));
  route->set_signature(std::move(sig));
  route->set_origin_cert(pems.cert);
  return absl::OkStatus();
}

void MeshEngine::OpenThrough(const RemoteTarget& hop, pb::OpenRegionRequest req, const std::string& destination,
                             size_t relays, std::function<void(absl::StatusOr<Carried>)> got) {
  // Over this node's transport to a relay too: over verbs the relay stages
  // the region (its bounce pool holds each slice until the next node took
  // it); one that cannot is reached over TCP instead (below).
  std::shared_ptr<Peer> peer = PeerFor(hop, /*tcp=*/false);
  if (peer == nullptr) return got(NoPeer());
  // The task holds no reference to the peer (it runs on the peer's own
  // worker, which the peer outlives). Whatever holds the open's answer — the
  // task, the open over TCP it may go on to — answers it once; one dropped
  // on the way (engine stopping) answers as it goes.
  auto answer = std::make_shared<AnswerOnce<Carried>>(
      std::move(got), absl::StrCat("the open of a region of node ", destination, " was dropped (podlinkd is stopping)"));
  Peer* p = peer.get();
  bool posted = p->Post([this, p, hop, req = std::move(req), answer, destination, relays] {
    std::shared_ptr<Peer> peer = p->shared_from_this();
    auto done = [answer](absl::StatusOr<Carried> r) { (*answer)(std::move(r)); };
    if (stopping_.load(std::memory_order_acquire)) return done(StoppingStatus());
    // The open itself, on a connected peer, on that peer's worker (`self`:
    // this lambda, to open again over TCP).
    auto open_on = [this, hop, req, done, destination, relays](const auto& self,
                                                               const std::shared_ptr<Peer>& peer) -> void {
      std::shared_ptr<pb::Mesh::Stub> stub = peer->stub();
      std::shared_ptr<verbs::VerbsLinks> vl = std::dynamic_pointer_cast<verbs::VerbsLinks>(peer->links());
      pb::OpenRegionRequest open = req;
      open.set_verbs(vl != nullptr);
      open.set_accepts_over_tcp(true);
      open.set_accepts_staged(vl != nullptr);
      open.set_caller_instance(instance_);
      pb::OpenRegionResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.open_per_hop * static_cast<int64_t>(1 + relays)));
      if (absl::Status st = FromGrpc(stub->OpenRegion(&ctx, open, &resp), hop.node_name); !st.ok()) {
        // A relay that cannot stage over verbs (no bounce pool for this
        // node, or an older version): the hop to it goes over TCP.
        if (vl != nullptr && hop.node_name != destination && RelayCannotStage(st)) {
          Log()->info("event=mesh_relay_over_tcp relay={} destination={} why={}", hop.node_name, destination,
                      LogQuoted(std::string(st.message()).substr(0, 256)));
          return OverTcp(hop, [self, done](absl::StatusOr<std::shared_ptr<Peer>> tcp) {
            if (!tcp.ok()) return done(tcp.status());
            self(self, *tcp);
          });
        }
        return done(st);
      }
      CarryGrant(
          peer, hop, resp, [done, resp](const std::shared_ptr<Peer>& carrier) { done(Carried{carrier, resp}); },
          [done](absl::Status st) { done(std::move(st)); });
    };
    ConnectOrOverTcp(peer, hop, [open_on](const std::shared_ptr<Peer>& p) { open_on(open_on, p); },
                     [done](absl::Status st) { done(std::move(st)); });
  });
  if (!posted) {
    (*answer)(NotQueued(hop.node_name));
  }
}

void MeshEngine::AddTwoHop(uint64_t session, uint64_t handle, RemoteTarget target, pb::OpenRegionRequest req,
                           uint64_t export_id, uint64_t size) {
  // The export the direct open found, by id: a name could by now stand for
  // another export of the owner's.
  target.name.clear();
  target.export_id = export_id;
  req.clear_name();
  req.set_export_id(export_id);
  // A relay: a node this one knows that shares a subnet with this node and
  // with the target (the first such by name).
  std::vector<IpPrefix> local = LocalForPaths(), remote = ParsePrefixes(target.addresses);
  std::map<std::string, Known> known;
  {
    absl::MutexLock l(&mu_);
    known = known_;
  }
  RemoteTarget hop;
  for (const auto& [name, k] : known) {
    if (name == target.node_name || name == node_name_) continue;
    std::vector<IpPrefix> theirs = ParsePrefixes(k.addresses);
    if (!ChoosePaths(local, theirs, false).empty() && !ChoosePaths(theirs, remote, false).empty()) {
      hop.node_name = name;
      hop.addresses = k.addresses;
      hop.port = k.port;
      break;
    }
  }
  if (hop.node_name.empty()) return;  // no such relay known (yet): direct links only
  uint64_t nonce = 0;
  if (absl::Status st = SignRoute(target, {hop.node_name}, &req, &nonce, /*fenceable=*/true); !st.ok()) {
    Log()->warn("event=mesh_two_hop_failed destination={} relay={} why={}", target.node_name, hop.node_name,
                LogQuoted(st.message()));
    return;
  }
  OpenThrough(hop, req, target.node_name, 1,
              [this, session, handle, nonce, export_id, size, relay = hop.node_name,
               destination = target.node_name](absl::StatusOr<Carried> opened) {
                if (!opened.ok()) {
                  Log()->warn("event=mesh_two_hop_failed destination={} relay={} why={}", destination, relay,
                              LogQuoted(opened.status().message().substr(0, 512)));
                  return;
                }
                if (opened->resp.export_id() != export_id || opened->resp.size() != size) {
                  Log()->warn("event=mesh_two_hop_failed destination={} relay={} why=\"the route reached export {} of "
                              "{} bytes, not {} of {}\"",
                              destination, relay, opened->resp.export_id(), opened->resp.size(), export_id, size);
                  return ReleaseRemoteGrant(opened->carrier.get(), opened->resp.grant());
                }
                auto route = std::make_shared<TwoHop>();
                route->peer = opened->carrier;
                route->grant = opened->resp.grant();
                route->instance = opened->resp.instance();
                route->nonce = nonce;
                bool attached = false;
                {
                  absl::MutexLock l(&mu_);
                  auto it = handles_.find(handle);
                  if (!stopping_.load(std::memory_order_acquire) && it != handles_.end() &&
                      it->second.session == session && it->second.two_hop == nullptr) {
                    it->second.two_hop = route;
                    attached = true;
                  }
                }
                if (!attached) return ReleaseRemoteGrant(route->peer.get(), route->grant);  // the handle went first
                two_hop_routes_.fetch_add(1, std::memory_order_relaxed);
                Log()->info("event=mesh_two_hop destination={} relay={} handle={}", destination, relay, handle);
              });
}

absl::Status MeshEngine::DropHandle(uint64_t session, uint64_t handle) {
  Handle h;
  {
    absl::MutexLock l(&mu_);
    auto it = handles_.find(handle);
    if (it == handles_.end() || it->second.session != session) {
      if (stopping_.load(std::memory_order_acquire)) return StoppingStatus();
      return absl::NotFoundError(absl::StrCat("no remote region ", handle, " in this session"));
    }
    h = std::move(it->second);
    handles_.erase(it);
    if (--handles_per_session_[session] == 0) handles_per_session_.erase(session);
  }
  ReleaseRemoteGrant(h.peer.get(), h.grant);
  if (h.two_hop != nullptr) ReleaseRemoteGrant(h.two_hop->peer.get(), h.two_hop->grant);
  return absl::OkStatus();
}

void MeshEngine::DropSession(uint64_t session) {
  std::vector<uint64_t> mine;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, h] : handles_) {
      if (h.session == session) mine.push_back(id);
    }
  }
  for (uint64_t id : mine) (void)DropHandle(session, id);
}

std::function<void(const std::string&)> MeshEngine::RepairOnDown(const std::shared_ptr<Peer>& peer,
                                                                 const std::shared_ptr<DataLinks>& links,
                                                                 const std::vector<Path>& paths, uint32_t data_port) {
  std::map<std::string, Path> by_name;
  for (const Path& path : paths) by_name[PathName(path)] = path;
  std::weak_ptr<Peer> weak_peer = peer;
  std::weak_ptr<DataLinks> weak_links = links;
  return [this, weak_peer, weak_links, by_name = std::move(by_name), data_port](const std::string& name) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return;
    Repair r;
    r.peer = weak_peer;
    r.links = weak_links;
    r.path = it->second;
    r.name = name;
    r.data_port = data_port;
    r.backoff = absl::Milliseconds(500);
    r.next = absl::Now() + r.backoff;
    ScheduleRepair(std::move(r));
  };
}

void MeshEngine::ScheduleRepair(Repair r) {
  absl::MutexLock l(&mu_);
  if (stopping_.load(std::memory_order_acquire) || repairs_.size() >= 256) return;
  // A verbs path's repair replaces every QP of it that failed by then: one
  // scheduled is enough (a TCP repair is one connection each).
  if (std::dynamic_pointer_cast<verbs::VerbsLinks>(r.links.lock()) != nullptr) {
    for (const Repair& other : repairs_) {
      if (other.name == r.name && !other.links.owner_before(r.links) && !r.links.owner_before(other.links)) return;
    }
  }
  repairs_.push_back(std::move(r));
}

void MeshEngine::RepairLoop() {
  for (;;) {
    std::vector<Repair> due;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_.load(std::memory_order_acquire)) return true;
        absl::Time now = absl::Now();
        for (const Repair& r : repairs_) {
          if (r.next <= now) return true;
        }
        return false;
      };
      // Wakes for new work, for the next due repair, and to look at stopping_.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200));
      if (stopping_.load(std::memory_order_acquire)) return;
      absl::Time now = absl::Now();
      for (auto it = repairs_.begin(); it != repairs_.end();) {
        if (it->next <= now) {
          due.push_back(std::move(*it));
          it = repairs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Repair& r : due) {
      std::shared_ptr<DataLinks> links = r.links.lock();
      // Gone, or the whole peer is down (the next open dials it again).
      if (links == nullptr || links->live() == 0) continue;
      absl::Status st = RepairOnce(r);
      if (st.ok()) {
        Log()->info("event=mesh_connection_repaired path={} connections={}", r.name, links->live());
        absl::MutexLock l(&mu_);
        ++repaired_connections_;
        continue;
      }
      r.backoff = std::min(r.backoff * 2, absl::Seconds(5));
      r.next = absl::Now() + r.backoff;
      ScheduleRepair(std::move(r));
    }
  }
}

// Every 200 ms, on a thread of its own: a repair can wait seconds on a dial
// or an OpenVerbs call, and none of this may wait behind it (the sweep ends
// RDMA access to a withdrawn export; keepalives and adverts keep this node's
// grants and routes alive elsewhere).
void MeshEngine::HousekeepingLoop() {
  for (;;) {
    {
      absl::MutexLock l(&mu_);
      auto stop = [this] { return stopping_.load(std::memory_order_acquire); };
      mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(200));
      if (stop()) return;
    }
    SweepVerbs();
    SweepLinks();
    RefreshLocalLinks();
    ReloadPems();
    SweepIdleImporters();
    KeepAlive();
    RefreshOwnAdvert();
    TradeAdverts();
  }
}

absl::Status MeshEngine::RepairOnce(Repair& r) {
  std::shared_ptr<Peer> peer = r.peer.lock();
  std::shared_ptr<DataLinks> any = r.links.lock();
  if (peer == nullptr || any == nullptr) return absl::OkStatus();  // nothing left to repair
  std::shared_ptr<pb::Mesh::Stub> stub = peer->stub();
  if (stub == nullptr) return absl::OkStatus();
  if (auto vl = std::dynamic_pointer_cast<verbs::VerbsLinks>(any)) {
    auto open = [&](const pb::OpenVerbsRequest& req) -> absl::StatusOr<pb::OpenVerbsResponse> {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout + absl::Seconds(25)));
      pb::OpenVerbsResponse resp;
      PODLINK_RETURN_IF_ERROR(FromGrpc(stub->OpenVerbs(&ctx, req, &resp), peer->node()));
      return resp;
    };
    // A path that cannot come back (cable still down) fails here and is
    // tried again with backoff; its old QPs are named once.
    std::vector<uint32_t> failed = vl->FailedRemoteQps(r.name);
    if (failed.empty()) return absl::OkStatus();  // an earlier repair replaced them
    PODLINK_RETURN_IF_ERROR(ConnectVerbsPath(*vl, r.path, open, failed));
    vl->MarkReported(failed);
    return absl::OkStatus();
  }
  auto links = std::dynamic_pointer_cast<PeerLinks>(any);
  if (links == nullptr) return absl::OkStatus();
  pb::OpenLinkResponse link;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  pb::OpenLinkRequest req;
  req.set_connections(1);
  PODLINK_RETURN_IF_ERROR(FromGrpc(stub->OpenLink(&ctx, req, &link), peer->node()));
  if (link.cookies_size() != 1) return absl::UnavailableError("OpenLink returned no cookie");
  PODLINK_ASSIGN_OR_RETURN(UniqueFd fd,
                           DialData(r.path, r.data_port, link.cookies(0), links->instance(), absl::Seconds(2)));
  links->AddConnection(std::move(fd), r.name);
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> MeshEngine::DialData(const Path& path, uint32_t port, const std::string& cookie,
                                               uint64_t link_instance, absl::Duration timeout) const {
  if (cookie.size() != kCookieBytes) return absl::UnavailableError("the peer issued a malformed link cookie");
  PODLINK_ASSIGN_OR_RETURN(UniqueFd fd, Dial(path, static_cast<uint16_t>(port), timeout));
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = static_cast<uint16_t>(FrameType::kAuth);
  h.length = kCookieBytes;
  h.grant = link_instance;
  PODLINK_RETURN_IF_ERROR(WriteFrame(fd.get(), h, cookie.data(), cookie.size()));
  TuneDataSocket(fd.get(), options_.io_timeout);
  return fd;
}

absl::Status MeshEngine::CheckInstance(const Handle& h) const {
  if (h.peer->instance.load(std::memory_order_acquire) != h.instance) {
    return absl::UnavailableError(absl::StrCat("node ", h.peer->node(),
                                               "'s podlinkd restarted since the region was opened: open it again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MeshEngine::Handle> MeshEngine::FindHandle(uint64_t session, uint64_t handle) const {
  absl::MutexLock l(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.session != session) {
    if (stopping_.load(std::memory_order_acquire)) return StoppingStatus();
    return absl::NotFoundError(absl::StrCat("remote region ", handle, " was not opened by this session"));
  }
  return it->second;
}

// ---------------------------------------------------------------------------
// Two-hop striping: a transfer cut into chunks that the direct links and the
// relay's route each pull while they have fewer than kTwoHopWindow in flight.
// A chunk the relay's route fails is sent again on the direct links — for a
// write, only once the owner fenced the route (nothing the relay still holds
// can land after that); the transfer ends when every chunk landed, or with
// the direct links' error, and only once nothing of it is in flight.

class MeshEngine::TwoRoutes : public std::enable_shared_from_this<MeshEngine::TwoRoutes> {
 public:
  TwoRoutes(MeshEngine* e, LinkOp whole, std::shared_ptr<Peer> direct, std::shared_ptr<TwoHop> route,
            std::shared_ptr<const PathPreference> alt_prefer)
      : e_(e),
        whole_(std::move(whole)),
        direct_(direct),
        route_(route),
        alt_grant_(route->grant),
        alt_prefer_(std::move(alt_prefer)),
        chunks_((whole_.length + kTwoHopChunk - 1) / kTwoHopChunk) {}

  // The first submissions, from Start: the transfer cannot end (and call
  // `done`) before Start returned.
  void Begin() {
    Pump();
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      begun_ = true;
      finish = Over();
    }
    if (finish && !e_->QueueTask([self = shared_from_this()] { self->Finish(); })) Finish();
  }

  // Submits what each route may take now, a chunk to each in turn. Never on
  // a link's own thread (the link set it holds for a moment could be its
  // last reference): from Start, the two-hop thread or the direct peer's
  // worker.
  void Pump() {
    for (bool more = true; more;) {
      more = false;
      for (int route : {kDirect, kAlt}) {
        uint64_t chunk = 0;
        {
          absl::MutexLock l(&mu_);
          if (!failed_.ok() || in_flight_[route] >= kTwoHopWindow || (route == kAlt && alt_down_)) continue;
          if (route == kDirect && !redo_.empty() && (!writes() || fence_ == Fence::kDone)) {
            chunk = redo_.front();
            redo_.pop_front();
          } else if (next_ < chunks_) {
            chunk = next_++;
          } else {
            continue;
          }
          ++in_flight_[route];
        }
        more = true;
        absl::Status st = Submit(route, chunk);
        if (!st.ok()) Ended(route, chunk, st, /*on_link_thread=*/false);
      }
    }
  }

 private:
  enum { kDirect = 0, kAlt = 1 };
  enum class Fence { kNone, kPending, kDone };
  bool writes() const { return whole_.type == FrameType::kWrite; }

  absl::Status Submit(int route, uint64_t chunk) {
    std::shared_ptr<Peer> peer;
    if (route == kDirect) {
      peer = direct_.lock();
    } else if (std::shared_ptr<TwoHop> r = route_.lock(); r != nullptr && !r->failed.load(std::memory_order_acquire) &&
                                                          r->peer->instance.load(std::memory_order_acquire) ==
                                                              r->instance) {
      peer = r->peer;
    }
    std::shared_ptr<DataLinks> links = peer != nullptr ? peer->links() : nullptr;
    if (links == nullptr || links->live() == 0) {
      return absl::UnavailableError(absl::StrCat("no link of the ", route == kDirect ? "direct" : "two-hop",
                                                 " route is up"));
    }
    const uint64_t at = chunk * kTwoHopChunk;
    LinkOp op;
    op.type = whole_.type;
    op.grant = route == kDirect ? whole_.grant : alt_grant_;
    op.offset = whole_.offset + at;
    op.length = std::min<uint64_t>(kTwoHopChunk, whole_.length - at);
    op.local = whole_.local + at;
    op.keep = whole_.keep;
    op.local_is_export = whole_.local_is_export;
    op.prefer = route == kDirect ? whole_.prefer : alt_prefer_;
    op.done = [self = shared_from_this(), route, chunk](const absl::Status& st) {
      self->Ended(route, chunk, st, /*on_link_thread=*/true);
    };
    return links->Submit(std::move(op));
  }

  void Ended(int route, uint64_t chunk, const absl::Status& st, bool on_link_thread) {
    bool fence = false, finish = false, failover = false;
    {
      absl::MutexLock l(&mu_);
      --in_flight_[route];
      if (st.ok()) {
        ++landed_;
        if (route == kAlt) {
          e_->two_hop_bytes_.fetch_add(std::min<uint64_t>(kTwoHopChunk, whole_.length - chunk * kTwoHopChunk),
                                       std::memory_order_relaxed);
        }
      } else if (route == kDirect) {
        if (failed_.ok()) failed_ = st;
      } else {
        failover = !alt_down_;
        alt_down_ = true;
        redo_.push_back(chunk);
        e_->two_hop_failovers_.fetch_add(1, std::memory_order_relaxed);
        if (writes() && fence_ == Fence::kNone) {
          fence_ = Fence::kPending;
          fence = true;
        }
      }
      finish = Over();
    }
    // What locks the route or the direct peer runs off the link's thread (a
    // reference taken there could be the last one); from Pump, here, and
    // Pump goes on by itself.
    auto next = [self = shared_from_this(), failover, fence, finish, pump = on_link_thread,
                 why = std::string(st.message().substr(0, 256))] {
      if (failover) self->RouteDown(why);
      if (fence) self->StartFence();
      if (finish) return self->Finish();
      if (pump) self->Pump();
    };
    if (on_link_thread && e_->QueueTask(next)) return;
    next();  // from Pump, or once the engine is being destroyed
  }

  // The relay's route failed: not used again for this region.
  void RouteDown(const std::string& why) {
    std::shared_ptr<TwoHop> r = route_.lock();
    if (r != nullptr && !r->failed.exchange(true, std::memory_order_acq_rel)) {
      Log()->warn("event=mesh_two_hop_down relay={} why={} (its chunks go on the direct links)", r->peer->node(),
                  LogQuoted(why));
    }
  }

  // Asks the owner, over the direct link's control channel, to close the
  // relay's grant and let its landing writes finish.
  void StartFence() {
    std::shared_ptr<Peer> peer = direct_.lock();
    auto self = shared_from_this();
    auto answer = std::make_shared<AnswerOnce<uint32_t>>(
        [self](absl::StatusOr<uint32_t> r) { self->Fenced(r.status()); }, "the fence was dropped (podlinkd is stopping)");
    const uint64_t nonce = [&] {
      std::shared_ptr<TwoHop> r = route_.lock();
      return r != nullptr ? r->nonce : 0;
    }();
    if (peer == nullptr || nonce == 0) return (*answer)(absl::UnavailableError("the region was dropped"));
    Peer* p = peer.get();
    MeshEngine* e = e_;
    if (!p->Post([p, e, nonce, answer] {
          std::shared_ptr<pb::Mesh::Stub> stub = p->stub();
          if (stub == nullptr) return (*answer)(absl::UnavailableError("no control channel to the owner"));
          grpc::ClientContext ctx;
          ctx.set_deadline(absl::ToChronoTime(absl::Now() + 2 * e->options_.io_timeout + absl::Seconds(5)));
          pb::FenceRouteRequest req;
          req.set_nonce(nonce);
          pb::FenceRouteResponse resp;
          absl::Status st = FromGrpc(stub->FenceRoute(&ctx, req, &resp), p->node());
          if (!st.ok()) return (*answer)(st);
          e->two_hop_fences_.fetch_add(1, std::memory_order_relaxed);
          (*answer)(resp.grants_closed());
        })) {
      (*answer)(e_->NotQueued(p->node()));
    }
  }

  void Fenced(const absl::Status& st) {
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      fence_ = Fence::kDone;
      if (!st.ok() && failed_.ok()) {
        failed_ = absl::UnavailableError(absl::StrCat(
            "a relay's route of this striped transfer failed, and the owner could not fence it: ", st.message()));
      }
      finish = Over();
    }
    if (finish) return Finish();
    // On the direct peer's worker: never a link's thread.
    Pump();
  }

  // Nothing in flight, no fence pending, and every chunk landed or the
  // transfer failed.
  bool Over() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!begun_ || in_flight_[kDirect] > 0 || in_flight_[kAlt] > 0 || fence_ == Fence::kPending || finished_) {
      return false;
    }
    if (failed_.ok() && landed_ < chunks_) return false;
    finished_ = true;
    return true;
  }

  void Finish() {
    absl::Status result;
    {
      absl::MutexLock l(&mu_);
      result = failed_;
    }
    auto done = std::move(whole_.done);
    whole_.done = nullptr;
    done(result);
  }

  MeshEngine* const e_;
  LinkOp whole_;
  // Weak: a link's thread may drop the last reference to this transfer.
  const std::weak_ptr<Peer> direct_;
  const std::weak_ptr<TwoHop> route_;
  const uint64_t alt_grant_;
  const std::shared_ptr<const PathPreference> alt_prefer_;
  const uint64_t chunks_;
  absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;    // the next chunk no route took yet
  uint64_t landed_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> redo_ ABSL_GUARDED_BY(mu_);  // chunks the relay's route failed
  uint32_t in_flight_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  bool alt_down_ ABSL_GUARDED_BY(mu_) = false;
  Fence fence_ ABSL_GUARDED_BY(mu_) = Fence::kNone;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool begun_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status MeshEngine::Start(MeshTransfer t, Done done) {
  PODLINK_ASSIGN_OR_RETURN(Handle h, FindHandle(t.session, t.handle));
  PODLINK_RETURN_IF_ERROR(CheckInstance(h));
  if (t.length == 0) return absl::InvalidArgumentError("length must be > 0");
  if (t.remote_offset > h.size || t.length > h.size - t.remote_offset) {
    return absl::OutOfRangeError(absl::StrCat("remote range [", t.remote_offset, ", +", t.length,
                                              ") exceeds the remote region of ", h.size, " bytes"));
  }
  std::shared_ptr<DataLinks> links = h.peer->links();
  if (links == nullptr || links->live() == 0) {
    return absl::UnavailableError(absl::StrCat("no link to node ", h.peer->node(),
                                               " is up (open the region again to reconnect)"));
  }
  LinkOp op;
  op.type = t.write ? FrameType::kWrite : FrameType::kRead;
  op.grant = h.grant;
  op.offset = t.remote_offset;
  op.length = t.length;
  op.local = t.local;
  op.keep = t.keep;
  op.done = std::move(done);
  // A host export's own mapping (not a GPU export's staging): RDMA can go
  // straight from and into it; TCP may send from it without a copy when it is
  // this session's own export (pages that may still be read after the
  // transfer ended hold only the transferring pod's bytes) and the range lies
  // inside it.
  if (t.keep != nullptr && t.staging == nullptr && t.keep->memory != nullptr) {
    if (absl::StatusOr<RelayView> view = t.keep->memory->MapForRelay(); view.ok() && !view->on_gpu) {
      const auto* base = reinterpret_cast<const char*>(view->address);
      op.local_is_export = t.keep->owner_session == t.session && t.local >= base &&
                           static_cast<uint64_t>(t.local - base) <= t.keep->size &&
                           t.length <= t.keep->size - static_cast<uint64_t>(t.local - base);
      if (std::string_view(links->transport()) == "verbs") {
        op.local_memory = t.keep->memory;
        op.local_base = reinterpret_cast<char*>(view->address);
        op.local_size = t.keep->size;
      }
    }
  }
  const std::string place = t.keep != nullptr ? host_->GpuBusId(*t.keep) : std::string();
  op.prefer = h.peer->Preference(place, [&](const std::vector<Path>& paths) { return RankFor(paths, place); });
  if (std::shared_ptr<TwoHop> route = h.two_hop;
      route != nullptr && t.length >= kTwoHopMinBytes && !route->failed.load(std::memory_order_acquire)) {
    std::shared_ptr<DataLinks> alt = route->peer->links();
    if (alt != nullptr && alt->live() > 0 && route->peer->instance.load(std::memory_order_acquire) == route->instance) {
      auto alt_prefer =
          route->peer->Preference(place, [&](const std::vector<Path>& paths) { return RankFor(paths, place); });
      auto striped = std::make_shared<TwoRoutes>(this, std::move(op), h.peer, route, std::move(alt_prefer));
      two_hop_transfers_.fetch_add(1, std::memory_order_relaxed);
      striped->Begin();
      return absl::OkStatus();
    }
  }
  return links->Submit(std::move(op));
}

bool MeshEngine::QueueTask(std::function<void()> task) {
  absl::MutexLock l(&pump_mu_);
  if (!pump_running_ || pump_stop_) return false;
  pump_queue_.push_back(std::move(task));
  return true;
}

void MeshEngine::PumpLoop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock l(&pump_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pump_mu_) { return pump_stop_ || !pump_queue_.empty(); };
      pump_mu_.Await(absl::Condition(&ready));
      if (pump_queue_.empty()) {
        pump_running_ = false;
        return;
      }
      task = std::move(pump_queue_.front());
      pump_queue_.pop_front();
    }
    task();
  }
}

absl::Status MeshEngine::Notify(uint64_t session, uint64_t handle, uint64_t value, Done done) {
  PODLINK_ASSIGN_OR_RETURN(Handle h, FindHandle(session, handle));
  PODLINK_RETURN_IF_ERROR(CheckInstance(h));
  std::shared_ptr<DataLinks> links = h.peer->links();
  if (links == nullptr) return absl::UnavailableError(absl::StrCat("no link to node ", h.peer->node(), " is up"));
  LinkOp op;
  op.type = FrameType::kNotify;
  op.grant = h.grant;
  op.offset = value;
  op.done = std::move(done);
  return links->Submit(std::move(op));
}

// --- the verbs backend -------------------------------------------------------

absl::StatusOr<verbs::VerbsServer*> MeshEngine::VerbsServing() {
  absl::MutexLock l(&verbs_mu_);
  if (stopping_.load(std::memory_order_acquire)) return StoppingStatus();
  if (verbs_server_ != nullptr) return verbs_server_.get();
  if (!verbs_error_.ok()) return verbs_error_;
  absl::StatusOr<const verbs::VerbsApi*> api = verbs::LoadVerbs();
  if (!api.ok()) {
    verbs_error_ = api.status();
    return verbs_error_;
  }
  if (nics_ == nullptr) nics_ = std::make_unique<verbs::Nics>(*api);  // the importing side may have made it
  verbs::VerbsOptions vo = options_.verbs;
  vo.slice_bytes = options_.slice_bytes;  // the bounce slots of staged grants
  verbs_server_ = std::make_unique<verbs::VerbsServer>(
      nics_.get(), vo,
      [this](const std::string& node, uint64_t grant, uint64_t value) { DeliverVerbsNotify(node, grant, value); },
      [this](const std::string& node, uint64_t grant, bool write, uint64_t offset, char* buf, uint64_t length,
             std::shared_ptr<const void> keep, std::function<void(absl::Status)> done) {
        StagedSlice(node, grant, write, offset, buf, length, std::move(keep), std::move(done));
      });
  return verbs_server_.get();
}

absl::StatusOr<pb::OpenVerbsResponse> MeshEngine::AcceptVerbs(const std::string& node,
                                                              const pb::OpenVerbsRequest& req) {
  if (node == node_name_) {
    return absl::PermissionDeniedError(absl::StrCat("a peer presented this node's own name '", node, "'"));
  }
  PODLINK_ASSIGN_OR_RETURN(IpPrefix asked, IpPrefix::Parse(req.address()));
  const IpPrefix* mine = nullptr;
  for (const IpPrefix& a : advertised_) {
    if (a.family == asked.family && a.addr == asked.addr) mine = &a;
  }
  if (mine == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(req.address(), " is not an address this node advertises"));
  }
  if (req.gid().size() != 16) return absl::InvalidArgumentError("a GID is 16 bytes");
  if (req.qps_size() == 0 || req.qps_size() > 16) return absl::InvalidArgumentError("1 to 16 queue pairs per path");
  PODLINK_ASSIGN_OR_RETURN(verbs::VerbsServer * server, VerbsServing());
  verbs::SideWire theirs;
  theirs.device = req.device();
  std::memcpy(theirs.gid.data(), req.gid().data(), 16);
  theirs.mtu = req.mtu();
  theirs.records = req.records();
  for (const pb::VerbsQp& q : req.qps()) theirs.qps.push_back(verbs::QpWire{q.qpn() & 0xffffff, q.psn() & 0xffffff});
  std::vector<uint32_t> replaces(req.replaces().begin(), req.replaces().end());
  if (replaces.size() > 64) return absl::InvalidArgumentError("at most 64 queue pairs replaced at once");
  PODLINK_ASSIGN_OR_RETURN(verbs::SideWire ours, server->Accept(node, req.link_instance(), *mine, theirs, replaces));
  pb::OpenVerbsResponse resp;
  resp.set_device(ours.device);
  resp.set_gid(std::string(reinterpret_cast<const char*>(ours.gid.data()), 16));
  resp.set_mtu(ours.mtu);
  resp.set_records(ours.records);
  for (const verbs::QpWire& q : ours.qps) {
    pb::VerbsQp* out = resp.add_qps();
    out->set_qpn(q.qpn);
    out->set_psn(q.psn);
    out->set_mailbox(q.mailbox);
    out->set_mailbox_rkey(q.mailbox_rkey);
  }
  return resp;
}

absl::Status MeshEngine::RegisterForVerbs(const std::string& node, uint64_t grant,
                                          const std::shared_ptr<const ExportRecord>& rec, bool over_tcp_ok,
                                          bool staged_ok, bool may_register, pb::OpenRegionResponse* resp) {
  // The TCP server needs the mapping too: an export without one is refused.
  PODLINK_ASSIGN_OR_RETURN(RelayView view, rec->memory->MapForRelay());
  absl::StatusOr<std::vector<verbs::RegionKey>> keys = absl::UnknownError("not registered");
  if (options_.verbs_staged_only) {
    keys = absl::FailedPreconditionError("mesh.verbs_staged_only: no export is registered for peers");
  } else if (!may_register) {
    // A fenceable route: its writes must land where a fence can stop them.
    keys = absl::FailedPreconditionError("a fenceable route's export is staged, never registered for the relay");
  } else if (absl::Status populated = rec->memory->CheckPopulated(0, rec->size); !populated.ok()) {
    // Registration pins every page: a range the owner punched out would be
    // faulted in at podlinkd's expense, so it is not registered (over TCP,
    // each frame's range is checked as the local relay checks each copy).
    keys = populated;
  } else {
    // GPU memory goes to the NIC as a dma-buf of the daemon's own mapping
    // (GPUDirect RDMA: peers write and read the GPU with no copy here).
    std::function<absl::StatusOr<UniqueFd>()> dmabuf;
    if (view.on_gpu) dmabuf = [memory = rec->memory] { return memory->DmaBuf(); };
    absl::StatusOr<verbs::VerbsServer*> server = VerbsServing();
    keys = server.ok() ? (*server)->Register(node, grant, rec->memory, reinterpret_cast<char*>(view.address),
                                             rec->size, std::move(dmabuf))
                       : server.status();
  }
  if (!keys.ok() && staged_ok) {
    // Over the importer's queue pairs all the same: each slice goes
    // between the export and this node's bounce pool for that peer, copied
    // here (by the copy engines for GPU memory), the range checked per slice.
    absl::StatusOr<verbs::VerbsServer*> server = VerbsServing();
    absl::Status pool = server.ok() ? (*server)->PrepareStaging(node) : server.status();
    if (pool.ok()) {
      grants_staged_.fetch_add(1, std::memory_order_relaxed);
      if (staged_log_.Due()) {
        Log()->info("event=mesh_grant_staged peer={} export={} gpu={} why=\"{}\" (grants so far: {})", node, rec->id,
                    view.on_gpu, keys.status().message(), grants_staged_.load(std::memory_order_relaxed));
      }
      resp->set_staged_reason(std::string(keys.status().message()));
      resp->set_staged_slice_bytes((*server)->stage_slot_bytes());
      return absl::OkStatus();
    }
    keys = absl::Status(keys.status().code(),
                        absl::StrCat(keys.status().message(), "; no staging over RDMA either: ", pool.message()));
  }
  if (!keys.ok()) {
    // An older importer cannot carry the grant over TCP: refused, as before.
    if (!over_tcp_ok) return keys.status();
    // The export is there, only RDMA cannot reach it (a GPU export the NICs
    // cannot register by dma-buf, memory this daemon may not pin): the grant
    // goes over TCP, where GPU memory is staged through page-locked host
    // memory by the copy engines. Said once in a while, counted always.
    grants_over_tcp_.fetch_add(1, std::memory_order_relaxed);
    if (over_tcp_log_.Due()) {
      Log()->warn("event=mesh_grant_over_tcp peer={} export={} gpu={} why=\"{}\" (grants so far: {})", node, rec->id,
                  view.on_gpu, keys.status().message(), grants_over_tcp_.load(std::memory_order_relaxed));
    }
    resp->set_over_tcp_reason(std::string(keys.status().message()));
    return absl::OkStatus();
  }
  for (const verbs::RegionKey& k : *keys) {
    pb::VerbsKey* out = resp->add_verbs_keys();
    out->set_device(k.device);
    out->set_rkey(k.rkey);
    out->set_base(k.base);
  }
  return absl::OkStatus();
}

void MeshEngine::StagedSlice(const std::string& node, uint64_t grant, bool write, uint64_t offset, char* buf,
                             uint64_t length, std::shared_ptr<const void> keep, std::function<void(absl::Status)> done) {
  absl::StatusOr<Granted> granted = LookupGrant(node, grant);
  if (!granted.ok()) return done(granted.status());
  if (granted->forward == nullptr) {
    const bool landing = write && granted->fenceable;
    if (landing && !BeginLanding(grant)) return done(absl::FailedPreconditionError("the route was fenced"));
    absl::Status copied = StagedCopy(*granted->record, write, offset, buf, length);
    if (landing) EndLanding(grant);
    return done(copied);
  }
  // A relay's grant: the slice goes on to the next node from (or into) the
  // bounce slot, which stays taken until then — the upstream node's bounce
  // slots here are the relay's staging for it, bounded per peer and device.
  const Forward& fwd = *granted->forward;
  absl::Status st;
  if (length == 0 || offset > fwd.size || length > fwd.size - offset) {
    st = absl::OutOfRangeError(absl::StrCat("range [", offset, ", +", length, ") exceeds the region of ", fwd.size,
                                            " bytes"));
  } else if (fwd.peer->instance.load(std::memory_order_acquire) != fwd.instance) {
    st = absl::UnavailableError(absl::StrCat("node ", fwd.peer->node(), "'s podlinkd restarted: open the region again"));
  }
  std::shared_ptr<DataLinks> links = fwd.peer->links();
  if (st.ok() && (links == nullptr || links->live() == 0)) {
    st = absl::UnavailableError(absl::StrCat("this relay has no link up to node ", fwd.peer->node()));
  }
  if (!st.ok()) return done(st);
  LinkOp op;
  op.type = write ? FrameType::kWrite : FrameType::kRead;
  op.grant = fwd.grant;
  op.offset = offset;
  op.length = length;
  op.local = buf;
  op.keep = std::move(keep);
  op.done = [this, length, done](const absl::Status& result) {
    if (result.ok()) {
      absl::MutexLock l(&mu_);
      relay_forwarded_bytes_ += length;
    }
    done(result);
  };
  auto failed = op.done;
  if (absl::Status submitted = links->Submit(std::move(op)); !submitted.ok()) failed(submitted);
}

absl::Status MeshEngine::StagedCopy(const ExportRecord& export_record, bool write, uint64_t offset, char* buf,
                                    uint64_t length) {
  // The same checks as a TCP frame's: the range inside the export, and for
  // host memory every page still there (the grant was checked by the caller).
  const ExportRecord* rec = &export_record;
  PODLINK_ASSIGN_OR_RETURN(RelayView view, rec->memory->MapForRelay());
  if (length == 0 || offset > rec->size || length > rec->size - offset) {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", +", length, ") exceeds export ", rec->id, " of ",
                                              rec->size, " bytes"));
  }
  if (view.on_gpu) {
    PODLINK_RETURN_IF_ERROR(TimedGpuCopy(
        [&] { return write ? rec->memory->CopyIn(offset, buf, length) : rec->memory->CopyOut(offset, buf, length); }));
  } else {
    PODLINK_RETURN_IF_ERROR(rec->memory->CheckPopulated(offset, length));
    char* at = reinterpret_cast<char*>(view.address) + offset;
    write ? std::memcpy(at, buf, length) : std::memcpy(buf, at, length);
  }
  absl::MutexLock l(&mu_);
  (write ? bytes_written_in_ : bytes_read_out_) += length;
  ++frames_served_;
  return absl::OkStatus();
}

void MeshEngine::DeliverVerbsNotify(const std::string& node, uint64_t grant, uint64_t value) {
  absl::StatusOr<Granted> granted = LookupGrant(node, grant);
  if (granted.ok() && granted->forward != nullptr &&
      granted->forward->peer->instance.load(std::memory_order_acquire) != granted->forward->instance) {
    granted = absl::UnavailableError(absl::StrCat("node ", granted->forward->peer->node(),
                                                  "'s podlinkd restarted: open the region again"));
  }
  if (granted.ok() && granted->forward != nullptr) {
    // A relay's grant: on to the next node (the writes before it were
    // answered only once they had landed there). As a notification over
    // verbs to an owner, it is not answered: a failure onward is logged and
    // counted here.
    std::shared_ptr<DataLinks> links = granted->forward->peer->links();
    LinkOp op;
    op.type = FrameType::kNotify;
    op.grant = granted->forward->grant;
    op.offset = value;
    op.done = [this, node](const absl::Status& st) {
      if (st.ok()) return;
      Log()->warn("event=mesh_notify_refused peer={} transport=verbs relayed=true why=\"{}\"", node, st.message());
      absl::MutexLock l(&mu_);
      ++refused_notifies_;
    };
    auto failed = op.done;
    absl::Status submitted = links == nullptr ? absl::UnavailableError("the relay's link went down") : links->Submit(std::move(op));
    if (!submitted.ok()) failed(submitted);
    return;
  }
  absl::Status st = granted.ok() ? host_->NotifyOwner(*granted->record, value) : granted.status();
  if (!st.ok()) {
    Log()->warn("event=mesh_notify_refused peer={} transport=verbs why=\"{}\"", node, st.message());
    absl::MutexLock l(&mu_);
    ++refused_notifies_;
  }
}

void MeshEngine::SweepLinks() {
  std::vector<std::shared_ptr<Peer>> peers;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [n, p] : peers_) peers.push_back(p);
  }
  for (const auto& p : peers) {
    if (std::shared_ptr<DataLinks> l = p->links()) l->Sweep();
  }
}

void MeshEngine::SweepVerbs() {
  std::vector<std::pair<uint64_t, std::string>> regs;
  {
    absl::MutexLock l(&verbs_mu_);
    if (verbs_server_ == nullptr) return;
    regs = verbs_server_->RegisteredGrants();
  }
  for (const auto& [grant, node] : regs) {
    bool open = false;
    {
      absl::MutexLock l(&mu_);
      open = grants_.contains(grant);
    }
    if (!open) {
      absl::MutexLock l(&verbs_mu_);
      verbs_server_->Unregister(grant, node);
      continue;
    }
    (void)GrantedExport(node, grant);  // closes the grant, and so the registration, when the export is gone
  }
}

absl::StatusOr<std::shared_ptr<verbs::VerbsLinks>> MeshEngine::ConnectVerbs(const std::string& node,
                                                                            const std::vector<Path>& paths,
                                                                            const OpenVerbsCall& open) {
  PODLINK_ASSIGN_OR_RETURN(const verbs::VerbsApi* api, verbs::LoadVerbs());
  {
    // The NIC table ConnectVerbsPath opens devices from, made once.
    absl::MutexLock l(&verbs_mu_);
    if (nics_ == nullptr) nics_ = std::make_unique<verbs::Nics>(api);
  }
  verbs::VerbsOptions vo = options_.verbs;
  vo.qps_per_path = options_.connections_per_path;
  vo.slice_bytes = options_.slice_bytes;
  vo.slices_in_flight = options_.slices_in_flight;
  vo.answer_timeout = options_.answer_timeout;
  auto links = std::make_shared<verbs::VerbsLinks>(node, vo);
  absl::Status last;
  for (const Path& path : paths) {
    absl::Status st = ConnectVerbsPath(*links, path, open, {});
    if (!st.ok()) {
      Log()->warn("event=verbs_path_failed node={} path={} why=\"{}\"", node, PathName(path), st.message());
      last = st;
    }
  }
  if (links->live() == 0) {
    return absl::UnavailableError(absl::StrCat("no verbs path to node ", node, " came up: ", last.message()));
  }
  return links;
}

absl::Status MeshEngine::ConnectVerbsPath(verbs::VerbsLinks& links, const Path& path, const OpenVerbsCall& open,
                                          const std::vector<uint32_t>& replaces) {
  if (path.fallback) return absl::FailedPreconditionError("a routed (fallback) path has no RDMA device");
  verbs::Nics* nics = nullptr;
  {
    absl::MutexLock l(&verbs_mu_);
    nics = nics_.get();
  }
  if (nics == nullptr) return absl::FailedPreconditionError("verbs not loaded");
  const verbs::VerbsOptions& vo = options_.verbs;
  PODLINK_ASSIGN_OR_RETURN(verbs::GidChoice gid, verbs::ChooseGid(vo.sysfs, path.local, vo.gid_index));
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<verbs::Nic> nic, nics->Get(gid));
  // A repair makes one QP per failed one; a new path, qps_per_path.
  PODLINK_ASSIGN_OR_RETURN(auto prepared,
                           links.PreparePath(nic, gid, PathName(path), static_cast<uint32_t>(replaces.size())));
  pb::OpenVerbsRequest req;
  req.set_address(path.remote.AddressText());
  req.set_gid(std::string(reinterpret_cast<const char*>(prepared.second.gid.data()), 16));
  req.set_mtu(prepared.second.mtu);
  req.set_link_instance(links.instance());
  req.set_device(prepared.second.device);
  req.set_records(prepared.second.records);
  for (uint32_t q : replaces) req.add_replaces(q);
  for (const verbs::QpWire& q : prepared.second.qps) {
    pb::VerbsQp* out = req.add_qps();
    out->set_qpn(q.qpn);
    out->set_psn(q.psn);
  }
  PODLINK_ASSIGN_OR_RETURN(pb::OpenVerbsResponse resp, open(req));
  if (resp.gid().size() != 16) return absl::InternalError("the owner's GID is not 16 bytes");
  verbs::SideWire owner;
  owner.device = resp.device();
  std::memcpy(owner.gid.data(), resp.gid().data(), 16);
  owner.mtu = resp.mtu();
  owner.records = resp.records();
  for (const pb::VerbsQp& q : resp.qps()) {
    owner.qps.push_back(verbs::QpWire{q.qpn() & 0xffffff, q.psn() & 0xffffff, q.mailbox(), q.mailbox_rkey()});
  }
  return links.ConnectPath(prepared.first, owner);
}

podlink::v1::MeshStatus MeshEngine::Status() const {
  podlink::v1::MeshStatus st;
  st.set_enabled(true);
  st.set_node_name(node_name_);
  for (const std::string& a : AdvertisedAddresses()) st.add_addresses(a);
  st.set_port(control_port_);
  st.set_data_port(data_port_);
  std::map<std::string, std::shared_ptr<Peer>> peers;
  std::map<std::string, uint32_t> handles;
  std::map<std::pair<std::string, std::vector<std::string>>, uint32_t> routes;
  {
    absl::MutexLock l(&mu_);
    peers = peers_;
    for (const auto& [id, h] : handles_) {
      ++handles[h.peer->tcp() ? h.peer->node() + "/tcp" : h.peer->node()];
      ++routes[{h.destination, h.via}];
    }
    for (const auto& [id, g] : grants_) {
      if (g.forward != nullptr) st.set_relayed_grants(st.relayed_grants() + 1);
    }
    st.set_relay_forwarded_bytes(relay_forwarded_bytes_);
    const int64_t now_s = absl::ToUnixSeconds(absl::Now());
    for (const auto& [node, k] : known_) {
      podlink::v1::MeshStatus::KnownNode* kn = st.add_known_nodes();
      kn->set_node(node);
      for (const std::string& a : k.addresses) kn->add_addresses(a);
      kn->set_port(k.port);
      auto adv = adverts_.find(node);
      kn->set_advert_age_seconds(adv == adverts_.end() ? -1 : std::max<int64_t>(0, now_s - adv->second.issued));
    }
    st.set_grants(grants_.size());
    st.set_served_write_bytes(bytes_written_in_);
    st.set_served_read_bytes(bytes_read_out_);
    st.set_refused_connections(refused_connections_);
    st.set_refused_frames(refused_frames_);
    st.set_denials(remote_denials_);
  }
  for (const auto& [route, n] : routes) {
    podlink::v1::MeshStatus::Route* r = st.add_routes();
    r->set_destination(route.first);
    for (const std::string& v : route.second) r->add_via(v);
    r->set_remote_handles(n);
  }
  auto copy_link = [](const pb::LinkInfo& from, podlink::v1::MeshStatus::Link* to) {
    to->set_address(from.address());
    to->set_netdev(from.netdev());
    to->set_speed_mbps(from.speed_mbps());
    to->set_pci_path(from.pci_path());
    to->set_numa_node(from.numa_node());
    to->set_rdma_device(from.rdma_device());
    to->set_gid_index(from.gid_index());
    to->set_gid_type(from.gid_type());
  };
  for (const pb::LinkInfo& l : LocalLinks()) copy_link(l, st.add_links());
  for (const auto& [key, p] : peers) {
    podlink::v1::MeshStatus::Peer* out = st.add_peers();
    out->set_node(p->node());
    out->set_remote_handles(handles[key]);
    for (const pb::LinkInfo& l : p->advertised()) copy_link(l, out->add_links());
    std::shared_ptr<DataLinks> links = p->links();
    if (links == nullptr) continue;
    LinkStats s = links->Stats();
    out->set_transport(links->transport());
    out->set_connections_up(static_cast<uint32_t>(s.connections_up));
    out->set_bytes_sent(s.bytes_sent);
    out->set_bytes_received(s.bytes_received);
    out->set_connection_failures(s.connection_failures);
    out->set_resent_slices(s.resent_slices);
    for (const auto& [path, up, sent] : links->Connections()) {
      podlink::v1::MeshStatus::Connection* c = out->add_connections();
      c->set_path(path);
      c->set_up(up);
      c->set_bytes_sent(sent);
    }
  }
  return st;
}

std::string MeshEngine::RenderMetrics() const {
  std::string out;
  std::map<std::string, double> up, sent, received, failures, resent, zero_copy, local_regs, tcp_zc_bytes,
      tcp_zc_completed, tcp_zc_copied, tcp_zc_fell_back;
  std::vector<std::shared_ptr<Peer>> peers;
  double grants = 0, handles = 0, repaired = 0;
  uint64_t in = 0, out_bytes = 0, refused_frames = 0, refused_conns = 0, denials = 0, late = 0, dup_notifies = 0;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [n, p] : peers_) peers.push_back(p);
    grants = static_cast<double>(grants_.size());
    handles = static_cast<double>(handles_.size());
    in = bytes_written_in_;
    out_bytes = bytes_read_out_;
    refused_frames = refused_frames_;
    refused_conns = refused_connections_;
    denials = remote_denials_;
    repaired = repaired_connections_;
    late = late_slices_dropped_;
    dup_notifies = duplicate_notifies_;
  }
  std::map<std::pair<std::string, std::string>, double> path_up, path_sent;
  for (const auto& p : peers) {
    std::shared_ptr<DataLinks> l = p->links();
    LinkStats s = l != nullptr ? l->Stats() : LinkStats{};
    if (l != nullptr) {
      for (const auto& [path, conn_up, conn_sent] : l->Connections()) {
        path_up[{p->node(), path}] += conn_up ? 1 : 0;
        path_sent[{p->node(), path}] += static_cast<double>(conn_sent);
      }
    }
    // A node reached both over the configured transport and, as a relay,
    // over TCP: its counters add up.
    up[p->node()] += static_cast<double>(s.connections_up);
    sent[p->node()] += static_cast<double>(s.bytes_sent);
    received[p->node()] += static_cast<double>(s.bytes_received);
    failures[p->node()] += static_cast<double>(s.connection_failures);
    resent[p->node()] += static_cast<double>(s.resent_slices);
    zero_copy[p->node()] += static_cast<double>(s.zero_copy_slices);
    tcp_zc_bytes[p->node()] += static_cast<double>(s.tcp_zero_copy_bytes);
    tcp_zc_completed[p->node()] += static_cast<double>(s.tcp_zero_copy_completed);
    tcp_zc_copied[p->node()] += static_cast<double>(s.tcp_zero_copy_copied);
    tcp_zc_fell_back[p->node()] += static_cast<double>(s.tcp_zero_copy_fell_back);
    local_regs[p->node()] += static_cast<double>(s.local_registrations);
  }
  RenderFamily(&out, "podlink_mesh_connections_up", "gauge", "data connections up, per peer node", up, "peer");
  RenderFamily(&out, "podlink_mesh_sent_bytes_total", "counter", "bytes written to peer nodes", sent, "peer");
  RenderFamily(&out, "podlink_mesh_received_bytes_total", "counter", "bytes read from peer nodes", received, "peer");
  RenderFamily(&out, "podlink_mesh_connection_failures_total", "counter", "data connections that failed", failures,
               "peer");
  RenderFamily(&out, "podlink_mesh_resent_slices_total", "counter",
               "slices sent again over another connection after theirs failed", resent, "peer");
  RenderFamily(&out, "podlink_mesh_zero_copy_slices_total", "counter",
               "verbs: slices sent from or read into a local export directly (no copy through staging)", zero_copy,
               "peer");
  RenderFamily(&out, "podlink_mesh_tcp_zero_copy_bytes_total", "counter",
               "TCP: bytes of pods' host exports written to peer nodes without a copy (MSG_ZEROCOPY)", tcp_zc_bytes,
               "peer");
  RenderFamily(&out, "podlink_mesh_tcp_zero_copy_completed_total", "counter",
               "TCP: zero-copy sends the kernel reported done (copied or not)", tcp_zc_completed, "peer");
  RenderFamily(&out, "podlink_mesh_tcp_zero_copy_copied_total", "counter",
               "TCP: zero-copy sends the kernel copied after all (loopback, veth: the connection then stops asking)",
               tcp_zc_copied, "peer");
  RenderFamily(&out, "podlink_mesh_tcp_zero_copy_fell_back_total", "counter",
               "TCP: sends the kernel would not pin (locked-memory limit, optmem), copied instead", tcp_zc_fell_back,
               "peer");
  RenderFamily(&out, "podlink_mesh_local_registrations", "gauge",
               "verbs: local exports registered with the RDMA device for that, per peer node", local_regs, "peer");
  RenderFamily2(&out, "podlink_mesh_path_connections_up", "gauge",
                "data connections (TCP) or queue pairs (verbs) up, per peer node and path (local->remote address)",
                path_up, "peer", "path");
  RenderFamily2(&out, "podlink_mesh_path_sent_bytes_total", "counter", "bytes written to a peer node, per path",
                path_sent, "peer", "path");
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    RenderFamily(&out, name, type, help, {{"", v}});
  };
  one("podlink_mesh_grants", "gauge", "grants this node gave peer daemons", grants);
  one("podlink_mesh_repaired_connections_total", "counter",
      "data connections dialed again over a path after theirs failed", static_cast<double>(repaired));
  one("podlink_mesh_remote_handles", "gauge", "remote regions this node's pods hold", handles);
  one("podlink_mesh_served_write_bytes_total", "counter", "bytes peers wrote into this node's exports",
      static_cast<double>(in));
  one("podlink_mesh_served_read_bytes_total", "counter", "bytes peers read from this node's exports",
      static_cast<double>(out_bytes));
  one("podlink_mesh_refused_frames_total", "counter", "data connections closed for a malformed frame",
      static_cast<double>(refused_frames));
  one("podlink_mesh_refused_connections_total", "counter",
      "data connections refused (no valid cookie, or over the bound)", static_cast<double>(refused_conns));
  one("podlink_mesh_denials_total", "counter", "remote opens refused", static_cast<double>(denials));
  one("podlink_mesh_late_slices_dropped_total", "counter",
      "copies of slices that arrived after their transfer finished (resent elsewhere), dropped",
      static_cast<double>(late));
  one("podlink_mesh_duplicate_notifies_total", "counter", "notifications received again and not delivered twice",
      static_cast<double>(dup_notifies));
  auto counted = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  one("podlink_mesh_two_hop_routes_total", "counter",
      "second routes through a relay opened for regions of cabled nodes (mesh.two_hop_stripe)",
      counted(two_hop_routes_));
  one("podlink_mesh_two_hop_transfers_total", "counter", "transfers striped over the direct links and a two-hop route",
      counted(two_hop_transfers_));
  one("podlink_mesh_two_hop_bytes_total", "counter", "bytes such transfers moved over their two-hop route",
      counted(two_hop_bytes_));
  one("podlink_mesh_two_hop_failovers_total", "counter",
      "chunks a two-hop route failed, sent again on the direct links", counted(two_hop_failovers_));
  one("podlink_mesh_two_hop_fences_total", "counter",
      "two-hop routes the owner fenced before their chunks went again on the direct links", counted(two_hop_fences_));
  {
    absl::MutexLock l(&mu_);
    one("podlink_mesh_fenced_grants_total", "counter",
        "grants given relays that their origin node fenced (FenceRoute)", static_cast<double>(fenced_grants_));
  }
  uint64_t refused_notifies = 0;
  {
    absl::MutexLock l(&mu_);
    refused_notifies = refused_notifies_;
  }
  uint64_t relayed = 0, routed = 0, forwarded = 0, staged = 0;
  {
    absl::MutexLock l(&mu_);
    relayed = relayed_opens_;
    routed = routed_opens_;
    forwarded = relay_forwarded_bytes_;
    staged = relay_staged_;
  }
  uint64_t restarted_dropped = 0, idle_dropped = 0, adverts_held = 0, adverts_refused = 0;
  {
    absl::MutexLock l(&mu_);
    restarted_dropped = restarted_peer_grants_dropped_;
    idle_dropped = idle_peer_grants_dropped_;
    adverts_held = adverts_.size();
    adverts_refused = adverts_refused_;
  }
  one("podlink_mesh_restarted_peer_grants_dropped_total", "counter",
      "grants dropped because the daemon holding them restarted (a new instance said so)",
      static_cast<double>(restarted_dropped));
  one("podlink_mesh_idle_peer_grants_dropped_total", "counter",
      "grants dropped because the node holding them was silent longer than mesh.grant_idle_seconds",
      static_cast<double>(idle_dropped));
  one("podlink_mesh_node_adverts", "gauge", "signed node adverts this daemon holds (its own included)",
      static_cast<double>(adverts_held));
  one("podlink_mesh_node_adverts_refused_total", "counter",
      "node adverts refused: malformed, or not signed by the node they name under the mesh CA",
      static_cast<double>(adverts_refused));
  one("podlink_mesh_relayed_opens_total", "counter", "regions this node opened onward for other nodes (as a relay)",
      static_cast<double>(relayed));
  one("podlink_mesh_routed_opens_total", "counter", "regions this node's pods opened through relays",
      static_cast<double>(routed));
  one("podlink_mesh_relay_forwarded_bytes_total", "counter", "bytes this node forwarded as a relay",
      static_cast<double>(forwarded));
  one("podlink_mesh_verbs_fallbacks_total", "counter",
      "opens this node sent over TCP because no RDMA path to the node came up (mesh.verbs_tcp_fallback)",
      static_cast<double>(verbs_fallbacks_.load(std::memory_order_relaxed)));
  one("podlink_mesh_grants_over_tcp_total", "counter",
      "grants this node gave over TCP though the importer asked for RDMA (the export could not be registered)",
      static_cast<double>(grants_over_tcp_.load(std::memory_order_relaxed)));
  one("podlink_mesh_grants_staged_total", "counter",
      "grants this node stages through its bounce pools over the importer's queue pairs (export not registered)",
      static_cast<double>(grants_staged_.load(std::memory_order_relaxed)));
  one("podlink_mesh_relay_staged_bytes", "gauge", "bytes of forwarded requests held in this node's relay staging",
      static_cast<double>(staged));
  one("podlink_mesh_refused_notifies_total", "counter",
      "notifications from peers not delivered (grant not theirs, export gone)", static_cast<double>(refused_notifies));
  absl::MutexLock l(&verbs_mu_);
  if (verbs_server_ != nullptr) {
    one("podlink_mesh_verbs_served_qps", "gauge", "RC queue pairs this node holds for peer daemons",
        static_cast<double>(verbs_server_->qps()));
    one("podlink_mesh_verbs_registrations", "gauge", "exports registered for peers' RDMA access (shared by their grants)",
        static_cast<double>(verbs_server_->registrations()));
    one("podlink_mesh_verbs_notifies_total", "counter", "notifications received by RDMA WRITE WITH IMMEDIATE",
        static_cast<double>(verbs_server_->notifies()));
    one("podlink_mesh_verbs_staged_slices_total", "counter",
        "slices of staged grants copied between an export and a bounce pool for a peer",
        static_cast<double>(verbs_server_->staged_slices()));
    one("podlink_mesh_verbs_staged_refused_total", "counter",
        "staged slices refused (grant not the peer's, export gone, range outside it, bad record)",
        static_cast<double>(verbs_server_->staged_refused()));
    one("podlink_mesh_verbs_staged_late_dropped_total", "counter",
        "copies of staged writes dropped because their transfer had ended (sent again after their queue pair failed)",
        static_cast<double>(verbs_server_->staged_late_dropped()));
    one("podlink_mesh_verbs_staged_done_total", "counter",
        "staged writes sent partly twice whose end the importer had confirmed (DONE records answered)",
        static_cast<double>(verbs_server_->staged_done()));
  }
  if (gpu_copies_.count() > 0) {
    absl::StrAppend(&out, "# HELP podlink_mesh_gpu_served_copy_seconds copies between a GPU export and a data ",
                    "connection's host buffer (exporting side)\n",
                    "# TYPE podlink_mesh_gpu_served_copy_seconds histogram\n");
    gpu_copies_.Render("podlink_mesh_gpu_served_copy_seconds", &out);
  }
  return out;
}

absl::Status MeshEngine::TimedGpuCopy(const std::function<absl::Status()>& copy) {
  const absl::Time t0 = absl::Now();
  absl::Status st = copy();
  if (st.ok()) gpu_copies_.Observe(absl::ToDoubleSeconds(absl::Now() - t0));
  return st;
}

}  // namespace podlink::mesh
