// What the mesh engine's files (daemon/mesh/mesh_engine.cc and the rooms
// beside it: control/, owner/, routing/, importer/, tcp/, verbs/, status.cc)
// share and nothing else includes: the nested classes they all use, helpers
// and constants. Internal to the engine.
#pragma once

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

namespace pb = podlink::mesh::v1;

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
bool RelayCannotStage(const absl::Status& st);

absl::StatusOr<std::string> ReadPem(const std::string& dir, const char* name);

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

absl::Status FromGrpc(const grpc::Status& s, const std::string& node);
grpc::Status ToGrpc(const absl::Status& s);
uint64_t RandomU64();
std::string RandomCookie();
void TuneDataSocket(int fd, absl::Duration io_timeout);
socklen_t ToSockaddr(const IpPrefix& a, uint16_t port, sockaddr_storage* ss);
std::string HostPort(const IpPrefix& a, uint32_t port);
// Connects `path` to `port` within `timeout`; the socket is blocking after.
absl::StatusOr<UniqueFd> Dial(const Path& path, uint16_t port, absl::Duration timeout);

// GPU exports served to other nodes, and writes on a fenceable route's grant:
// the bytes pass through a host buffer of the connection's thread, a chunk at
// a time (MemoryObject::CopyIn/Out; LandFenceable).
constexpr uint64_t kGpuChunk = uint64_t{4} << 20;
constexpr uint64_t kMaxGpuFrame = uint64_t{64} << 20;
char* ChunkBuffer();
// ReadFull with an absolute deadline over the whole read.
absl::Status ReadFullBefore(int fd, void* buf, size_t len, absl::Time deadline);
bool ValidNodeName(const std::string& n);
std::string PathName(const Path& path);
absl::Status SendAck(int fd, uint64_t tag, const absl::Status& st);

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


// Gives back a grant this node holds from `peer`: its verbs keys at once, the
// grant itself on the peer's worker, best effort (grants also die with their
// export).
void ReleaseRemoteGrant(MeshEngine::Peer* peer, uint64_t grant);

}  // namespace podlink::mesh
