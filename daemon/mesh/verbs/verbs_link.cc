#include "daemon/mesh/verbs/verbs_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/gpu/memory_object.h"

namespace podlink::mesh::verbs {
namespace {

const ComponentLog Log("mesh");

// Notifications a lane has in flight, and the owner's mailbox slots per QP
// (twice as many, so a slot is rewritten only after the owner read it: the
// owner reposts a receive only after reading its slot, and a sender with
// kNotifyDepth unacknowledged writes has had kNotifyDepth consumed).
constexpr uint32_t kNotifyDepth = 16;
constexpr uint32_t kMailboxSlots = 2 * kNotifyDepth;
constexpr uint32_t kNotifyBytes = 16;  // {grant, value}, little endian

uint32_t RandomPsn() {
  static thread_local std::mt19937 rng{std::random_device{}()};
  return rng() & 0xffffff;
}

uint64_t RandomInstance() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;
}

absl::Status Errno(const char* what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

std::string Gid(const std::array<uint8_t, 16>& g) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, g.data(), buf, sizeof buf);
  return buf;
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

ibv_qp* CreateRcQp(const VerbsApi* api, ibv_pd* pd, ibv_cq* cq, uint32_t max_send, uint32_t max_recv) {
  ibv_qp_init_attr a{};
  a.send_cq = cq;
  a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = max_send;
  a.cap.max_recv_wr = max_recv;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  a.sq_sig_all = 0;
  return api->create_qp(pd, &a);
}

absl::Status ToInit(const VerbsApi* api, ibv_qp* qp, uint8_t port, int access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qp_access_flags = access;
  if (int rc = api->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return Errno("ibv_modify_qp(INIT)", rc);
  }
  return absl::OkStatus();
}

struct ConnectArgs {
  uint8_t port = 1;
  int gid_index = 0;
  std::array<uint8_t, 16> remote_gid{};
  uint32_t remote_qpn = 0, remote_psn = 0, local_psn = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  uint8_t timeout = 14, retry = 7;
};

absl::Status ToRts(const VerbsApi* api, ibv_qp* qp, const ConnectArgs& c) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = c.mtu;
  a.dest_qp_num = c.remote_qpn;
  a.rq_psn = c.remote_psn;
  a.max_dest_rd_atomic = 8;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, c.remote_gid.data(), 16);
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(c.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = c.port;
  if (int rc = api->modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return Errno("ibv_modify_qp(RTR)", rc);
  }
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = c.timeout;
  r.retry_cnt = c.retry;
  r.rnr_retry = 7;  // a notification waits for the owner to repost a receive
  r.sq_psn = c.local_psn;
  r.max_rd_atomic = 8;
  if (int rc = api->modify_qp(qp, &r,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC)) {
    return Errno("ibv_modify_qp(RTS)", rc);
  }
  return absl::OkStatus();
}

void ToError(const VerbsApi* api, ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  (void)api->modify_qp(qp, &a, IBV_QP_STATE);
}

ibv_mtu MtuOf(uint32_t v) {
  return v >= IBV_MTU_256 && v <= IBV_MTU_4096 ? static_cast<ibv_mtu>(v) : IBV_MTU_1024;
}

// A completion channel's pending events, without blocking: the channel's fd
// is non-blocking and polled with a timeout so threads can stop.
bool WaitEvent(const VerbsApi* api, ibv_comp_channel* ch, ibv_cq* cq, const std::atomic<bool>& stop) {
  pollfd p{ch->fd, POLLIN, 0};
  if (::poll(&p, 1, 200) <= 0) return !stop.load(std::memory_order_acquire);
  ibv_cq* got = nullptr;
  void* ctx = nullptr;
  while (api->get_cq_event(ch, &got, &ctx) == 0) api->ack_cq_events(got, 1);
  api->req_notify_cq(cq, 0);
  return !stop.load(std::memory_order_acquire);
}

}  // namespace

// --- devices -----------------------------------------------------------------

Nic::Nic(const VerbsApi* api, ibv_context* ctx, std::string name, uint8_t port, ibv_mtu mtu, bool dmabuf)
    : api_(api), ctx_(ctx), name_(std::move(name)), port_(port), mtu_(mtu), dmabuf_(dmabuf) {
  SetNonBlocking(ctx_->async_fd);
  async_ = std::thread([this] { AsyncLoop(); });
}

Nic::~Nic() {
  stop_.store(true, std::memory_order_release);
  if (async_.joinable()) async_.join();
  api_->close_device(ctx_);
}

absl::StatusOr<std::shared_ptr<Nic>> Nic::Open(const VerbsApi* api, const std::string& device, uint8_t port) {
  int n = 0;
  ibv_device** list = api->get_device_list(&n);
  if (list == nullptr) return Errno("ibv_get_device_list", errno);
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && ctx == nullptr; ++i) {
    if (device == api->get_device_name(list[i])) ctx = api->open_device(list[i]);
  }
  api->free_device_list(list);
  if (ctx == nullptr) {
    return absl::NotFoundError(absl::StrCat("RDMA device ", device, " cannot be opened (libibverbs lists ", n,
                                            " devices; is its provider installed?)"));
  }
  ibv_port_attr pa{};
  if (int rc = api->query_port(ctx, port, &pa)) {
    api->close_device(ctx);
    return Errno("ibv_query_port", rc);
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    api->close_device(ctx);
    return absl::UnavailableError(absl::StrCat("port ", int{port}, " of ", device, " is not active"));
  }
  bool dmabuf = false;
  if (api->reg_dmabuf_mr != nullptr) {
    ibv_pd* pd = api->alloc_pd(ctx);
    if (pd != nullptr) {
      errno = 0;
      ibv_mr* mr = api->reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
      dmabuf = errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
      if (mr != nullptr) api->dereg_mr(mr);
      api->dealloc_pd(pd);
    }
  }
  Log()->info("event=verbs_device device={} port={} mtu={} link_layer={} dmabuf={}", device, int{port},
              128 << pa.active_mtu, pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "ethernet" : "infiniband",
              api->reg_dmabuf_mr == nullptr ? "no (libibverbs lacks ibv_reg_dmabuf_mr)" : dmabuf ? "yes" : "no");
  return std::shared_ptr<Nic>(new Nic(api, ctx, device, port, pa.active_mtu, dmabuf));
}

void Nic::AsyncLoop() {
  while (!stop_.load(std::memory_order_acquire)) {
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    ibv_async_event ev{};
    while (api_->get_async_event(ctx_, &ev) == 0) {
      async_events_.fetch_add(1, std::memory_order_relaxed);
      // QP errors also surface as failed completions, where they are
      // handled; a port going down fails every QP on it the same way.
      Log()->warn("event=verbs_async device={} type={}", name_, api_->event_type_str(ev.event_type));
      api_->ack_async_event(&ev);
    }
  }
}

absl::StatusOr<std::shared_ptr<Nic>> Nics::Get(const GidChoice& gid) {
  absl::MutexLock l(&mu_);
  auto it = nics_.find(gid.device);
  if (it != nics_.end()) return it->second;
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<Nic> nic, Nic::Open(api_, gid.device, gid.port));
  nics_[gid.device] = nic;
  return nic;
}

// --- importing side ------------------------------------------------------------

struct VerbsLinks::OpState {
  LinkOp op;
  // Set before its slices are queued, read-only after: the local memory's
  // registration per path (none: every slice is copied through staging).
  std::vector<std::pair<const Path*, std::shared_ptr<LocalReg>>> regs;
  uint32_t LkeyFor(const Path* p) const {
    for (const auto& [path, reg] : regs) {
      if (path == p && reg->mr != nullptr) return reg->mr->lkey;
    }
    return 0;
  }
  uint64_t slices = 0;  // how many it was cut into
  std::atomic<uint64_t> remaining{0};
  absl::Mutex mu;
  absl::Status first_error ABSL_GUARDED_BY(mu);
};

VerbsLinks::LocalReg::~LocalReg() {
  if (mr != nullptr) api->dereg_mr(mr);
}

VerbsLinks::VerbsLinks(std::string node, VerbsOptions options)
    : node_(std::move(node)), options_(std::move(options)), instance_(RandomInstance()) {}

VerbsLinks::~VerbsLinks() {
  stop_.store(true, std::memory_order_release);
  std::vector<std::unique_ptr<Path>> paths;
  std::vector<Slice> left;
  {
    absl::MutexLock l(&mu_);
    paths.swap(paths_);
    for (auto& p : paths) {
      for (auto& lane : p->lanes) {
        for (auto& [id, pend] : lane->pending) left.push_back(pend.slice);
        lane->pending.clear();
      }
    }
    left.insert(left.end(), queue_.begin(), queue_.end());
    queue_.clear();
  }
  for (auto& p : paths) {
    if (p->poller.joinable()) p->poller.join();
  }
  // No DMA after this: the QPs go (their posted requests with them) before
  // an op is reported failed, and before the local registrations their
  // requests name are dropped.
  for (auto& p : paths) {
    for (auto& lane : p->lanes) {
      if (lane->qp == nullptr) continue;
      ToError(p->nic->api(), lane->qp);
      p->nic->api()->destroy_qp(lane->qp);
      lane->qp = nullptr;
    }
  }
  for (const Slice& s : left) Finish(s, absl::UnavailableError("verbs link to node " + node_ + " closed"));
  // Local registrations live in the paths' protection domains: they go
  // before those (the slices just finished held the last references besides
  // the cache's).
  left.clear();
  {
    absl::MutexLock l(&reg_mu_);
    local_regs_.clear();
  }
  for (auto& p : paths) DestroyPath(*p);
}

void VerbsLinks::DestroyPath(Path& p) {
  const VerbsApi* api = p.nic->api();
  for (auto& lane : p.lanes) {
    if (lane->qp != nullptr) api->destroy_qp(lane->qp);
    if (lane->mr != nullptr) api->dereg_mr(lane->mr);
    std::free(lane->staging);
  }
  p.lanes.clear();
  if (p.cq != nullptr) api->destroy_cq(p.cq);
  if (p.channel != nullptr) api->destroy_comp_channel(p.channel);
  if (p.pd != nullptr) api->dealloc_pd(p.pd);
}

absl::StatusOr<std::pair<size_t, SideWire>> VerbsLinks::PreparePath(std::shared_ptr<Nic> nic, const GidChoice& gid,
                                                                    std::string name, uint32_t lane_count) {
  {
    absl::MutexLock l(&mu_);
    if (paths_.size() >= kMaxPaths) {
      return absl::ResourceExhaustedError(absl::StrCat("verbs link set to node ", node_, " made ", kMaxPaths,
                                                       " paths already (repairs included)"));
    }
  }
  const VerbsApi* api = nic->api();
  auto path = std::make_unique<Path>();
  path->name = std::move(name);
  path->nic = nic;
  path->gid = gid;
  auto fail = [&](absl::Status st) {
    DestroyPath(*path);
    return st;
  };
  const uint32_t slots = options_.slices_in_flight;
  const uint32_t lanes = std::max<uint32_t>(1, lane_count != 0 ? std::min(lane_count, options_.qps_per_path * 4)
                                                                : options_.qps_per_path);
  path->pd = api->alloc_pd(nic->ctx());
  if (path->pd == nullptr) return fail(Errno("ibv_alloc_pd", errno));
  path->channel = api->create_comp_channel(nic->ctx());
  if (path->channel == nullptr) return fail(Errno("ibv_create_comp_channel", errno));
  SetNonBlocking(path->channel->fd);
  path->cq = api->create_cq(nic->ctx(), static_cast<int>(lanes * (slots + kNotifyDepth) + 8), nullptr,
                            path->channel, 0);
  if (path->cq == nullptr) return fail(Errno("ibv_create_cq", errno));
  api->req_notify_cq(path->cq, 0);
  SideWire out;
  out.device = nic->name();
  out.gid = gid.gid;
  out.mtu = nic->active_mtu();
  const size_t bytes = static_cast<size_t>(slots) * options_.slice_bytes + kNotifyDepth * kNotifyBytes;
  for (uint32_t i = 0; i < lanes; ++i) {
    auto lane = std::make_unique<Lane>();
    lane->path = path.get();
    lane->staging = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    if (lane->staging == nullptr) return fail(absl::ResourceExhaustedError("no memory for verbs staging"));
    // Only this daemon's HCA writes here (RDMA READ results): no remote access.
    lane->mr = api->reg_mr(path->pd, lane->staging, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (lane->mr == nullptr) return fail(Errno("ibv_reg_mr(staging)", errno));
    lane->qp = CreateRcQp(api, path->pd, path->cq, slots + kNotifyDepth, 1);
    if (lane->qp == nullptr) return fail(Errno("ibv_create_qp", errno));
    if (absl::Status st = ToInit(api, lane->qp, gid.port, 0); !st.ok()) return fail(st);
    for (uint32_t s = 0; s < slots; ++s) lane->free_slots.push_back(s);
    lane->remote.psn = RandomPsn();
    out.qps.push_back(QpWire{lane->qp->qp_num, lane->remote.psn, 0, 0});
    path->lanes.push_back(std::move(lane));
  }
  absl::MutexLock l(&mu_);
  paths_.push_back(std::move(path));
  return std::make_pair(paths_.size() - 1, std::move(out));
}

absl::Status VerbsLinks::ConnectPath(size_t index, const SideWire& owner) {
  Path* path = nullptr;
  {
    absl::MutexLock l(&mu_);
    if (index >= paths_.size()) return absl::InvalidArgumentError("no such verbs path");
    path = paths_[index].get();
  }
  if (owner.qps.size() != path->lanes.size()) {
    return absl::InternalError(absl::StrCat("node ", node_, " answered ", owner.qps.size(), " queue pairs for ",
                                            path->lanes.size()));
  }
  const VerbsApi* api = path->nic->api();
  for (size_t i = 0; i < path->lanes.size(); ++i) {
    Lane& lane = *path->lanes[i];
    ConnectArgs c;
    c.port = path->gid.port;
    c.gid_index = path->gid.index;
    c.remote_gid = owner.gid;
    c.remote_qpn = owner.qps[i].qpn;
    c.remote_psn = owner.qps[i].psn;
    c.local_psn = lane.remote.psn;
    c.mtu = std::min(path->nic->active_mtu(), MtuOf(owner.mtu));
    c.timeout = options_.timeout;
    c.retry = options_.retry_count;
    PODLINK_RETURN_IF_ERROR(ToRts(api, lane.qp, c));
    absl::MutexLock l(&mu_);
    lane.remote = owner.qps[i];
    lane.up = true;
    ++stats_.connections_up;
  }
  path->remote_device = owner.device;
  path->poller = std::thread([this, path] { PollLoop(path); });
  Log()->info("event=verbs_path_up node={} path={} device={} gid={} remote_device={} remote_gid={} qps={}", node_,
              path->name, path->nic->name(), Gid(path->gid.gid), owner.device, Gid(owner.gid), path->lanes.size());
  Pump();
  return absl::OkStatus();
}

void VerbsLinks::AddRegion(uint64_t grant, std::vector<RegionKey> keys) {
  absl::MutexLock l(&mu_);
  regions_[grant] = std::move(keys);
}

void VerbsLinks::DropRegion(uint64_t grant) {
  absl::MutexLock l(&mu_);
  regions_.erase(grant);
}

std::vector<uint32_t> VerbsLinks::FailedRemoteQps(const std::string& name) const {
  absl::MutexLock l(&mu_);
  std::vector<uint32_t> out;
  for (const auto& p : paths_) {
    if (p->name != name) continue;
    for (const auto& lane : p->lanes) {
      if (lane->dead && lane->up && !lane->reported) out.push_back(lane->remote.qpn);
    }
  }
  return out;
}

void VerbsLinks::MarkReported(const std::vector<uint32_t>& remote_qps) {
  absl::MutexLock l(&mu_);
  for (auto& p : paths_) {
    for (auto& lane : p->lanes) {
      if (lane->dead && std::find(remote_qps.begin(), remote_qps.end(), lane->remote.qpn) != remote_qps.end()) {
        lane->reported = true;
      }
    }
  }
}

size_t VerbsLinks::live() const {
  absl::MutexLock l(&mu_);
  return stats_.connections_up;
}

LinkStats VerbsLinks::Stats() const {
  LinkStats out;
  {
    absl::MutexLock l(&mu_);
    out = stats_;
  }
  absl::MutexLock l(&reg_mu_);
  for (const auto& [key, reg] : local_regs_) out.local_registrations += reg->mr != nullptr;
  return out;
}

std::vector<std::tuple<std::string, bool, uint64_t>> VerbsLinks::Connections() const {
  absl::MutexLock l(&mu_);
  std::vector<std::tuple<std::string, bool, uint64_t>> out;
  for (const auto& p : paths_) {
    for (const auto& lane : p->lanes) {
      if (lane->reported) continue;  // replaced by a repair
      out.emplace_back(p->name + " qp " + std::to_string(lane->qp->qp_num), lane->up && !lane->dead, lane->bytes_sent);
    }
  }
  return out;
}

std::vector<std::pair<const VerbsLinks::Path*, std::shared_ptr<VerbsLinks::LocalReg>>> VerbsLinks::LocalRegs(
    const LinkOp& op) {
  std::vector<std::pair<const Path*, std::shared_ptr<LocalReg>>> out;
  if (op.type == FrameType::kNotify || op.local_memory == nullptr || op.keep == nullptr || op.local_base == nullptr ||
      op.local < op.local_base || op.length > op.local_size ||
      static_cast<uint64_t>(op.local - op.local_base) > op.local_size - op.length) {
    return out;
  }
  std::vector<Path*> paths;
  {
    absl::MutexLock l(&mu_);
    std::set<std::string> up;
    std::vector<Path*> live;
    for (auto& p : paths_) {
      for (auto& lane : p->lanes) {
        if (lane->up && !lane->dead) {
          up.insert(p->name);
          live.push_back(p.get());
          break;
        }
      }
    }
    // Only where the op's slices may go (nic_rank.h): registering pins, and
    // a path the op will not use need not hold the export.
    const bool single = op.length <= options_.slice_bytes;
    for (Path* p : live) {
      if (MayUse(op.prefer.get(), single, p->name, up)) paths.push_back(p);
    }
  }
  for (Path* p : paths) {
    const auto key = std::make_pair(static_cast<const Path*>(p), static_cast<const MemoryObject*>(op.local_memory.get()));
    std::shared_ptr<LocalReg> reg;
    {
      absl::MutexLock l(&reg_mu_);
      if (auto it = local_regs_.find(key); it != local_regs_.end()) {
        it->second->last_use = ++reg_clock_;
        it->second->owner = op.keep;
        // Being registered by another op, or refused: this op is staged.
        if (it->second->mr != nullptr) out.emplace_back(p, it->second);
        continue;
      }
      if (local_regs_.size() >= kMaxLocalRegistrations) {
        // Room first: the least recently used entry no slice holds.
        auto victim = local_regs_.end();
        for (auto v = local_regs_.begin(); v != local_regs_.end(); ++v) {
          if (v->second.use_count() == 1 && !v->second->registering &&
              (victim == local_regs_.end() || v->second->last_use < victim->second->last_use)) {
            victim = v;
          }
        }
        if (victim == local_regs_.end()) continue;  // every one busy: staged
        local_regs_.erase(victim);
      }
      reg = std::make_shared<LocalReg>();
      reg->api = p->nic->api();
      reg->memory = op.local_memory;
      reg->owner = op.keep;
      reg->registering = true;
      reg->last_use = ++reg_clock_;
      local_regs_.emplace(key, reg);
    }
    // Outside the lock (registering pins every page of the export: long for
    // a large one; metrics and the sweep go on meanwhile). Registration pins:
    // a range with holes would be faulted in at podlinkd's expense (the
    // owner's side refuses it too), so it is staged and asked again later.
    ibv_mr* mr = nullptr;
    const bool populated = op.local_memory->CheckPopulated(0, op.local_size).ok();
    int err = 0;
    if (populated) {
      // Local access only (RDMA READ results land here): no peer can reach
      // this memory through it.
      mr = reg->api->reg_mr(p->pd, op.local_base, op.local_size, IBV_ACCESS_LOCAL_WRITE);
      err = errno;
    }
    absl::MutexLock l(&reg_mu_);
    reg->registering = false;
    reg->mr = mr;
    if (!populated) {
      if (auto it = local_regs_.find(key); it != local_regs_.end() && it->second == reg) local_regs_.erase(it);
      continue;
    }
    if (mr == nullptr) {  // kept as refused until the export goes
      Log()->info("event=verbs_local_registration_failed node={} path={} bytes={} error=\"{}\" msg=\"copied "
                  "through staging\"",
                  node_, p->name, op.local_size, std::strerror(err));
      continue;
    }
    out.emplace_back(p, reg);
  }
  return out;
}

void VerbsLinks::Sweep() {
  absl::MutexLock l(&reg_mu_);
  for (auto it = local_regs_.begin(); it != local_regs_.end();) {
    // Its export is gone (whichever peers' link sets registered it too) and
    // no slice is using the registration.
    if (it->second->owner.expired() && it->second.use_count() == 1 && !it->second->registering) {
      it = local_regs_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status VerbsLinks::Submit(LinkOp op) {
  auto st = std::make_shared<OpState>();
  const uint64_t n = op.type == FrameType::kNotify ? 1 : (op.length + options_.slice_bytes - 1) / options_.slice_bytes;
  if (n == 0) return absl::InvalidArgumentError("length must be > 0");
  st->remaining.store(n, std::memory_order_relaxed);
  st->slices = n;
  st->regs = LocalRegs(op);
  st->op = std::move(op);
  {
    absl::MutexLock l(&mu_);
    if (stats_.connections_up == 0) {
      return absl::UnavailableError(absl::StrCat("no verbs queue pair to node ", node_, " is up"));
    }
    if (st->op.type != FrameType::kNotify && !regions_.contains(st->op.grant)) {
      return absl::FailedPreconditionError("the remote region has no verbs registration");
    }
    for (uint64_t i = 0; i < n; ++i) {
      Slice s;
      s.op = st;
      s.offset = i * options_.slice_bytes;
      s.length = st->op.type == FrameType::kNotify ? 0 : std::min(options_.slice_bytes, st->op.length - s.offset);
      queue_.push_back(std::move(s));
    }
  }
  Pump();
  return absl::OkStatus();
}

void VerbsLinks::Pump() {
  struct Ready {
    Post post;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t mailbox_slot;
  };
  std::vector<Ready> ready;
  std::vector<std::pair<Slice, absl::Status>> failed;
  {
    absl::MutexLock l(&mu_);
    std::vector<Lane*> lanes;
    for (auto& p : paths_) {
      for (auto& lane : p->lanes) {
        if (lane->up && !lane->dead) lanes.push_back(lane.get());
      }
    }
    std::set<std::string> up;  // the paths with a QP up, once a slice has a preference
    // Near the front only: a slice whose preferred paths (nic_rank.h) have
    // no room waits for them while later ones go.
    constexpr size_t kScan = 256;
    size_t scanned = 0;
    for (auto it = queue_.begin(); it != queue_.end() && !lanes.empty() && scanned < kScan;) {
      Slice& s = *it;
      const bool notify = s.op->op.type == FrameType::kNotify;
      // The lane with the most room takes the slice (faster lanes drain
      // their slots sooner, so they take more: striping by pull).
      Lane* best = nullptr;
      size_t room = 0;
      bool restricted = false;
      for (size_t k = 0; k < lanes.size(); ++k) {
        Lane* lane = lanes[(next_lane_ + k) % lanes.size()];
        if (s.op->op.prefer != nullptr && up.empty()) {
          for (Lane* l : lanes) up.insert(l->path->name);
        }
        if (!MayUse(s.op->op.prefer.get(), s.op->slices == 1, lane->path->name, up)) {
          restricted = true;
          continue;
        }
        size_t r = 0;
        if (notify) {
          size_t out = 0;
          for (const auto& [id, pend] : lane->pending) out += pend.slot >= options_.slices_in_flight;
          r = kNotifyDepth - out;
        } else {
          r = lane->free_slots.size();
        }
        if (r > room) {
          room = r;
          best = lane;
        }
      }
      if (best == nullptr) {
        if (!restricted) break;  // no lane has room
        ++it;
        ++scanned;
        continue;
      }
      next_lane_ = (next_lane_ + 1) % lanes.size();
      Ready r{};
      r.post.lane = best;
      r.post.wr_id = next_wr_++;
      if (notify) {
        r.post.slot = options_.slices_in_flight + best->notify_next % kNotifyDepth;
        r.mailbox_slot = best->notify_next % kMailboxSlots;
        ++best->notify_next;
        r.remote_addr = best->remote.mailbox + uint64_t{r.mailbox_slot} * kNotifyBytes;
        r.rkey = best->remote.mailbox_rkey;
      } else {
        auto keys = regions_.find(s.op->op.grant);
        const RegionKey* key = nullptr;
        if (keys != regions_.end()) {
          for (const RegionKey& k : keys->second) {
            if (k.device == best->path->remote_device) key = &k;
          }
        }
        if (key == nullptr) {
          failed.emplace_back(std::move(s), absl::FailedPreconditionError(absl::StrCat(
                                                "the remote region is not registered on device ",
                                                best->path->remote_device, " of node ", node_)));
          it = queue_.erase(it);
          continue;
        }
        r.post.slot = best->free_slots.back();
        best->free_slots.pop_back();
        r.remote_addr = key->base + s.op->op.offset + s.offset;
        r.rkey = key->rkey;
        r.post.lkey = s.op->LkeyFor(best->path);
      }
      r.post.slice = std::move(s);
      it = queue_.erase(it);
      best->pending[r.post.wr_id] = Pending{r.post.slice, r.post.slot, r.post.lkey != 0};
      if (r.post.lkey != 0) ++stats_.zero_copy_slices;
      ready.push_back(std::move(r));
    }
  }
  for (auto& [s, st] : failed) Finish(s, st);
  for (const Ready& r : ready) {
    Lane& lane = *r.post.lane;
    const LinkOp& op = r.post.slice.op->op;
    char* slot = lane.staging + uint64_t{r.post.slot} * options_.slice_bytes;
    if (r.post.slot >= options_.slices_in_flight) {
      slot = lane.staging + uint64_t{options_.slices_in_flight} * options_.slice_bytes +
             uint64_t{r.post.slot - options_.slices_in_flight} * kNotifyBytes;
    }
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(slot);
    sge.lkey = lane.mr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = r.post.wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = r.remote_addr;
    wr.wr.rdma.rkey = r.rkey;
    if (r.post.lkey != 0) {  // straight from / into the local export
      sge.addr = reinterpret_cast<uintptr_t>(op.local + r.post.slice.offset);
      sge.lkey = r.post.lkey;
    }
    switch (op.type) {
      case FrameType::kWrite:
        if (r.post.lkey == 0) std::memcpy(slot, op.local + r.post.slice.offset, r.post.slice.length);
        sge.length = static_cast<uint32_t>(r.post.slice.length);
        wr.opcode = IBV_WR_RDMA_WRITE;
        break;
      case FrameType::kRead:
        sge.length = static_cast<uint32_t>(r.post.slice.length);
        wr.opcode = IBV_WR_RDMA_READ;
        break;
      default: {
        uint64_t words[2] = {op.grant, op.offset};
        std::memcpy(slot, words, kNotifyBytes);
        sge.length = kNotifyBytes;
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.imm_data = htonl(r.mailbox_slot);
        break;
      }
    }
    ibv_send_wr* bad = nullptr;
    if (int rc = lane.path->nic->api()->post_send(lane.qp, &wr, &bad)) {
      Fail(&lane, r.post.wr_id, Errno("ibv_post_send", rc));
    }
  }
}

void VerbsLinks::PollLoop(Path* path) {
  const VerbsApi* api = path->nic->api();
  ibv_wc wcs[32];
  while (WaitEvent(api, path->channel, path->cq, stop_)) {
    for (;;) {
      int n = api->poll_cq(path->cq, 32, wcs);
      if (n <= 0) break;
      for (int i = 0; i < n; ++i) {
        const ibv_wc& wc = wcs[i];
        Lane* lane = nullptr;
        {
          absl::MutexLock l(&mu_);
          for (auto& ln : path->lanes) {
            if (ln->qp->qp_num == wc.qp_num) lane = ln.get();
          }
        }
        if (lane == nullptr) continue;
        if (wc.status != IBV_WC_SUCCESS) {
          Fail(lane, wc.wr_id,
               absl::UnavailableError(absl::StrCat("verbs ", api->wc_status_str(wc.status), " (vendor error ",
                                                   wc.vendor_err, ") on path ", path->name, " to node ", node_)));
          continue;
        }
        Pending pend;
        {
          absl::MutexLock l(&mu_);
          auto it = lane->pending.find(wc.wr_id);
          if (it == lane->pending.end()) continue;
          pend = std::move(it->second);
          lane->pending.erase(it);
        }
        const LinkOp& op = pend.slice.op->op;
        if (op.type == FrameType::kRead && !pend.direct) {
          std::memcpy(op.local + pend.slice.offset, lane->staging + uint64_t{pend.slot} * options_.slice_bytes,
                      pend.slice.length);
        }
        {
          absl::MutexLock l(&mu_);
          if (pend.slot < options_.slices_in_flight) lane->free_slots.push_back(pend.slot);
          ++stats_.slices;
          if (op.type == FrameType::kWrite) {
            stats_.bytes_sent += pend.slice.length;
            lane->bytes_sent += pend.slice.length;
          } else if (op.type == FrameType::kRead) {
            stats_.bytes_received += pend.slice.length;
          }
        }
        Finish(pend.slice, absl::OkStatus());
      }
      Pump();
    }
  }
}

void VerbsLinks::Fail(Lane* lane, uint64_t wr_id, const absl::Status& why) {
  std::vector<std::pair<Slice, absl::Status>> finish;
  bool newly_dead = false;
  {
    absl::MutexLock l(&mu_);
    if (!lane->dead) {
      lane->dead = true;
      newly_dead = true;
      if (lane->up) --stats_.connections_up;
      ++stats_.connection_failures;
      Log()->warn("event=verbs_qp_failed node={} path={} qp={} why=\"{}\" left={}", node_, lane->path->name,
                  lane->qp->qp_num, why.message(), stats_.connections_up);
    }
    auto it = lane->pending.find(wr_id);
    if (it != lane->pending.end()) {
      Slice s = std::move(it->second.slice);
      lane->pending.erase(it);
      if (s.op->op.type == FrameType::kNotify) {
        // It may have arrived: never sent twice.
        finish.emplace_back(std::move(s), why);
      } else if (++s.attempts < kMaxAttempts && stats_.connections_up > 0) {
        ++stats_.resent_slices;
        queue_.push_front(std::move(s));
      } else {
        finish.emplace_back(std::move(s), why);
      }
    }
    if (stats_.connections_up == 0) {
      for (Slice& s : queue_) finish.emplace_back(std::move(s), why);
      queue_.clear();
    }
  }
  // Outside the lock (a device call): the rest of its requests come back
  // flushed. The QP lives until the link set goes.
  if (newly_dead) ToError(lane->path->nic->api(), lane->qp);
  for (auto& [s, st] : finish) Finish(s, st);
  if (newly_dead) {
    // Each failed QP is replaced (the path's others carry on meanwhile).
    std::function<void(const std::string&)> down;
    {
      absl::MutexLock l(&mu_);
      if (!stop_.load(std::memory_order_acquire)) down = on_path_down_;
    }
    if (down) down(lane->path->name);
  }
  Pump();
}

void VerbsLinks::Finish(const Slice& s, const absl::Status& st) {
  OpState& op = *s.op;
  if (!st.ok()) {
    absl::MutexLock l(&op.mu);
    if (op.first_error.ok()) op.first_error = st;
  }
  if (op.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  absl::Status result;
  {
    absl::MutexLock l(&op.mu);
    result = op.first_error;
  }
  if (op.op.done) op.op.done(result);
}

// --- exporting side ------------------------------------------------------------

struct VerbsServer::Served {
  ibv_qp* qp = nullptr;
  uint64_t link_instance = 0;
  char* mailbox = nullptr;
  ibv_mr* mr = nullptr;
  bool dead = false;
};

struct VerbsServer::NodeNic {
  std::string node;
  std::shared_ptr<Nic> nic;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  std::map<uint32_t, std::unique_ptr<Served>> qps;  // by QP number; guarded by VerbsServer::mu_
  std::thread poller;
};

VerbsServer::VerbsServer(Nics* nics, VerbsOptions options, NotifySink sink)
    : nics_(nics), options_(std::move(options)), sink_(std::move(sink)) {}

VerbsServer::~VerbsServer() {
  stop_.store(true, std::memory_order_release);
  std::map<std::pair<std::string, std::string>, std::shared_ptr<NodeNic>> all;
  std::map<RegKey, std::shared_ptr<Registration>> regs;
  {
    absl::MutexLock l(&mu_);
    all.swap(node_nics_);
  }
  {
    absl::MutexLock l(&reg_mu_);
    regs.swap(shared_);
    registrations_.clear();
  }
  for (auto& [k, nn] : all) {
    if (nn->poller.joinable()) nn->poller.join();
  }
  for (auto& [k, r] : regs) Deregister(*r);
  const VerbsApi* api = nics_->api();
  for (auto& [k, nn] : all) {
    for (auto& [qpn, s] : nn->qps) {
      api->destroy_qp(s->qp);
      api->dereg_mr(s->mr);
      std::free(s->mailbox);
    }
    nn->qps.clear();
    api->destroy_cq(nn->cq);
    api->destroy_comp_channel(nn->channel);
    api->dealloc_pd(nn->pd);
  }
}

absl::StatusOr<SideWire> VerbsServer::Accept(const std::string& node, uint64_t link_instance, const IpPrefix& local,
                                             const SideWire& importer, const std::vector<uint32_t>& replaces) {
  if (importer.qps.empty() || importer.qps.size() > 16) {
    return absl::InvalidArgumentError("OpenVerbs: 1 to 16 queue pairs per path");
  }
  PODLINK_ASSIGN_OR_RETURN(GidChoice gid, ChooseGid(options_.sysfs, local, options_.gid_index));
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<Nic> nic, nics_->Get(gid));
  const VerbsApi* api = nics_->api();
  std::shared_ptr<NodeNic> nn;
  std::vector<std::unique_ptr<Served>> gone;
  {
    absl::MutexLock l(&mu_);
    // QPs of the peer's earlier link sets (it reconnected or restarted) go.
    size_t mine = 0;
    for (auto& [key, other] : node_nics_) {
      if (key.first != node) continue;
      for (auto it = other->qps.begin(); it != other->qps.end();) {
        // QP numbers are unique per device only: a replaced QP is one of this
        // device's (the path's).
        bool replaced = key.second == nic->name() &&
                        std::find(replaces.begin(), replaces.end(), it->first) != replaces.end();
        if (it->second->link_instance != link_instance || replaced) {
          gone.push_back(std::move(it->second));
          it = other->qps.erase(it);
        } else {
          ++mine;
          ++it;
        }
      }
    }
    if (mine + importer.qps.size() > options_.max_qps_per_peer) {
      return absl::ResourceExhaustedError(absl::StrCat("node ", node, " holds ", mine, " queue pairs (limit ",
                                                       options_.max_qps_per_peer, ")"));
    }
    std::shared_ptr<NodeNic>& slot = node_nics_[{node, nic->name()}];
    if (slot == nullptr) {
      auto fresh = std::make_shared<NodeNic>();
      fresh->node = node;
      fresh->nic = nic;
      // One protection domain per peer daemon and device: its keys work
      // only on its own QPs.
      fresh->pd = api->alloc_pd(nic->ctx());
      fresh->channel = fresh->pd ? api->create_comp_channel(nic->ctx()) : nullptr;
      fresh->cq = fresh->channel
                      ? api->create_cq(nic->ctx(), static_cast<int>(options_.max_qps_per_peer * (kRecvDepth + 1)),
                                       nullptr, fresh->channel, 0)
                      : nullptr;
      if (fresh->cq == nullptr) {
        absl::Status st = Errno("verbs resources for a peer", errno);
        if (fresh->channel != nullptr) api->destroy_comp_channel(fresh->channel);
        if (fresh->pd != nullptr) api->dealloc_pd(fresh->pd);
        node_nics_.erase({node, nic->name()});
        return st;
      }
      SetNonBlocking(fresh->channel->fd);
      api->req_notify_cq(fresh->cq, 0);
      fresh->poller = std::thread([this, fresh] { PollLoop(fresh); });
      slot = fresh;
    }
    nn = slot;
  }
  if (!gone.empty()) {
    Log()->info("event=verbs_qps_dropped peer={} count={} why=\"{}\"", node, gone.size(),
                replaces.empty() ? "a newer link set of the peer" : "replaced by the peer after failing");
  }
  for (auto& s : gone) {
    api->destroy_qp(s->qp);
    api->dereg_mr(s->mr);
    std::free(s->mailbox);
  }
  SideWire out;
  out.device = nic->name();
  out.gid = gid.gid;
  out.mtu = std::min(nic->active_mtu(), MtuOf(importer.mtu));
  std::vector<std::unique_ptr<Served>> made;
  auto undo = [&](absl::Status st) {
    for (auto& s : made) {
      if (s->qp != nullptr) api->destroy_qp(s->qp);
      if (s->mr != nullptr) api->dereg_mr(s->mr);
      std::free(s->mailbox);
    }
    return st;
  };
  for (const QpWire& theirs : importer.qps) {
    auto s = std::make_unique<Served>();
    s->link_instance = link_instance;
    s->mailbox = static_cast<char*>(std::aligned_alloc(4096, 4096));
    if (s->mailbox == nullptr) return undo(absl::ResourceExhaustedError("no memory for a verbs mailbox"));
    std::memset(s->mailbox, 0, 4096);
    s->mr = api->reg_mr(nn->pd, s->mailbox, kMailboxSlots * kNotifyBytes,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (s->mr == nullptr) return undo(Errno("ibv_reg_mr(mailbox)", errno));
    s->qp = CreateRcQp(api, nn->pd, nn->cq, 1, kRecvDepth);
    if (s->qp == nullptr) return undo(Errno("ibv_create_qp", errno));
    made.push_back(std::move(s));
    Served& q = *made.back();
    if (absl::Status st = ToInit(api, q.qp, gid.port,
                                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        !st.ok()) {
      return undo(st);
    }
    for (uint32_t r = 0; r < kRecvDepth; ++r) {
      ibv_recv_wr wr{};
      wr.wr_id = r;
      ibv_recv_wr* bad = nullptr;
      if (int rc = api->post_recv(q.qp, &wr, &bad)) return undo(Errno("ibv_post_recv", rc));
    }
    ConnectArgs c;
    c.port = gid.port;
    c.gid_index = gid.index;
    c.remote_gid = importer.gid;
    c.remote_qpn = theirs.qpn;
    c.remote_psn = theirs.psn;
    c.local_psn = RandomPsn();
    c.mtu = static_cast<ibv_mtu>(out.mtu);
    c.timeout = options_.timeout;
    c.retry = options_.retry_count;
    if (absl::Status st = ToRts(api, q.qp, c); !st.ok()) return undo(st);
    out.qps.push_back(QpWire{q.qp->qp_num, c.local_psn, reinterpret_cast<uintptr_t>(q.mailbox), q.mr->rkey});
  }
  {
    absl::MutexLock l(&mu_);
    for (auto& s : made) {
      uint32_t qpn = s->qp->qp_num;
      nn->qps[qpn] = std::move(s);
    }
  }
  Log()->info("event=verbs_accept peer={} device={} gid={} peer_gid={} qps={}", node, nic->name(), Gid(gid.gid),
              Gid(importer.gid), out.qps.size());
  return out;
}

absl::StatusOr<std::vector<RegionKey>> VerbsServer::Register(const std::string& node, uint64_t grant,
                                                             std::shared_ptr<MemoryObject> memory, char* addr,
                                                             uint64_t length,
                                                             std::function<absl::StatusOr<UniqueFd>()> dmabuf) {
  std::vector<std::shared_ptr<NodeNic>> nns;
  {
    absl::MutexLock l(&mu_);
    for (auto& [key, nn] : node_nics_) {
      if (key.first == node) nns.push_back(nn);
    }
  }
  if (nns.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node, " has no verbs link to this node"));
  }
  absl::MutexLock l(&reg_mu_);
  if (registrations_.contains(grant)) return absl::AlreadyExistsError("grant registered already");
  const RegKey key{node, reinterpret_cast<uintptr_t>(addr), length};
  std::shared_ptr<Registration>& reg = shared_[key];
  if (reg == nullptr) {
    reg = std::make_shared<Registration>();
    reg->node = node;
    reg->memory = std::move(memory);
  }
  const VerbsApi* api = nics_->api();
  // Devices the peer reached since the export was registered get theirs.
  for (auto& nn : nns) {
    bool have = false;
    for (const auto& [n, mr] : reg->mrs) have = have || n == nn;
    if (have) continue;
    constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ibv_mr* mr = nullptr;
    absl::Status st;
    if (dmabuf == nullptr) {
      mr = api->reg_mr(nn->pd, addr, length, kAccess);
      if (mr == nullptr) {
        const int err = errno;
        st = Errno("ibv_reg_mr(export)", err);
        if (err == ENOMEM) {
          st = absl::ResourceExhaustedError(absl::StrCat(
              st.message(), " (most often the locked-memory limit, RLIMIT_MEMLOCK, of a daemon without "
                            "CAP_IPC_LOCK)"));
        }
      }
    } else if (api->reg_dmabuf_mr == nullptr || !nn->nic->dmabuf()) {
      st = absl::FailedPreconditionError(absl::StrCat(
          "RDMA device ", nn->nic->name(), " cannot register GPU memory (dma-buf): ",
          api->reg_dmabuf_mr == nullptr ? "libibverbs lacks ibv_reg_dmabuf_mr (rdma-core 34 or later)"
                                        : "the device or its driver does not support it"));
    } else if (absl::StatusOr<UniqueFd> fd = dmabuf(); !fd.ok()) {
      st = absl::FailedPreconditionError(absl::StrCat("no dma-buf of the GPU export: ", fd.status().message()));
    } else {
      // The peer addresses the export by its address here (iova), as for
      // host memory; the registration holds the dma-buf, not the descriptor.
      mr = api->reg_dmabuf_mr(nn->pd, 0, length, reinterpret_cast<uintptr_t>(addr), fd->get(), kAccess);
      if (mr == nullptr) {
        st = absl::FailedPreconditionError(absl::StrCat("ibv_reg_dmabuf_mr(GPU export) on ", nn->nic->name(), ": ",
                                                        std::strerror(errno)));
      }
    }
    if (mr == nullptr) {
      if (reg->grants.empty()) {
        Deregister(*reg);
        shared_.erase(key);
      }
      return st;
    }
    reg->mrs.emplace_back(nn, mr);
  }
  reg->grants.insert(grant);
  registrations_[grant] = reg;
  std::vector<RegionKey> keys;
  for (const auto& [nn, mr] : reg->mrs) {
    keys.push_back(RegionKey{nn->nic->name(), mr->rkey, reinterpret_cast<uintptr_t>(addr)});
  }
  return keys;
}

void VerbsServer::Deregister(Registration& r) {
  for (auto& [nn, mr] : r.mrs) nics_->api()->dereg_mr(mr);
  r.mrs.clear();
  r.memory.reset();
}

void VerbsServer::Unregister(uint64_t grant, const std::string& node) {
  absl::MutexLock l(&reg_mu_);
  auto it = registrations_.find(grant);
  if (it == registrations_.end() || it->second->node != node) return;
  std::shared_ptr<Registration> reg = std::move(it->second);
  registrations_.erase(it);
  reg->grants.erase(grant);
  if (!reg->grants.empty()) return;  // other grants of the export still use it
  for (auto s = shared_.begin(); s != shared_.end(); ++s) {
    if (s->second == reg) {
      shared_.erase(s);
      break;
    }
  }
  Deregister(*reg);
}

uint64_t VerbsServer::registrations() const {
  absl::MutexLock l(&reg_mu_);
  return shared_.size();
}

std::vector<std::pair<uint64_t, std::string>> VerbsServer::RegisteredGrants() const {
  absl::MutexLock l(&reg_mu_);
  std::vector<std::pair<uint64_t, std::string>> out;
  for (const auto& [g, r] : registrations_) out.emplace_back(g, r->node);
  return out;
}

uint64_t VerbsServer::qps() const {
  absl::MutexLock l(&mu_);
  uint64_t n = 0;
  for (const auto& [k, nn] : node_nics_) n += nn->qps.size();
  return n;
}

void VerbsServer::PollLoop(std::shared_ptr<NodeNic> nn) {
  const VerbsApi* api = nics_->api();
  ibv_wc wcs[32];
  while (WaitEvent(api, nn->channel, nn->cq, stop_)) {
    for (;;) {
      int n = api->poll_cq(nn->cq, 32, wcs);
      if (n <= 0) break;
      for (int i = 0; i < n; ++i) {
        const ibv_wc& wc = wcs[i];
        uint64_t words[2] = {0, 0};
        bool deliver = false;
        {
          absl::MutexLock l(&mu_);
          auto it = nn->qps.find(wc.qp_num);
          if (it == nn->qps.end()) continue;
          Served& q = *it->second;
          if (wc.status != IBV_WC_SUCCESS) {
            if (!q.dead) {
              Log()->warn("event=verbs_peer_qp_failed peer={} qp={} status={}", nn->node, wc.qp_num,
                          api->wc_status_str(wc.status));
            }
            q.dead = true;
            continue;
          }
          if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) continue;
          uint32_t slot = ntohl(wc.imm_data);
          if (slot < kMailboxSlots) {
            std::memcpy(words, q.mailbox + uint64_t{slot} * kNotifyBytes, kNotifyBytes);
            deliver = true;
          }
          ibv_recv_wr wr{};
          wr.wr_id = wc.wr_id;
          ibv_recv_wr* bad = nullptr;
          if (int rc = api->post_recv(q.qp, &wr, &bad)) {
            Log()->warn("event=verbs_peer_qp_failed peer={} qp={} why=\"post_recv: {}\"", nn->node, wc.qp_num,
                        std::strerror(rc));
            q.dead = true;
          }
        }
        if (deliver) {
          sink_(nn->node, words[0], words[1]);
          notifies_.fetch_add(1, std::memory_order_relaxed);  // counted once delivered
        }
      }
    }
  }
}

}  // namespace podlink::mesh::verbs
