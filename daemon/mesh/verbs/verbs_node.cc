// This node's verbs side: its devices, the serving side peers' queue pairs
// land on (made on first use), registering or staging the exports it grants,
// and how its own verbs links to a peer are made, path by path.
#include "daemon/mesh/verbs/verbs_node.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/links/stopping.h"
#include "daemon/mesh/verbs/gid.h"
#include "daemon/mesh/verbs/verbs_api.h"

namespace podlink::mesh::verbs {

namespace pb = podlink::mesh::v1;

namespace {
const ComponentLog VerbsNodeLog("mesh");
}  // namespace

absl::StatusOr<VerbsServer*> VerbsNode::Serving() {
  absl::MutexLock l(&mu_);
  if (stopping_.load(std::memory_order_acquire)) return StoppingStatus();
  if (server_ != nullptr) return server_.get();
  if (!error_.ok()) return error_;
  absl::StatusOr<const VerbsApi*> api = LoadVerbs();
  if (!api.ok()) {
    error_ = api.status();
    return error_;
  }
  if (nics_ == nullptr) nics_ = std::make_unique<Nics>(*api);  // the importing side may have made it
  VerbsOptions vo = options_.verbs;
  vo.slice_bytes = options_.slice_bytes;  // the bounce slots of staged grants
  server_ = std::make_unique<VerbsServer>(nics_.get(), vo, sinks_.notify, sinks_.stage);
  return server_.get();
}

absl::StatusOr<pb::OpenVerbsResponse> VerbsNode::Accept(const std::string& node, const pb::OpenVerbsRequest& req,
                                                        const std::vector<IpPrefix>& advertised) {
  if (node == options_.node_name) {
    return absl::PermissionDeniedError(absl::StrCat("a peer presented this node's own name '", node, "'"));
  }
  PODLINK_ASSIGN_OR_RETURN(IpPrefix asked, IpPrefix::Parse(req.address()));
  const IpPrefix* mine = nullptr;
  for (const IpPrefix& a : advertised) {
    if (a.family == asked.family && a.addr == asked.addr) mine = &a;
  }
  if (mine == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(req.address(), " is not an address this node advertises"));
  }
  if (req.gid().size() != 16) return absl::InvalidArgumentError("a GID is 16 bytes");
  if (req.qps_size() == 0 || req.qps_size() > 16) return absl::InvalidArgumentError("1 to 16 queue pairs per path");
  // Every field checked before a device is opened or the server made for it.
  if (req.replaces_size() > 64) return absl::InvalidArgumentError("at most 64 queue pairs replaced at once");
  PODLINK_ASSIGN_OR_RETURN(VerbsServer * server, Serving());
  SideWire theirs;
  theirs.device = req.device();
  std::memcpy(theirs.gid.data(), req.gid().data(), 16);
  theirs.mtu = req.mtu();
  theirs.records = req.records();
  for (const pb::VerbsQp& q : req.qps()) theirs.qps.push_back(QpWire{q.qpn() & 0xffffff, q.psn() & 0xffffff});
  std::vector<uint32_t> replaces(req.replaces().begin(), req.replaces().end());
  PODLINK_ASSIGN_OR_RETURN(SideWire ours, server->Accept(node, req.link_instance(), *mine, theirs, replaces));
  pb::OpenVerbsResponse resp;
  resp.set_device(ours.device);
  resp.set_gid(std::string(reinterpret_cast<const char*>(ours.gid.data()), 16));
  resp.set_mtu(ours.mtu);
  resp.set_records(ours.records);
  for (const QpWire& q : ours.qps) {
    pb::VerbsQp* out = resp.add_qps();
    out->set_qpn(q.qpn);
    out->set_psn(q.psn);
    out->set_mailbox(q.mailbox);
    out->set_mailbox_rkey(q.mailbox_rkey);
  }
  return resp;
}

absl::Status VerbsNode::Register(const std::string& node, uint64_t grant,
                                const std::shared_ptr<const ExportRecord>& rec, bool over_tcp_ok, bool staged_ok,
                                bool may_register, pb::OpenRegionResponse* resp) {
  // The TCP server needs the mapping too: an export without one is refused.
  PODLINK_ASSIGN_OR_RETURN(RelayView view, rec->memory->MapForRelay());
  absl::StatusOr<std::vector<RegionKey>> keys = absl::UnknownError("not registered");
  if (options_.staged_only) {
    keys = absl::FailedPreconditionError("mesh.verbs_staged_only: no export is registered for peers");
  } else if (!may_register) {
    // A route through relays is sealed: its frames go to the owner's window,
    // never straight into the export (and a fenceable route's writes must
    // land where a fence can stop them).
    keys = absl::FailedPreconditionError("a sealed route's export is staged, never registered for the relay");
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
    absl::StatusOr<VerbsServer*> server = Serving();
    keys = server.ok() ? (*server)->Register(node, grant, rec->memory, reinterpret_cast<char*>(view.address),
                                             rec->size, std::move(dmabuf))
                       : server.status();
  }
  if (!keys.ok() && staged_ok) {
    // Over the importer's queue pairs all the same: each slice goes
    // between the export and this node's bounce pool for that peer, copied
    // here (by the copy engines for GPU memory), the range checked per slice.
    absl::StatusOr<VerbsServer*> server = Serving();
    absl::Status pool = server.ok() ? (*server)->PrepareStaging(node) : server.status();
    if (pool.ok()) {
      grants_staged_.fetch_add(1, std::memory_order_relaxed);
      if (staged_log_.Due()) {
        VerbsNodeLog()->info("event=mesh_grant_staged peer={} export={} gpu={} why=\"{}\" (grants so far: {})",
                             node, rec->id, view.on_gpu, keys.status().message(),
                             grants_staged_.load(std::memory_order_relaxed));
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
      VerbsNodeLog()->warn("event=mesh_grant_over_tcp peer={} export={} gpu={} why=\"{}\" (grants so far: {})",
                           node, rec->id, view.on_gpu, keys.status().message(),
                           grants_over_tcp_.load(std::memory_order_relaxed));
    }
    resp->set_over_tcp_reason(std::string(keys.status().message()));
    return absl::OkStatus();
  }
  for (const RegionKey& k : *keys) {
    pb::VerbsKey* out = resp->add_verbs_keys();
    out->set_device(k.device);
    out->set_rkey(k.rkey);
    out->set_base(k.base);
  }
  return absl::OkStatus();
}

void VerbsNode::Sweep(const std::function<bool(uint64_t grant)>& granted,
                      const std::function<void(const std::string& node, uint64_t grant)>& check) {
  std::vector<std::pair<uint64_t, std::string>> regs;
  {
    absl::MutexLock l(&mu_);
    if (server_ == nullptr) return;
    regs = server_->RegisteredGrants();
  }
  for (const auto& [grant, node] : regs) {
    if (!granted(grant)) {
      Unregister(node, grant);
      continue;
    }
    check(node, grant);  // closes the grant, and so the registration, when the export is gone
  }
}

void VerbsNode::Unregister(const std::string& node, uint64_t grant) {
  absl::MutexLock l(&mu_);
  if (server_ != nullptr) server_->Unregister(grant, node);
}

absl::StatusOr<uint64_t> VerbsNode::PrepareStaging(const std::string& caller) {
  PODLINK_ASSIGN_OR_RETURN(VerbsServer * server, Serving());
  PODLINK_RETURN_IF_ERROR(server->PrepareStaging(caller));
  return server->stage_slot_bytes();
}

void VerbsNode::Stop() {
  std::unique_ptr<VerbsServer> server;
  {
    absl::MutexLock l(&mu_);
    server.swap(server_);
  }
  server.reset();
}

VerbsNode::ServerCounts VerbsNode::server_counts() const {
  absl::MutexLock l(&mu_);
  ServerCounts c;
  if (server_ == nullptr) return c;
  c.serving = true;
  c.qps = server_->qps();
  c.registrations = server_->registrations();
  c.notifies = server_->notifies();
  c.staged_slices = server_->staged_slices();
  c.staged_refused = server_->staged_refused();
  c.staged_late_dropped = server_->staged_late_dropped();
  c.staged_done = server_->staged_done();
  return c;
}

absl::StatusOr<std::shared_ptr<VerbsLinks>> VerbsNode::Connect(const std::string& node, const std::vector<Path>& paths,
                                                               const OpenVerbsCall& open) {
  PODLINK_ASSIGN_OR_RETURN(const VerbsApi* api, LoadVerbs());
  {
    // The NIC table ConnectPath opens devices from, made once.
    absl::MutexLock l(&mu_);
    if (nics_ == nullptr) nics_ = std::make_unique<Nics>(api);
  }
  VerbsOptions vo = options_.verbs;
  vo.qps_per_path = options_.qps_per_path;
  vo.slice_bytes = options_.slice_bytes;
  vo.slices_in_flight = options_.slices_in_flight;
  vo.answer_timeout = options_.answer_timeout;
  auto links = std::make_shared<VerbsLinks>(node, vo);
  absl::Status last;
  for (const Path& path : paths) {
    absl::Status st = ConnectPath(*links, path, open, {});
    if (!st.ok()) {
      VerbsNodeLog()->warn("event=verbs_path_failed node={} path={} why=\"{}\"", node, PathName(path), st.message());
      last = st;
    }
  }
  if (links->live() == 0) {
    return absl::UnavailableError(absl::StrCat("no verbs path to node ", node, " came up: ", last.message()));
  }
  return links;
}

absl::Status VerbsNode::ConnectPath(VerbsLinks& links, const Path& path, const OpenVerbsCall& open,
                                   const std::vector<uint32_t>& replaces) {
  if (path.fallback) return absl::FailedPreconditionError("a routed (fallback) path has no RDMA device");
  Nics* nics = nullptr;
  {
    absl::MutexLock l(&mu_);
    nics = nics_.get();
  }
  if (nics == nullptr) return absl::FailedPreconditionError("verbs not loaded");
  const VerbsOptions& vo = options_.verbs;
  PODLINK_ASSIGN_OR_RETURN(GidChoice gid, ChooseGid(vo.sysfs, path.local, vo.gid_index));
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<Nic> nic, nics->Get(gid));
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
  for (const QpWire& q : prepared.second.qps) {
    pb::VerbsQp* out = req.add_qps();
    out->set_qpn(q.qpn);
    out->set_psn(q.psn);
  }
  PODLINK_ASSIGN_OR_RETURN(pb::OpenVerbsResponse resp, open(req));
  if (resp.gid().size() != 16) return absl::InternalError("the owner's GID is not 16 bytes");
  SideWire owner;
  owner.device = resp.device();
  std::memcpy(owner.gid.data(), resp.gid().data(), 16);
  owner.mtu = resp.mtu();
  owner.records = resp.records();
  for (const pb::VerbsQp& q : resp.qps()) {
    owner.qps.push_back(QpWire{q.qpn() & 0xffffff, q.psn() & 0xffffff, q.mailbox(), q.mailbox_rkey()});
  }
  return links.ConnectPath(prepared.first, owner);
}

}  // namespace podlink::mesh::verbs
