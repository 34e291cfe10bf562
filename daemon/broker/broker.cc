#include "daemon/broker/broker.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>
#include <openssl/sha.h>

#include <cerrno>
#include <fstream>

#include "absl/strings/string_view.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/fd_channel.h"
#include "common/pci.h"
#include "common/status_util.h"
#include "daemon/gpu/host_backend.h"
#include "daemon/identity/standalone_source.h"
#include "daemon/ncclipc/shm_mount.h"
#include "daemon/policy/policy.h"
#include "common/log.h"
#include "daemon/metrics/process_metrics.h"

namespace podlink {
namespace {

const ComponentLog BrokerLog("broker");

std::string ReadBootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id.empty() ? "unknown-node" : id;
}

std::array<uint64_t, 2> NewToken() {
  std::array<uint64_t, 2> t{};
  size_t got = 0;
  auto* p = reinterpret_cast<char*>(t.data());
  while (got < sizeof(t)) {
    ssize_t n = ::getrandom(p + got, sizeof(t) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return t;
}

bool ValidExportName(const std::string& n) {
  if (n.empty() || n.size() > 200) return false;
  for (char c : n) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return true;
}

// Kubernetes namespace and pod names: DNS labels / subdomains, <= 253.
bool ValidK8sName(const std::string& n) {
  if (n.empty() || n.size() > 253) return false;
  for (char c : n) {
    if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
          absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.')) {
      return false;
    }
  }
  return true;
}

// What a client may hand podlinkd: memory (a memfd or a cuMem POSIX handle,
// which is a regular or character-device file) and eventfds. Anything that
// can hold other descriptors or keep a connection alive (sockets, epoll,
// io_uring, pidfds, pipes) is refused.
bool OfferableDescriptor(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  if (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)) return true;
  char link[64] = {};
  std::string path = absl::StrCat("/proc/self/fd/", fd);
  ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  return n > 0 && absl::string_view(link, static_cast<size_t>(n)) == "anon_inode:[eventfd]";
}

// The answers for an export that does not exist; also given to pods of other
// namespaces for exports they may not import, so ids and names cannot be
// probed across namespaces.
absl::Status NoSuchExport(uint64_t id) {
  return absl::NotFoundError(absl::StrCat("no export with id ", id, " that this pod may import (never existed, ",
                                          "already gone, or not shared with this pod)"));
}
absl::Status NoSuchName(const std::string& name, const std::string& caller_ns) {
  size_t slash = name.find('/');
  std::string ns = slash == std::string::npos ? caller_ns : name.substr(0, slash);
  std::string n = slash == std::string::npos ? name : name.substr(slash + 1);
  return absl::NotFoundError(absl::StrCat("no export named '", n, "' in namespace ", ns,
                                          " that this pod may import (never existed, already gone, or not shared ",
                                          "with this pod)"));
}

v1::Event MakeEvent(v1::Event::Type type, uint64_t id, std::string name, std::string reason) {
  v1::Event e;
  e.set_type(type);
  e.set_export_id(id);
  e.set_export_name(std::move(name));
  e.set_reason(std::move(reason));
  return e;
}

}  // namespace

Broker::Broker(BrokerOptions options, std::unique_ptr<PodSource> pods, GpuInventory inventory,
               std::vector<std::unique_ptr<MemoryBackend>> backends)
    : options_(options),
      pods_(std::move(pods)),
      inventory_(std::move(inventory)),
      backends_(std::move(backends)),
      registry_(options.registry),
      node_id_(options.node_id.empty() ? ReadBootId() : options.node_id) {}

Broker::~Broker() { CloseAllSessions("daemon stopping"); }

MemoryBackend* Broker::BackendFor(HandleKind kind) const {
  for (const auto& b : backends_) {
    if (b->Handles(kind)) return b.get();
  }
  return nullptr;
}

absl::StatusOr<PeerIdentity> Broker::IdentifyClient(int sock) const {
  return IdentifyPeer(sock, options_.cgroup_layout);
}

std::optional<absl::StatusOr<PodInfo>> Broker::ResolvePodCached(const PeerIdentity& peer) {
  return pods_->ResolveCached(peer);
}

absl::StatusOr<PodInfo> Broker::ResolvePod(const PeerIdentity& peer) { return pods_->Resolve(peer); }

absl::StatusOr<std::shared_ptr<Session>> Broker::OpenSession(UniqueFd sock) {
  absl::StatusOr<PeerIdentity> peer = IdentifyClient(sock.get());
  absl::StatusOr<PodInfo> pod = peer.ok() ? ResolvePod(*peer) : absl::StatusOr<PodInfo>(peer.status());
  return FinishOpen(std::move(sock), std::move(peer), std::move(pod));
}

absl::StatusOr<std::shared_ptr<Session>> Broker::FinishOpen(UniqueFd sock, absl::StatusOr<PeerIdentity> peer,
                                                            absl::StatusOr<PodInfo> pod) {
  // GOODBYE carries the code; the reason follows as one more packet of text
  // (the pod source's texts name only the client's own facts).
  auto goodbye = [&](const absl::Status& why) {
    absl::string_view text = why.message().substr(0, kGoodbyeTextMax);
    if (why.message().size() > kGoodbyeTextMax) {  // cut at a character boundary, not inside one
      while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xc0) == 0x80) text.remove_suffix(1);
      if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xc0) text.remove_suffix(1);
    }
    FdMessage m;
    m.type = static_cast<uint16_t>(FdMsgType::kGoodbye);
    m.a = static_cast<uint64_t>(why.code());
    m.b = text.size();
    if (SendFdMessage(sock.get(), m, -1, /*dontwait=*/true).ok() && !text.empty()) {
      (void)::send(sock.get(), text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    return why;
  };
  if (!peer.ok()) return goodbye(peer.status());
  if (!pod.ok()) return goodbye(pod.status());

  pod->key = IdentityKey(*peer);  // from the kernel, whatever the pod source says
  std::shared_ptr<Session> s;
  {
    absl::MutexLock l(&mu_);
    if (sessions_.size() >= options_.max_sessions) {
      return goodbye(absl::ResourceExhaustedError(absl::StrCat(
          "podlinkd serves at most ", options_.max_sessions, " sessions; try again later")));
    }
    size_t& mine = sessions_per_pod_[pod->key];
    if (mine >= options_.max_sessions_per_pod) {
      return goodbye(absl::ResourceExhaustedError(absl::StrCat(
          "pod ", pod->Ref(), " already has ", mine, " sessions (podlinkd's per-pod limit); close some first")));
    }
    ++mine;
    uint64_t id = next_session_++;
    s = std::make_shared<Session>(id, NewToken(), *std::move(peer), *std::move(pod), std::move(sock));
    sessions_[id] = s;
  }
  sessions_total_.fetch_add(1, std::memory_order_relaxed);
  FdMessage hello;
  hello.type = static_cast<uint16_t>(FdMsgType::kHello);
  hello.seq = s->id;
  hello.a = s->token[0];
  hello.b = s->token[1];
  absl::Status sent;
  {
    absl::MutexLock l(&s->send_mu);
    sent = SendFdMessage(s->sock.get(), hello, -1, /*dontwait=*/true);
  }
  if (!sent.ok()) {
    CloseSession(s->id, "could not greet client");
    return sent;
  }
  BrokerLog()->info("event=session_open session={} pid={} uid={} pod={} key={} container={} qos={}", s->id,
              s->peer.pid, s->peer.uid, LogQuoted(s->pod.Ref()), LogQuoted(s->pod.key), s->peer.cgroup.container_id,
              s->peer.cgroup.qos_class);
  return s;
}

void Broker::OnOffer(Session& s, uint64_t slot, UniqueFd fd) {
  uint64_t err = 0;
  absl::Time now = absl::Now();
  if (!fd.valid()) {
    err = EBADF;
  } else if (!OfferableDescriptor(fd.get())) {
    // A socket (the client's own end of this channel, say) held by podlinkd
    // would keep the session open after the client exits.
    err = EINVAL;
  } else {
    absl::MutexLock l(&s.mu);
    if (s.closed) return;
    ExpireOffersLocked(s, now);
    if (s.offers.size() >= options_.max_pending_offers) {
      err = EMFILE;
    } else if (s.offers.contains(slot)) {
      err = EEXIST;
    } else if (!CountOffers(s, 1)) {
      err = EMFILE;
    } else {
      s.offers.emplace(slot, Session::Offer{std::move(fd), now});
    }
  }
  FdMessage ack;
  ack.type = static_cast<uint16_t>(FdMsgType::kOfferAck);
  ack.seq = slot;
  ack.a = err;
  absl::MutexLock l(&s.send_mu);
  (void)SendFdMessage(s.sock.get(), ack, -1, /*dontwait=*/true);
}

void Broker::ExpireOffersLocked(Session& s, absl::Time now) {
  UncountOffers(s, std::erase_if(s.offers, [&](const auto& kv) { return now - kv.second.at > options_.offer_ttl; }));
}

bool Broker::CountOffers(const Session& s, size_t n) {
  absl::MutexLock l(&offers_mu_);
  size_t& pod = offers_per_pod_[s.pod.key];
  if (pod + n > options_.max_pending_offers_per_pod || offers_total_ + n > options_.max_pending_offers_total) {
    if (pod == 0) offers_per_pod_.erase(s.pod.key);
    return false;  // answered EMFILE, as the session's own bound (no log line per refused offer of a flood)
  }
  pod += n;
  offers_total_ += n;
  return true;
}

void Broker::UncountOffers(const Session& s, size_t n) {
  if (n == 0) return;
  absl::MutexLock l(&offers_mu_);
  auto it = offers_per_pod_.find(s.pod.key);
  if (it == offers_per_pod_.end() || it->second < n || offers_total_ < n) {
    BrokerLog()->error("event=offer_count_mismatch session={} n={}", s.id, n);  // a bug: never below zero
    return;
  }
  offers_total_ -= n;
  if ((it->second -= n) == 0) offers_per_pod_.erase(it);
}

void Broker::ExpireOffers() {
  std::vector<std::shared_ptr<Session>> all;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, s] : sessions_) all.push_back(s);
  }
  absl::Time now = absl::Now();
  for (const auto& s : all) {
    absl::MutexLock l(&s->mu);
    ExpireOffersLocked(*s, now);
  }
}

std::shared_ptr<Session> Broker::FindSession(uint64_t id) const {
  absl::MutexLock l(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

void Broker::NotifyGone(const RemovedExport& removed, const std::string& reason) {
  v1::Event e = MakeEvent(v1::Event::TYPE_EXPORT_GONE, removed.record->id, removed.record->name, reason);
  for (uint64_t imp : removed.importers) {
    std::shared_ptr<Session> s = FindSession(imp);
    if (!s) continue;
    absl::MutexLock l(&s->mu);
    for (auto& w : s->watchers) w->Push(e);
  }
}

void Broker::CloseSession(uint64_t session_id, const std::string& reason) {
  std::shared_ptr<Session> s;
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return;
    s = std::move(it->second);
    sessions_.erase(it);
    if (auto p = sessions_per_pod_.find(s->pod.key); p != sessions_per_pod_.end() && --p->second == 0) {
      sessions_per_pod_.erase(p);
    }
  }
  std::vector<std::shared_ptr<EventSink>> watchers;
  {
    absl::MutexLock l(&s->mu);
    s->closed = true;
    UncountOffers(*s, s->offers.size());
    s->offers.clear();
    watchers.swap(s->watchers);
  }
  ::shutdown(s->sock.get(), SHUT_RDWR);
  if (relay_ != nullptr) relay_->RemoveRing(session_id);
  if (mesh_ != nullptr) mesh_->DropSession(session_id);
  LeaveNcclNative(session_id);
  std::vector<RemovedExport> removed = registry_.RemoveSession(session_id);
  for (const RemovedExport& r : removed) {
    NotifyGone(r, absl::StrCat("owner ", s->pod.Ref(), " session closed: ", reason));
  }
  v1::Event bye = MakeEvent(v1::Event::TYPE_SESSION_CLOSED, 0, "", reason);
  for (auto& w : watchers) w->Close(bye);
  BrokerLog()->info("event=session_close session={} pod={} exports_dropped={} reason={}", session_id,
              s->pod.Ref(), removed.size(), LogQuoted(reason));
}

void Broker::CloseAllSessions(const std::string& reason) {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [id, s] : sessions_) ids.push_back(id);
  }
  for (uint64_t id : ids) CloseSession(id, reason);
}

absl::StatusOr<std::shared_ptr<Session>> Broker::Authenticate(absl::string_view credential) {
  auto unauth = [](absl::string_view why) {
    return absl::UnauthenticatedError(absl::StrCat(
        why, ": every call must carry metadata '", kSessionMetadataKey,
        "' from the HELLO of the descriptor channel (libpodlink's Client::Connect does this)"));
  };
  std::vector<absl::string_view> parts = absl::StrSplit(credential, '.');
  uint64_t id;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &id) || parts[1].size() != 32) {
    return unauth("missing or malformed session credential");
  }
  std::array<uint64_t, 2> token{};
  for (int i = 0; i < 2; ++i) {
    if (!absl::SimpleHexAtoi(parts[1].substr(i * 16, 16), &token[i])) {
      return unauth("malformed session token");
    }
  }
  std::shared_ptr<Session> s = FindSession(id);
  // Compare without an early exit so timing reveals nothing of the token.
  uint64_t diff = s ? ((s->token[0] ^ token[0]) | (s->token[1] ^ token[1])) : 1;
  if (diff != 0) return unauth("unknown or closed session");
  return s;
}

v1::NodeInfo Broker::GetNodeInfo() const {
  v1::NodeInfo n;
  n.set_node_id(node_id_);
  n.set_daemon_version(PODLINK_VERSION);
  n.set_node_name(options_.node_name);
  n.set_cuda_available(inventory_.cuda_available);
  n.set_cuda_status(inventory_.cuda_status);
  n.set_cuda_driver_version(inventory_.driver_version);
  if (mesh_ != nullptr) {
    for (const std::string& a : mesh_->AdvertisedAddresses()) n.add_mesh_addresses(a);
    n.set_mesh_port(mesh_->control_port());
    for (const mesh::v1::LinkInfo& l : mesh_->LocalLinks()) {
      v1::MeshStatus::Link* out = n.add_mesh_links();
      out->set_address(l.address());
      out->set_netdev(l.netdev());
      out->set_speed_mbps(l.speed_mbps());
      out->set_pci_path(l.pci_path());
      out->set_numa_node(l.numa_node());
    }
  }
  bool any_posix = false, any_fabric = false;
  for (const GpuDevice& g : inventory_.gpus) {
    v1::Gpu* out = n.add_gpus();
    out->set_index(g.ordinal);
    out->set_uuid(g.uuid);
    out->set_pci_bus_id(g.pci_bus_id);
    out->set_device_node(g.device_node);
    out->set_name(g.name);
    out->set_total_memory(g.total_memory);
    out->set_posix_fd_supported(g.posix_fd_supported);
    out->set_fabric_supported(g.fabric_supported);
    out->set_granularity(g.granularity);
    for (const GpuPeer& p : g.peers) {
      v1::NvLinkPeer* peer = out->add_peers();
      peer->set_uuid(p.uuid);
      peer->set_link_count(p.link_count);
      peer->set_p2p_supported(p.p2p_supported);
    }
    any_posix |= g.posix_fd_supported && BackendFor(HandleKind::kPosixFd) != nullptr;
    any_fabric |= g.fabric_supported && BackendFor(HandleKind::kFabric) != nullptr;
  }
  if (BackendFor(HandleKind::kHostMemfd)) n.add_handle_types(v1::HANDLE_TYPE_HOST_MEMFD);
  if (BackendFor(HandleKind::kProcessMemory)) n.add_handle_types(v1::HANDLE_TYPE_PROCESS_MEMORY);
  if (any_posix) n.add_handle_types(v1::HANDLE_TYPE_POSIX_FD);
  if (any_fabric) n.add_handle_types(v1::HANDLE_TYPE_FABRIC);
  return n;
}

v1::WhoAmIResponse Broker::WhoAmI(const Session& s) const {
  v1::WhoAmIResponse r;
  r.set_session_id(s.id);
  v1::Identity* id = r.mutable_identity();
  id->set_pid(s.peer.pid);
  id->set_uid(s.peer.uid);
  id->set_gid(s.peer.gid);
  id->set_container_id(s.peer.cgroup.container_id);
  id->set_pod_uid(s.peer.cgroup.pod_uid);
  id->set_namespace_(s.pod.namespace_);
  id->set_pod_name(s.pod.name);
  for (const auto& [k, v] : s.pod.annotations) (*id->mutable_annotations())[k] = v;
  id->set_qos_class(s.peer.cgroup.qos_class);
  id->set_cgroup_path(s.peer.cgroup.path);
  id->set_source(s.pod.source);
  return r;
}

absl::StatusOr<uint64_t> Broker::Deliver(Session& s, uint64_t export_id, int fd) {
  uint64_t slot = 0;
  {
    absl::MutexLock l(&s.mu);
    slot = s.next_delivery++;
  }
  FdMessage m;
  m.type = static_cast<uint16_t>(FdMsgType::kDeliver);
  m.seq = slot;
  m.a = export_id;
  absl::MutexLock l(&s.send_mu);
  // Never blocks: a client that does not read its channel fails its own import, nothing else.
  PODLINK_RETURN_IF_ERROR(SendFdMessage(s.sock.get(), m, fd, /*dontwait=*/true));
  return slot;
}

absl::StatusOr<UniqueFd> Broker::TakeOffer(Session& s, uint64_t slot, const char* what) {
  absl::MutexLock l(&s.mu);
  auto it = s.offers.find(slot);
  if (it == s.offers.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no descriptor offered in slot ", slot, " for the ", what,
        ": send it over the descriptor channel (OFFER) and wait for its ack first"));
  }
  UniqueFd fd = std::move(it->second.fd);
  s.offers.erase(it);
  UncountOffers(s, 1);
  return fd;
}

absl::StatusOr<v1::ExportResponse> Broker::Export(Session& s, const v1::ExportRequest& req) {
  // Take the offered descriptors first so that they are consumed whatever happens.
  UniqueFd fd;
  const bool chunked = req.chunks_size() > 0;
  bool wants_fd = !chunked && (req.handle_type() == v1::HANDLE_TYPE_POSIX_FD ||
                               req.handle_type() == v1::HANDLE_TYPE_HOST_MEMFD);
  std::vector<UniqueFd> chunk_fds;
  std::vector<uint64_t> chunk_sizes;
  if (chunked) {
    if (static_cast<size_t>(req.chunks_size()) > options_.max_export_chunks) {
      return absl::InvalidArgumentError(absl::StrCat("an export may span at most ", options_.max_export_chunks,
                                                     " cuMem allocations (max_export_chunks), not ",
                                                     req.chunks_size(), ": register the memory in parts"));
    }
    // Every chunk's offer is taken, also past one that is missing: none is left to wait out its TTL.
    absl::Status missing;
    for (const v1::ExportChunk& c : req.chunks()) {
      absl::StatusOr<UniqueFd> cfd = TakeOffer(s, c.fd_slot(), "export's allocation");
      if (!cfd.ok()) {
        if (missing.ok()) missing = cfd.status();
        continue;
      }
      chunk_fds.push_back(*std::move(cfd));
      chunk_sizes.push_back(c.size());
    }
    PODLINK_RETURN_IF_ERROR(missing);
    if (req.handle_type() != v1::HANDLE_TYPE_POSIX_FD) {
      return absl::InvalidArgumentError("chunks are for POSIX_FD exports (cuMem allocations) only");
    }
    if (req.fd_slot() != 0) return absl::InvalidArgumentError("an export names fd_slot or chunks, not both");
    PODLINK_RETURN_IF_ERROR(CheckChunkLayout(chunk_sizes, req.offset(), req.size()));
  }
  if (wants_fd) {
    PODLINK_ASSIGN_OR_RETURN(fd, TakeOffer(s, req.fd_slot(), "export"));
  }
  if (!chunked && req.offset() != 0) return absl::InvalidArgumentError("offset is given with chunks only");
  HandleKind kind;
  switch (req.handle_type()) {
    case v1::HANDLE_TYPE_POSIX_FD:
      kind = HandleKind::kPosixFd;
      break;
    case v1::HANDLE_TYPE_FABRIC:
      kind = HandleKind::kFabric;
      break;
    case v1::HANDLE_TYPE_HOST_MEMFD:
      kind = HandleKind::kHostMemfd;
      break;
    case v1::HANDLE_TYPE_PROCESS_MEMORY:
      kind = HandleKind::kProcessMemory;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("handle_type ", req.handle_type(),
                                                     " is not one of POSIX_FD, FABRIC, HOST_MEMFD, PROCESS_MEMORY"));
  }
  if ((kind == HandleKind::kProcessMemory) != (req.address() != 0)) {
    return absl::InvalidArgumentError("address is given with PROCESS_MEMORY exports, and only with them");
  }
  if (req.size() == 0 || req.size() > options_.max_export_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("export size ", req.size(), " out of range (1 .. ", options_.max_export_size, ")"));
  }
  if (!req.name().empty() && !ValidExportName(req.name())) {
    return absl::InvalidArgumentError(
        "export name must be 1-200 characters of [A-Za-z0-9._-] (no '/': import by name uses "
        "'namespace/name')");
  }
  if (static_cast<size_t>(req.allowed_importers_size()) > options_.max_allowed_importers) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", options_.max_allowed_importers,
                                                   " allowed_importers per export"));
  }
  ExportRecord rec;
  for (const v1::PodRef& p : req.allowed_importers()) {
    if (!ValidK8sName(p.namespace_()) || !ValidK8sName(p.name())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allowed_importers entry '", p.namespace_(), "/", p.name(),
          "' is not a valid namespace/name (lowercase DNS names)"));
    }
    rec.allowed_importers.push_back({p.namespace_(), p.name()});
  }
  if (!wants_fd && !chunked && req.fd_slot() != 0) {
    return absl::InvalidArgumentError("fd_slot is only meaningful for POSIX_FD and HOST_MEMFD exports");
  }
  if (!req.mesh_affinity().empty()) {
    if (kind != HandleKind::kHostMemfd) {
      return absl::InvalidArgumentError("mesh_affinity is for host memory (a GPU export's place is its GPU)");
    }
    if (!IsPciBusId(req.mesh_affinity())) {
      return absl::InvalidArgumentError(
          "mesh_affinity must be a PCI bus id as sysfs names it: 'dddd:bb:dd.f' in lowercase hex");
    }
    rec.mesh_affinity = req.mesh_affinity();
  }
  MemoryBackend* backend = BackendFor(kind);
  if (backend == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(HandleKindName(kind), " exports are not served by this daemon"));
  }
  ExportClaim claim{req.size(), req.gpu_uuid(), kind};
  if (kind == HandleKind::kProcessMemory) {
    // The session's own process, as the kernel named it when it connected.
    claim.address = req.address();
    claim.pid = s.peer.pid;
    claim.pidfd = s.peer.pidfd.get();
    claim.session = s.id;
  }
  if (chunked) {
    claim.chunk_sizes = chunk_sizes;
    claim.chunk_fds = &chunk_fds;
    claim.offset = req.offset();
    rec.weight = chunk_sizes.size();
  }
  PODLINK_ASSIGN_OR_RETURN(rec.memory, backend->Adopt(claim, std::move(fd), req.fabric_handle()));
  if (kind == HandleKind::kProcessMemory && !PidfdAlive(s.peer.pidfd.get())) {
    // Opened after the process exited: whatever holds its pid now is not it.
    return absl::UnavailableError("the exporting process exited during the export");
  }
  rec.name = req.name();
  rec.size = req.size();
  rec.gpu_uuid = req.gpu_uuid();
  rec.kind = kind;
  rec.owner_session = s.id;
  rec.owner = s.pod;
  {
    // A session that closed while the backend validated must not leave an
    // orphan export behind: check and insert under the session lock.
    absl::MutexLock l(&s.mu);
    if (s.closed) return absl::UnavailableError("session closed during export");
    PODLINK_ASSIGN_OR_RETURN(uint64_t id, registry_.Add(std::move(rec)));
    exports_total_.fetch_add(1, std::memory_order_relaxed);
    BrokerLog()->info("event=export session={} pod={} export={} name={} size={} kind={} chunks={} offset={}", s.id,
                      s.pod.Ref(), id, req.name(), req.size(), HandleKindName(kind), req.chunks_size(),
                      req.offset());
    v1::ExportResponse resp;
    resp.set_export_id(id);
    return resp;
  }
}

v1::ExportInfo Broker::Describe(const ExportRecord& rec, size_t import_count, uint64_t imports_total,
                                uint64_t caller) const {
  v1::ExportInfo e;
  e.set_export_id(rec.id);
  e.set_name(rec.name);
  e.set_size(rec.size);
  e.set_gpu_uuid(rec.gpu_uuid);
  e.set_handle_type(static_cast<v1::HandleType>(rec.kind));
  e.mutable_owner()->set_namespace_(rec.owner.namespace_);
  e.mutable_owner()->set_name(rec.owner.name);
  for (const PodName& p : rec.allowed_importers) {
    v1::PodRef* r = e.add_allowed_importers();
    r->set_namespace_(p.namespace_);
    r->set_name(p.name);
  }
  e.set_peer_group(rec.owner.PeerGroup());
  e.set_import_count(static_cast<uint32_t>(import_count));
  e.set_owned_by_caller(rec.owner_session == caller);
  if (rec.memory != nullptr) {
    const ChunkLayout layout = rec.memory->Layout();
    for (uint64_t c : layout.sizes) e.add_chunk_sizes(c);
    e.set_offset(layout.offset);
  }
  e.set_imports_total(imports_total);
  return e;
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> Broker::FindAuthorized(const PodInfo& importer, bool by_id,
                                                                           uint64_t id, const std::string& name,
                                                                           const std::string& who) {
  absl::StatusOr<std::shared_ptr<const ExportRecord>> found;
  if (by_id) {
    found = registry_.Get(id);
    if (!found.ok()) return NoSuchExport(id);
  } else {
    size_t slash = name.find('/');
    found = slash == std::string::npos ? registry_.FindByName(importer.namespace_, name)
                                       : registry_.FindByName(name.substr(0, slash), name.substr(slash + 1));
    if (!found.ok()) return NoSuchName(name, importer.namespace_);
  }
  const ExportRecord& rec = **found;
  ExportPolicyView view{rec.id, rec.name, &rec.owner, &rec.allowed_importers};
  const char* reason = "unknown";
  if (absl::Status allowed = CheckImport(view, importer, &reason); !allowed.ok()) {
    denials_total_.fetch_add(1, std::memory_order_relaxed);
    denials_.Inc(reason);
    BrokerLog()->warn("event=deny {} pod={} export={} reason={}", who, importer.Ref(), rec.id, LogQuoted(allowed.message()));
    if (rec.owner.namespace_ != importer.namespace_) {
      // A pod of another namespace learns nothing, not even that the export
      // exists: the answer is the one for an id or name that was never used.
      return by_id ? NoSuchExport(id) : NoSuchName(name, importer.namespace_);
    }
    return allowed;
  }
  return found;
}

absl::StatusOr<v1::ImportResponse> Broker::Import(Session& s, const v1::ImportRequest& req) {
  if (req.target_case() != v1::ImportRequest::kExportId && req.target_case() != v1::ImportRequest::kName) {
    return absl::InvalidArgumentError("import needs export_id or name");
  }
  if (req.target_case() == v1::ImportRequest::kExportId && IsRemoteHandle(req.export_id())) {
    return NoSuchExport(req.export_id());
  }
  PODLINK_ASSIGN_OR_RETURN(
      std::shared_ptr<const ExportRecord> found,
      FindAuthorized(s.pod, req.target_case() == v1::ImportRequest::kExportId, req.export_id(), req.name(),
                     absl::StrCat("session=", s.id)));
  const ExportRecord& rec = *found;
  v1::ImportResponse resp;
  *resp.mutable_export_() = Describe(rec, 0, 0, s.id);
  if (const GpuDevice* g = inventory_.FindByUuid(rec.gpu_uuid)) {
    resp.set_gpu_pci_bus_id(g->pci_bus_id);
    resp.set_gpu_device_node(g->device_node);
  }
  bool new_record = false;
  {
    // Recorded under the session lock so a session closing concurrently can
    // never keep a stale import record.
    absl::MutexLock l(&s.mu);
    if (s.closed) return absl::UnavailableError("session closed during import");
    PODLINK_ASSIGN_OR_RETURN(new_record, registry_.AddImporter(rec.id, s.id));
  }
  if (rec.kind == HandleKind::kFabric) {
    resp.set_fabric_handle(rec.memory->FabricHandle());
  } else if (rec.kind == HandleKind::kProcessMemory) {
    // No descriptor: only this daemon's relay reaches it.
  } else if (const size_t chunks = rec.memory->Layout().sizes.size(); chunks > 0) {
    // One delivery per allocation, in order; any that cannot go undoes the import as below.
    absl::Status sent;
    for (size_t i = 0; i < chunks && sent.ok(); ++i) {
      absl::StatusOr<UniqueFd> dup = rec.memory->DuplicateChunk(i);
      absl::StatusOr<uint64_t> slot = dup.ok() ? Deliver(s, rec.id, dup->get()) : dup.status();
      sent = slot.status();
      if (sent.ok()) resp.add_chunk_delivery_slots(*slot);
    }
    if (!sent.ok()) {
      if (new_record) (void)registry_.DropImport(rec.id, s.id);
      return absl::ResourceExhaustedError(
          absl::StrCat("could not deliver the export's ", chunks,
                       " descriptors: ", sent.message()));
    }
  } else {
    absl::StatusOr<UniqueFd> dup = rec.memory->Duplicate();
    absl::Status sent = dup.status();
    uint64_t slot = 0;
    if (dup.ok()) {
      absl::StatusOr<uint64_t> delivered = Deliver(s, rec.id, dup->get());
      sent = delivered.status();
      if (delivered.ok()) slot = *delivered;
    }
    if (!sent.ok()) {
      // Only the record this call made goes; an earlier import of the same
      // export stays, and the export itself is never touched (even when the
      // caller owns it).
      if (new_record) (void)registry_.DropImport(rec.id, s.id);
      return absl::ResourceExhaustedError(
          absl::StrCat("could not deliver the descriptor: ", sent.message()));
    }
    resp.set_delivery_slot(slot);
  }
  imports_total_.fetch_add(1, std::memory_order_relaxed);
  BrokerLog()->info("event=import session={} pod={} export={} owner={}", s.id, s.pod.Ref(), rec.id,
              rec.owner.Ref());
  return resp;
}

absl::StatusOr<v1::ReleaseResponse> Broker::Release(Session& s, const v1::ReleaseRequest& req) {
  v1::ReleaseResponse::Kind kind = req.kind();
  if (IsRemoteHandle(req.export_id()) && kind != v1::ReleaseResponse::KIND_EXPORT) {
    if (mesh_ == nullptr) return absl::NotFoundError(absl::StrCat("no remote region ", req.export_id()));
    PODLINK_RETURN_IF_ERROR(mesh_->DropHandle(s.id, req.export_id()));
    v1::ReleaseResponse resp;
    resp.set_kind(v1::ReleaseResponse::KIND_IMPORT);
    return resp;
  }
  if (kind == v1::ReleaseResponse::KIND_UNSPECIFIED) {
    // Older clients: the owner withdraws, anyone else drops an import.
    absl::StatusOr<std::shared_ptr<const ExportRecord>> rec = registry_.Get(req.export_id());
    if (!rec.ok()) {
      return absl::NotFoundError(absl::StrCat("nothing to release: export ", req.export_id(),
                                              " does not exist (already released, or its owner exited)"));
    }
    kind = (*rec)->owner_session == s.id ? v1::ReleaseResponse::KIND_EXPORT : v1::ReleaseResponse::KIND_IMPORT;
  }
  v1::ReleaseResponse resp;
  resp.set_kind(kind);
  switch (kind) {
    case v1::ReleaseResponse::KIND_EXPORT: {
      PODLINK_ASSIGN_OR_RETURN(RemovedExport removed, registry_.ReleaseExport(req.export_id(), s.id));
      NotifyGone(removed, absl::StrCat("released by its owner ", s.pod.Ref()));
      BrokerLog()->info("event=release session={} export={} importers={}", s.id, req.export_id(),
                  removed.importers.size());
      return resp;
    }
    case v1::ReleaseResponse::KIND_IMPORT:
      PODLINK_RETURN_IF_ERROR(registry_.DropImport(req.export_id(), s.id));
      return resp;
    default:
      return absl::InvalidArgumentError(absl::StrCat("release kind ", kind, " is not EXPORT or IMPORT"));
  }
}

absl::Status Broker::CheckAdmin(const Session& s) {
  if (s.peer.uid == 0 && !s.peer.cgroup.in_pod() && s.peer.cgroup.container_id.empty()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      "node-wide views need root on the host, outside any container (run kubectl-podlink on the node or "
      "through kubectl exec into the podlinkd pod)");
}

absl::StatusOr<v1::MeshStatus> Broker::GetMeshStatus(const Session& s) const {
  PODLINK_RETURN_IF_ERROR(CheckAdmin(s));
  if (mesh_ == nullptr) {
    v1::MeshStatus off;
    off.set_node_name(options_.node_name);
    return off;
  }
  v1::MeshStatus st = mesh_->Status();
  st.set_remote_pods(remote_pods_ != nullptr ? "apiserver" : "forwarded");
  if (remote_pods_ != nullptr) {
    if (absl::Status ready = remote_pods_->Ready(); !ready.ok()) st.set_remote_pods_problem(std::string(ready.message()));
  }
  return st;
}

absl::StatusOr<v1::Stats> Broker::GetStats(const Session& s) const {
  PODLINK_RETURN_IF_ERROR(CheckAdmin(s));
  BrokerStats st = Stats();
  RelayCounters rc = relay_->Counters();
  v1::Stats out;
  out.set_sessions(st.sessions);
  out.set_exports(st.exports);
  out.set_imports_total(st.imports_total);
  out.set_denials_total(st.denials_total);
  out.set_relay_rings(rc.rings);
  out.set_relay_ops_total(rc.ops);
  out.set_relay_bytes_total(rc.bytes);
  out.set_relay_failed_total(rc.failed);
  out.set_relay_notifies_total(rc.notifies);
  return out;
}

absl::StatusOr<v1::ListResponse> Broker::List(const Session& s, const v1::ListRequest& req) const {
  if (req.all()) PODLINK_RETURN_IF_ERROR(CheckAdmin(s));
  v1::ListResponse resp;
  for (const Registry::Entry& e : registry_.Snapshot()) {
    const ExportRecord& rec = *e.record;
    ExportPolicyView view{rec.id, rec.name, &rec.owner, &rec.allowed_importers};
    if (!req.all() && rec.owner_session != s.id && !CheckImport(view, s.pod).ok()) continue;
    *resp.add_exports() = Describe(rec, e.import_count, e.imports_total, s.id);
  }
  return resp;
}

absl::Status Broker::AddWatcher(Session& s, std::shared_ptr<EventSink> sink) {
  absl::MutexLock l(&s.mu);
  if (s.closed) return absl::UnavailableError("session closed");
  std::erase_if(s.watchers, [](const auto& w) { return w->done(); });
  if (s.watchers.size() >= options_.max_watchers_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat("at most ", options_.max_watchers_per_session,
                                                     " Watch streams per session"));
  }
  sink->Push(MakeEvent(v1::Event::TYPE_READY, 0, "", ""));
  s.watchers.push_back(std::move(sink));
  return absl::OkStatus();
}

absl::StatusOr<v1::OpenRelayResponse> Broker::OpenRelay(Session& s, const v1::OpenRelayRequest& req) {
  PODLINK_ASSIGN_OR_RETURN(UniqueFd ring_fd, TakeOffer(s, req.ring_slot(), "relay ring"));
  PODLINK_ASSIGN_OR_RETURN(UniqueFd doorbell, TakeOffer(s, req.doorbell_slot(), "relay doorbell"));
  PODLINK_ASSIGN_OR_RETURN(RingLayout layout, RingLayout::Make(req.sq_entries(), req.cq_entries(), req.nq_entries(),
                                                                  req.message_slots()));
  char link[64] = {};
  std::string path = absl::StrCat("/proc/self/fd/", doorbell.get());
  ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  if (n <= 0 || std::string(link, n) != "anon_inode:[eventfd]") {
    return absl::InvalidArgumentError("the relay doorbell must be an eventfd");
  }
  // The ring is a sealed memfd like a host export: the daemon maps it and a
  // client must not be able to truncate it under the daemon.
  HostMemfdBackend validator;
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<MemoryObject> ring,
                           validator.Adopt({layout.total, "", HandleKind::kHostMemfd}, std::move(ring_fd), ""));
  {
    // Checked and registered under the session lock: CloseSession marks the
    // session closed under it before removing the ring, so a ring is either
    // registered before that removal or never.
    absl::MutexLock l(&s.mu);
    if (s.closed) return absl::UnavailableError("session closed");
    PODLINK_RETURN_IF_ERROR(relay_->AddRing(s.id, std::move(ring), layout, std::move(doorbell)));
  }
  BrokerLog()->info("event=relay_open session={} pod={} sq={} cq={} nq={} message_slots={}", s.id, s.pod.Ref(),
                    layout.sq_entries, layout.cq_entries, layout.nq_entries, layout.message_slots);
  return v1::OpenRelayResponse();
}

void Broker::OpenRemote(Session& s, const v1::OpenRemoteRequest& req,
                        std::function<void(absl::StatusOr<v1::OpenRemoteResponse>)> done) {
  if (mesh_ == nullptr) {
    return done(absl::FailedPreconditionError(
        "this podlinkd runs without the mesh (mesh.enabled in its config): regions of other nodes cannot be opened"));
  }
  if (req.target_case() != v1::OpenRemoteRequest::kExportId && req.target_case() != v1::OpenRemoteRequest::kName) {
    return done(absl::InvalidArgumentError("OpenRemote needs export_id or name"));
  }
  if (req.addresses_size() == 0 || req.addresses_size() > 64) {
    return done(absl::InvalidArgumentError("OpenRemote needs the owner's mesh addresses (1 to 64)"));
  }
  mesh::RemoteTarget t;
  t.node_name = req.node_name();
  t.addresses.assign(req.addresses().begin(), req.addresses().end());
  t.port = req.mesh_port();
  t.export_id = req.export_id();
  t.name = req.name();
  uint64_t session = s.id;
  mesh_->OpenRemote(session, s.pod, std::move(t),
                    [this, session, node = req.node_name(), done = std::move(done)](
                        absl::StatusOr<mesh::RemoteRegionInfo> info) {
                      if (!info.ok()) return done(info.status());
                      v1::OpenRemoteResponse resp;
                      resp.set_handle(info->handle);
                      v1::ExportInfo* e = resp.mutable_export_();
                      e->set_export_id(info->export_id);
                      e->set_size(info->size);
                      e->set_handle_type(static_cast<v1::HandleType>(info->handle_type));
                      e->mutable_owner()->set_namespace_(info->owner_namespace);
                      e->mutable_owner()->set_name(info->owner_name);
                      BrokerLog()->info("event=open_remote session={} node={} export={} handle={}", session, node,
                                  info->export_id, info->handle);
                      // A session that closed meanwhile must not keep the handle.
                      if (FindSession(session) == nullptr) (void)mesh_->DropHandle(session, info->handle);
                      done(std::move(resp));
                    });
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> Broker::AuthorizeRemote(
    const PodInfo& importer, const podlink::mesh::v1::OpenRegionRequest& req) {
  bool by_id = req.target_case() == podlink::mesh::v1::OpenRegionRequest::kExportId;
  if (!by_id && req.target_case() != podlink::mesh::v1::OpenRegionRequest::kName) {
    return absl::InvalidArgumentError("OpenRegion needs export_id or name");
  }
  PodInfo who = importer;
  if (remote_pods_ != nullptr) {
    absl::StatusOr<KubePod> pod = remote_pods_->Confirm(importer.uid, importer.namespace_, importer.name, importer.node,
                                                        importer.annotations);
    if (!pod.ok()) {
      BrokerLog()->warn("event=remote_pod_refused node={} pod={} uid={} source={} reason={}", LogQuoted(importer.node),
                        LogQuoted(importer.Ref()), LogQuoted(importer.uid), LogQuoted(importer.source),
                        LogQuoted(pod.status().message()));
      denials_total_.fetch_add(1, std::memory_order_relaxed);
      // The other node hears the class alone: the detail (the API server's
      // address and errors, other pods' names) stays in this log.
      return ForPeerNode(pod.status());
    }
    // Policy reads the API server's annotations, not the forwarded ones.
    who.annotations = pod->annotations;
  }
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<const ExportRecord> rec,
                           FindAuthorized(who, by_id, req.export_id(), req.name(), "remote=" + importer.source));
  imports_total_.fetch_add(1, std::memory_order_relaxed);
  return rec;
}

bool Broker::ExportLive(const ExportRecord& rec) const {
  absl::StatusOr<std::shared_ptr<const ExportRecord>> now = registry_.Get(rec.id);
  return now.ok() && now->get() == &rec;
}

absl::Status Broker::NotifyOwner(const ExportRecord& rec, uint64_t value) {
  return relay_->PostNotification(rec.owner_session, rec.id, value, 0);
}

std::string Broker::GpuBusId(const ExportRecord& rec) const {
  if (rec.kind == HandleKind::kHostMemfd) return rec.mesh_affinity;  // the pod's hint, or none
  if (rec.gpu_uuid.empty()) return {};
  const GpuDevice* g = inventory_.FindByUuid(rec.gpu_uuid);
  return g != nullptr ? g->pci_bus_id : std::string();
}

}  // namespace podlink
