// A peer daemon as the importing side sees it: its worker, links, control
// stub and paths (the control room's; CMake target podlink_mesh_peer).
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/links/links.h"
#include "daemon/mesh/links/nic_rank.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"

namespace grpc::experimental {
class CertificateProviderInterface;
}  // namespace grpc::experimental

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

// A peer daemon as the importing side sees it. Its worker thread does every
// blocking exchange with the peer (dial, TLS, OpenLink, OpenRegion), one at a
// time, so no caller's thread ever waits on a handshake.

class Peer : public std::enable_shared_from_this<Peer> {
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
void ReleaseRemoteGrant(Peer* peer, uint64_t grant);

// A control channel to `node` at `endpoint` over mutual TLS with the
// certificate files `certs` watches; the peer's certificate must name `node`.
std::shared_ptr<pb::Mesh::Stub> NewMeshStub(
    const std::shared_ptr<grpc::experimental::CertificateProviderInterface>& certs, const std::string& node,
    const std::string& endpoint);

// A peer daemon's answer, said as coming from `node` (common/status_util.h translates).
absl::Status FromGrpc(const grpc::Status& s, const std::string& node);

// The peer whose links carry a grant a node gave (a relay's onward open, an
// importer's open), and that node's answer.
struct Carried {
  std::shared_ptr<Peer> carrier;
  pb::OpenRegionResponse resp;
};

// How a relay says it cannot take a region over verbs (the owner's room says
// it; the importer then reaches the relay over TCP).
inline constexpr char kRelayCannotStage[] = " cannot stage over verbs: ";
// A relay's refusal to stage a region over verbs for its caller (no bounce
// pool for it; or, from a relay of a version before staging, "relayed
// regions ride TCP links"): the hop to it can still go over TCP.
bool RelayCannotStage(const absl::Status& st);

}  // namespace podlink::mesh
