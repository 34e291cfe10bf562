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

// A mailbox record of version 2 or 3 (kRecordsStaged, kRecordsStagedDone),
// in slots of kRecordBytes; version 1 is its first kNotifyBytes, a
// notification. Version 2 is its first 48 bytes. Little endian.
struct Record {
  uint64_t grant = 0;
  uint64_t value = 0;  // a notification's value; a staged slice's offset in the export
  uint32_t kind = 0;   // kRecordNotify, kRecordStagedWrite, kRecordStagedRead
  uint32_t length = 0;
  uint64_t addr = 0;   // the importer's staging slot (staged slices)
  uint32_t rkey = 0;   // its key
  uint32_t tag = 0;    // the importer's slot number, echoed in the acknowledgement
  uint64_t ack_addr = 0;  // the importer's ack word for it (same key)
  uint64_t transfer = 0;  // version 3: the importer's op the slice is of (a DONE record's: the op it ends)
};
static_assert(sizeof(Record) == 56);
constexpr uint32_t kRecordV2Bytes = 48;
constexpr uint32_t kRecordBytes = 64;
constexpr uint32_t kRecordNotify = 0;
constexpr uint32_t kRecordStagedWrite = 1;
constexpr uint32_t kRecordStagedRead = 2;
constexpr uint32_t kRecordStagedDone = 3;  // version 3: every slice of `transfer` landed; answered once no copy of one can land later
constexpr uint32_t kAckBytes = 8;
// The acknowledgement's immediate: the importer's slot, then an
// absl::StatusCode in the low byte.
uint32_t AckImm(uint32_t tag, absl::StatusCode code) { return (tag << 8) | (static_cast<uint32_t>(code) & 0xff); }

// Said at most every 10 s (a peer must not be able to flood the log).
bool Due(std::atomic<int64_t>& last) {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  int64_t prev = last.load(std::memory_order_relaxed);
  return now - prev >= 10 && last.compare_exchange_strong(prev, now, std::memory_order_relaxed);
}
std::atomic<int64_t> refused_log{0};
std::atomic<int64_t> unexpected_ack_log{0};

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
  uint64_t transfer = 0;  // this link set's number for it
  // A staged write some slice of which went out again after its QP failed:
  // a DONE record ends it (an earlier copy may still be in the owner's hands).
  std::atomic<bool> resent{false};
  bool done_sent = false;  // only the thread finishing its last slice reads and sets it
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

// Layout of a lane's staging: slices_in_flight slots of slice_bytes, then
// kNotifyDepth record slots for notifications, one record slot and one ack
// word per staging slot.
char* VerbsLinks::NotifySlot(const Lane& lane, uint32_t i) const {
  return lane.staging + uint64_t{options_.slices_in_flight} * options_.slice_bytes + uint64_t{i} * kRecordBytes;
}
char* VerbsLinks::RecordSlot(const Lane& lane, uint32_t slot) const {
  return NotifySlot(lane, kNotifyDepth) + uint64_t{slot} * kRecordBytes;
}
char* VerbsLinks::AckWord(const Lane& lane, uint32_t slot) const {
  return RecordSlot(lane, options_.slices_in_flight) + uint64_t{slot} * kAckBytes;
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
  path->cq = api->create_cq(nic->ctx(), static_cast<int>(lanes * (3 * slots + kNotifyDepth) + 8), nullptr,
                            path->channel, 0);
  if (path->cq == nullptr) return fail(Errno("ibv_create_cq", errno));
  api->req_notify_cq(path->cq, 0);
  SideWire out;
  out.device = nic->name();
  out.gid = gid.gid;
  out.mtu = nic->active_mtu();
  const size_t bytes = static_cast<size_t>(slots) * (options_.slice_bytes + kRecordBytes + kAckBytes) +
                       kNotifyDepth * kRecordBytes;
  out.records = kRecordsStagedDone;
  for (uint32_t i = 0; i < lanes; ++i) {
    auto lane = std::make_unique<Lane>();
    lane->path = path.get();
    lane->staging = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    if (lane->staging == nullptr) return fail(absl::ResourceExhaustedError("no memory for verbs staging"));
    // This daemon's HCA writes here (RDMA READ results), and for staged
    // grants the owner at the other end of this path reads and writes its
    // staging slots and ack words (this path's protection domain only:
    // nobody else's QPs reach it, and the pod's own memory is never in it).
    constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    lane->mr = api->reg_mr(path->pd, lane->staging, bytes, kAccess);
    if (lane->mr == nullptr) return fail(Errno("ibv_reg_mr(staging)", errno));
    // Receives: one acknowledgement per staging slot at most. Sends: a
    // staged slice's slot may be reused (its answer came) before its
    // record's send completed, so twice the slots.
    lane->qp = CreateRcQp(api, path->pd, path->cq, 2 * slots + kNotifyDepth, slots);
    if (lane->qp == nullptr) return fail(Errno("ibv_create_qp", errno));
    if (absl::Status st = ToInit(api, lane->qp, gid.port, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
        !st.ok()) {
      return fail(st);
    }
    for (uint32_t r = 0; r < slots; ++r) {
      ibv_recv_wr wr{};  // wr_id 0: never a send's (those count from 1)
      ibv_recv_wr* bad = nullptr;
      if (int rc = api->post_recv(lane->qp, &wr, &bad)) return fail(Errno("ibv_post_recv", rc));
    }
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
  path->records = owner.records;
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

void VerbsLinks::AddStagedRegion(uint64_t grant, uint64_t slot_bytes) {
  absl::MutexLock l(&mu_);
  staged_regions_[grant] = slot_bytes == 0 ? options_.slice_bytes : std::min(slot_bytes, options_.slice_bytes);
}

void VerbsLinks::DropRegion(uint64_t grant) {
  absl::MutexLock l(&mu_);
  regions_.erase(grant);
  staged_regions_.erase(grant);
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
  // An owner that never answers a staged slice (its QP moved to error while
  // this side had nothing to send, a relay whose next hop hangs): the QP
  // fails, its slices go elsewhere or fail.
  std::vector<Lane*> stuck;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = absl::Now();
    for (auto& p : paths_) {
      for (auto& lane : p->lanes) {
        if (lane->dead) continue;
        for (const auto& [id, pend] : lane->pending) {
          if (pend.staged && now - pend.since > options_.answer_timeout) {
            stuck.push_back(lane.get());
            break;
          }
        }
      }
    }
  }
  for (Lane* lane : stuck) {
    Fail(lane, 0, absl::UnavailableError(absl::StrCat("node ", node_, " answered no staged slice on path ",
                                                      lane->path->name, " in ",
                                                      absl::FormatDuration(options_.answer_timeout))));
  }
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
  uint64_t slice = options_.slice_bytes;
  bool staged = false;
  if (op.type != FrameType::kNotify) {
    absl::MutexLock l(&mu_);
    if (auto it = staged_regions_.find(op.grant); it != staged_regions_.end()) {
      slice = it->second;
      staged = true;
    }
  }
  const uint64_t n = op.type == FrameType::kNotify ? 1 : (op.length + slice - 1) / slice;
  if (n == 0) return absl::InvalidArgumentError("length must be > 0");
  st->remaining.store(n, std::memory_order_relaxed);
  st->slices = n;
  if (!staged) st->regs = LocalRegs(op);  // a staged grant's slices always go through the staging slots
  st->op = std::move(op);
  {
    absl::MutexLock l(&mu_);
    if (stats_.connections_up == 0) {
      return absl::UnavailableError(absl::StrCat("no verbs queue pair to node ", node_, " is up"));
    }
    if (st->op.type != FrameType::kNotify && !regions_.contains(st->op.grant) &&
        !staged_regions_.contains(st->op.grant)) {
      return absl::FailedPreconditionError("the remote region has no verbs registration");
    }
    st->transfer = next_transfer_++;
    for (uint64_t i = 0; i < n; ++i) {
      Slice s;
      s.op = st;
      s.offset = i * slice;
      s.length = st->op.type == FrameType::kNotify ? 0 : std::min(slice, st->op.length - s.offset);
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
    bool staged;
    uint32_t records;  // the path's record version
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
        if (!s.done_record && !MayUse(s.op->op.prefer.get(), s.op->slices == 1, lane->path->name, up)) {
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
      r.records = best->path->records;
      const uint64_t stride = r.records >= kRecordsStaged ? kRecordBytes : kNotifyBytes;
      r.staged = s.done_record || (!notify && staged_regions_.contains(s.op->op.grant));
      if (s.done_record && r.records < kRecordsStagedDone) {
        // An owner of an older version has no late-copy guard to ask.
        failed.emplace_back(std::move(s), absl::OkStatus());
        it = queue_.erase(it);
        continue;
      }
      if (r.staged && r.records < kRecordsStaged) {
        failed.emplace_back(std::move(s), absl::FailedPreconditionError(absl::StrCat(
                                              "node ", node_, " stages this region but its queue pairs on device ",
                                              best->path->remote_device, " do not take staged records")));
        it = queue_.erase(it);
        continue;
      }
      if (notify || r.staged) {
        r.mailbox_slot = best->mailbox_next % kMailboxSlots;
        ++best->mailbox_next;
        r.remote_addr = best->remote.mailbox + r.mailbox_slot * stride;
        r.rkey = best->remote.mailbox_rkey;
      }
      if (notify) {
        r.post.slot = options_.slices_in_flight + best->notify_next % kNotifyDepth;
        ++best->notify_next;
      } else if (r.staged) {
        r.post.slot = best->free_slots.back();
        best->free_slots.pop_back();
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
      best->pending[r.post.wr_id] = Pending{r.post.slice, r.post.slot, r.post.lkey != 0, r.staged, absl::Now()};
      if (r.post.lkey != 0) ++stats_.zero_copy_slices;
      ready.push_back(std::move(r));
    }
  }
  for (auto& [s, st] : failed) Finish(s, st);
  for (const Ready& r : ready) {
    Lane& lane = *r.post.lane;
    const LinkOp& op = r.post.slice.op->op;
    char* slot = r.post.slot >= options_.slices_in_flight
                     ? NotifySlot(lane, r.post.slot - options_.slices_in_flight)
                     : lane.staging + uint64_t{r.post.slot} * options_.slice_bytes;
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
    if (r.staged) {
      // The slot's bytes (a write) and a record telling the owner where they
      // are; the owner answers into the slot's ack word.
      const bool done_record = r.post.slice.done_record;
      if (op.type == FrameType::kWrite && !done_record) {
        std::memcpy(slot, op.local + r.post.slice.offset, r.post.slice.length);
      }
      Record rec;
      rec.grant = op.grant;
      rec.value = op.offset + r.post.slice.offset;
      rec.kind = done_record ? kRecordStagedDone : op.type == FrameType::kWrite ? kRecordStagedWrite : kRecordStagedRead;
      rec.length = static_cast<uint32_t>(r.post.slice.length);
      rec.transfer = r.post.slice.op->transfer;
      rec.addr = reinterpret_cast<uintptr_t>(slot);
      rec.rkey = lane.mr->rkey;
      rec.tag = r.post.slot;
      rec.ack_addr = reinterpret_cast<uintptr_t>(AckWord(lane, r.post.slot));
      char* record = RecordSlot(lane, r.post.slot);
      std::memcpy(record, &rec, sizeof rec);
      sge.addr = reinterpret_cast<uintptr_t>(record);
      sge.length = r.records >= kRecordsStagedDone ? sizeof rec : kRecordV2Bytes;
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = htonl(r.mailbox_slot);
      ibv_send_wr* bad = nullptr;
      if (int rc = lane.path->nic->api()->post_send(lane.qp, &wr, &bad)) {
        Fail(&lane, r.post.wr_id, Errno("ibv_post_send", rc));
      }
      continue;
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
        Record rec;  // kind kRecordNotify; a version 1 owner reads its first kNotifyBytes
        rec.grant = op.grant;
        rec.value = op.offset;
        std::memcpy(slot, &rec, sizeof rec);
        sge.length = r.records >= kRecordsStaged ? sizeof rec : kNotifyBytes;
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
        if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
          Acknowledged(lane, ntohl(wc.imm_data));
          continue;
        }
        Pending pend;
        {
          absl::MutexLock l(&mu_);
          auto it = lane->pending.find(wc.wr_id);
          if (it == lane->pending.end()) continue;
          if (it->second.staged) continue;  // the record went; done when the owner acknowledges it
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

void VerbsLinks::Acknowledged(Lane* lane, uint32_t imm) {
  const uint32_t tag = imm >> 8;
  const uint32_t code = imm & 0xff;
  Pending pend;
  bool found = false;
  {
    absl::MutexLock l(&mu_);
    for (auto it = lane->pending.begin(); it != lane->pending.end(); ++it) {
      if (it->second.staged && it->second.slot == tag) {
        pend = std::move(it->second);
        lane->pending.erase(it);
        found = true;
        break;
      }
    }
  }
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  if (int rc = lane->path->nic->api()->post_recv(lane->qp, &wr, &bad)) {
    Fail(lane, 0, Errno("ibv_post_recv", rc));
  }
  if (!found) {
    // Not one this lane has outstanding (a late answer after a resend, or a
    // confused owner): nothing to finish.
    if (Due(unexpected_ack_log)) {
      Log()->warn("event=verbs_unexpected_ack node={} path={} slot={}", node_, lane->path->name, tag);
    }
    return;
  }
  const LinkOp& op = pend.slice.op->op;
  absl::Status st;
  if (code != 0) {
    const auto sc = code <= static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)
                        ? static_cast<absl::StatusCode>(code)
                        : absl::StatusCode::kUnknown;
    st = pend.slice.done_record
             ? absl::Status(sc, absl::StrCat("node ", node_, " could not end a staged write of ", op.length,
                                             " bytes some slices of which were sent twice (its podlinkd's log says "
                                             "why)"))
             : absl::Status(sc, absl::StrCat("node ", node_, " refused a staged ",
                                             op.type == FrameType::kWrite ? "write" : "read", " of ",
                                             pend.slice.length, " bytes at offset ", op.offset + pend.slice.offset,
                                             " of its region (its podlinkd's log says why)"));
  } else if (pend.slice.done_record) {
    // nothing to copy
  } else if (op.type == FrameType::kRead) {
    std::memcpy(op.local + pend.slice.offset, lane->staging + uint64_t{pend.slot} * options_.slice_bytes,
                pend.slice.length);
  }
  {
    absl::MutexLock l(&mu_);
    lane->free_slots.push_back(pend.slot);
    if (!pend.slice.done_record) ++stats_.slices;
    if (pend.slice.done_record) {
      // not data
    } else if (st.ok() && op.type == FrameType::kWrite) {
      stats_.bytes_sent += pend.slice.length;
      lane->bytes_sent += pend.slice.length;
    } else if (st.ok()) {
      stats_.bytes_received += pend.slice.length;
    }
  }
  Finish(pend.slice, st);
  Pump();
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
  }
  // The QP goes to error before any of its slices goes out again (outside
  // the lock: a device call): from then on it sends nothing and answers no
  // RDMA READ, so an owner cannot take a staged write's bytes from the
  // failed attempt after the new one; the rest of its requests come back
  // flushed. The QP lives until the link set goes.
  if (newly_dead) ToError(lane->path->nic->api(), lane->qp);
  {
    absl::MutexLock l(&mu_);
    // Staged slices whose record went wait for an acknowledgement that will
    // not come now: they go elsewhere with the failed request's.
    std::vector<uint64_t> ids{wr_id};
    if (newly_dead) {
      for (const auto& [id, pend] : lane->pending) {
        if (pend.staged && id != wr_id) ids.push_back(id);
      }
    }
    for (uint64_t id : ids) {
      auto it = lane->pending.find(id);
      if (it == lane->pending.end()) continue;
      Slice s = std::move(it->second.slice);
      const bool staged = it->second.staged;
      lane->pending.erase(it);
      // A staged write's slice whose record went may still be copied by the
      // owner (it read the bytes before the QP failed): the op ends with
      // DONE, whether this slice goes out again or fails.
      if (staged && !s.done_record && s.op->op.type == FrameType::kWrite) {
        s.op->resent.store(true, std::memory_order_release);
      }
      if (s.op->op.type == FrameType::kNotify) {
        // It may have arrived: never sent twice.
        finish.emplace_back(std::move(s), why);
      } else if (++s.attempts < kMaxAttempts && stats_.connections_up > 0) {
        if (!s.done_record) ++stats_.resent_slices;
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
  if (op.resent.load(std::memory_order_acquire) && !op.done_sent) {
    // Every slice was answered (or failed), but a copy of one may still be
    // in the owner's hands from an attempt whose QP failed: the owner
    // answers this DONE record once no such copy can land any more (it
    // drops later ones), so the pod's next write to these bytes cannot be
    // overwritten by it — after a failed op too. The op's own result stays
    // (first_error).
    op.done_sent = true;
    op.remaining.store(1, std::memory_order_release);
    Slice d;
    d.op = s.op;
    d.done_record = true;
    bool queued = false;
    {
      absl::MutexLock l(&mu_);
      if (!stop_.load(std::memory_order_acquire) && stats_.connections_up > 0) {
        queue_.push_front(std::move(d));
        queued = true;
      }
    }
    if (queued) return Pump();
    if (result.ok()) {
      result = absl::UnavailableError(absl::StrCat("no verbs queue pair to node ", node_,
                                                   " is up to end a staged write sent partly twice"));
    }
  }
  if (op.op.done) op.op.done(result);
}

// --- exporting side ------------------------------------------------------------

struct VerbsServer::Served {
  ibv_qp* qp = nullptr;
  uint64_t link_instance = 0;
  char* mailbox = nullptr;
  ibv_mr* mr = nullptr;
  uint32_t records = kRecordsNotifyOnly;
  bool dead = false;
};

namespace {
// The owner's sends for staged slices: wr_id = kStageSend | kind << 40 |
// the record's receive << 24 | slot (24 bits).
constexpr uint64_t kStageSend = uint64_t{1} << 63;
constexpr uint64_t kSendRead = 1;   // RDMA READ of the importer's slot into a bounce slot
constexpr uint64_t kSendData = 2;   // RDMA WRITE of a bounce slot into the importer's (unsignaled)
constexpr uint64_t kSendAck = 3;    // the acknowledgement of a slice holding a bounce slot
constexpr uint64_t kSendRefusal = 4;  // the acknowledgement of a slice refused before it had one
uint64_t StageWr(uint64_t kind, int32_t slot, uint64_t recv_id = 0) {
  return kStageSend | kind << 40 | (recv_id & 0xffff) << 24 | (static_cast<uint32_t>(slot) & 0xffffff);
}
uint64_t StageKind(uint64_t wr_id) { return (wr_id >> 40) & 0xff; }
uint64_t StageRecv(uint64_t wr_id) { return (wr_id >> 24) & 0xffff; }
int32_t StageSlot(uint64_t wr_id) { return static_cast<int32_t>(wr_id & 0xffffff); }

}  // namespace

struct VerbsServer::NodeNic {
  std::string node;
  std::shared_ptr<Nic> nic;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  std::map<uint32_t, std::unique_ptr<Served>> qps;  // by QP number; guarded by VerbsServer::mu_
  std::thread poller;
  // Staged grants' bounce pool (PrepareStaging): kStageSlots slots of
  // slice_bytes, then a page the acknowledgements are sent from; local
  // access only. Guarded by VerbsServer::mu_.
  char* bounce = nullptr;
  std::shared_ptr<char> bounce_memory;  // owns `bounce`; sinks hold it while they use a slot
  ibv_mr* bounce_mr = nullptr;
  std::vector<int32_t> free_bounce;
  std::map<int32_t, StageJob> holding;  // by bounce slot: the slice using it
  std::deque<StageJob> waiting;         // slices waiting for a bounce slot
};

VerbsServer::VerbsServer(Nics* nics, VerbsOptions options, NotifySink sink, StageSink stage)
    : nics_(nics),
      options_(std::move(options)),
      sink_(std::move(sink)),
      stage_sink_(std::move(stage)),
      // At most 32 MiB pinned per (peer, device) however large the slices.
      stage_slots_(static_cast<uint32_t>(
          std::clamp<uint64_t>((uint64_t{32} << 20) / std::max<uint64_t>(options_.slice_bytes, 1), 2, kStageSlots))) {
  absl::MutexLock l(&alive_->mu);
  alive_->server = this;
}

VerbsServer::~VerbsServer() {
  stop_.store(true, std::memory_order_release);
  {
    // A sink finishing later answers nothing (waits for one answering now).
    absl::MutexLock l(&alive_->mu);
    alive_->server = nullptr;
  }
  {
    absl::MutexLock l(&stage_mu_);  // wakes the staging thread: it sees stop_
    jobs_.clear();
  }
  if (stager_.joinable()) stager_.join();
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
    nn->holding.clear();
    nn->waiting.clear();
    if (nn->bounce_mr != nullptr) api->dereg_mr(nn->bounce_mr);
    nn->bounce_memory.reset();  // freed once no sink holds it either
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
  std::vector<std::pair<std::shared_ptr<NodeNic>, uint32_t>> gone_qpns;
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
          gone_qpns.emplace_back(other, it->first);
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
                      ? api->create_cq(nic->ctx(), static_cast<int>(options_.max_qps_per_peer * kCqPerQp),
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
  // Only now (no DMA of those QPs can land any more) their bounce slots come
  // back — those a sink still holds when it answers — and their slices
  // waiting for one go.
  if (!gone_qpns.empty()) {
    std::vector<StageJob> next;
    absl::MutexLock l(&mu_);
    for (auto& [other, qpn] : gone_qpns) {
      std::erase_if(other->waiting, [qpn = qpn](const StageJob& j) { return j.qpn == qpn; });
      std::vector<int32_t> slots;
      for (const auto& [slot, job] : other->holding) {
        if (job.qpn == qpn && !job.in_sink) slots.push_back(slot);
      }
      for (int32_t slot : slots) {
        if (std::optional<StageJob> j = ReleaseLocked(*other, slot, qpn)) next.push_back(std::move(*j));
      }
    }
    absl::MutexLock s(&stage_mu_);
    if (!stop_.load(std::memory_order_acquire)) {
      for (auto& j : next) jobs_.push_back(std::move(j));
    }
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
  // Staged records where the importer speaks them (and this server can
  // serve them); notifications only otherwise.
  out.records = importer.records >= kRecordsStaged && stage_sink_ != nullptr
                    ? std::min(importer.records, kRecordsStagedDone)
                    : kRecordsNotifyOnly;
  const uint32_t record_bytes = out.records >= kRecordsStaged ? kRecordBytes : kNotifyBytes;
  static_assert(kMailboxSlots * kRecordBytes <= 4096);
  for (const QpWire& theirs : importer.qps) {
    auto s = std::make_unique<Served>();
    s->link_instance = link_instance;
    s->records = out.records;
    s->mailbox = static_cast<char*>(std::aligned_alloc(4096, 4096));
    if (s->mailbox == nullptr) return undo(absl::ResourceExhaustedError("no memory for a verbs mailbox"));
    std::memset(s->mailbox, 0, 4096);
    s->mr = api->reg_mr(nn->pd, s->mailbox, kMailboxSlots * record_bytes,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (s->mr == nullptr) return undo(Errno("ibv_reg_mr(mailbox)", errno));
    // Sends: per staged slice a READ or a WRITE and an acknowledgement.
    s->qp = CreateRcQp(api, nn->pd, nn->cq, kSendDepth, kRecvDepth);
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
        Record rec;
        bool deliver = false, stage = false, guarded = false;
        uint64_t link_instance = 0;
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
          }
          if (wc.status == IBV_WC_SUCCESS && (wc.wr_id & kStageSend) == 0) {
            if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) continue;
            uint32_t slot = ntohl(wc.imm_data);
            if (slot < kMailboxSlots) {
              const uint32_t bytes = q.records >= kRecordsStagedDone ? sizeof(Record)
                                     : q.records >= kRecordsStaged    ? kRecordV2Bytes
                                                                      : kNotifyBytes;
              std::memcpy(&rec, q.mailbox + uint64_t{slot} * (q.records >= kRecordsStaged ? kRecordBytes : kNotifyBytes),
                          bytes);
              deliver = rec.kind == kRecordNotify;
              stage = !deliver;
              link_instance = q.link_instance;
              guarded = q.records >= kRecordsStagedDone;
            }
            // The slot is read: its receive goes back (file comment: a slot
            // is rewritten only after this) — for a staged record once it is
            // answered (RepostLocked), which bounds what a peer has queued here.
            if (!stage) RepostLocked(*nn, wc.qp_num, wc.wr_id);
          }
        }
        if ((wc.wr_id & kStageSend) != 0) {
          SendDone(nn, wc.wr_id, wc.qp_num, wc.status == IBV_WC_SUCCESS);
        } else if (deliver) {
          sink_(nn->node, rec.grant, rec.value);
          notifies_.fetch_add(1, std::memory_order_relaxed);  // counted once delivered
        } else if (stage) {
          StageJob job;
          job.nn = nn;
          job.qpn = wc.qp_num;
          job.kind = rec.kind;
          job.grant = rec.grant;
          job.offset = rec.value;
          job.length = rec.length;
          job.addr = rec.addr;
          job.rkey = rec.rkey;
          job.tag = rec.tag;
          job.ack_addr = rec.ack_addr;
          job.recv_id = wc.wr_id;
          job.link_instance = link_instance;
          job.transfer = rec.transfer;
          job.guarded = guarded;
          Queue(std::move(job));
        }
      }
    }
  }
}

absl::Status VerbsServer::EnsurePoolLocked(NodeNic& nn) {
  if (nn.bounce_mr != nullptr) return absl::OkStatus();
  const VerbsApi* api = nics_->api();
  const size_t bytes = size_t{stage_slots_} * options_.slice_bytes;
  char* pool = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (pool == nullptr) return absl::ResourceExhaustedError("no memory for a verbs bounce pool");
  std::memset(pool, 0, bytes);
  // Local access only: the peer never addresses this memory; this daemon's
  // HCA reads into it and writes from it.
  ibv_mr* mr = api->reg_mr(nn.pd, pool, bytes, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) {
    const int err = errno;
    std::free(pool);
    absl::Status st = Errno("ibv_reg_mr(bounce pool)", err);
    if (err == ENOMEM) {
      return absl::ResourceExhaustedError(absl::StrCat(st.message(), " (", bytes >> 10,
                                                       " KiB; most often the locked-memory limit, RLIMIT_MEMLOCK, "
                                                       "of a daemon without CAP_IPC_LOCK)"));
    }
    return st;
  }
  nn.bounce = pool;
  nn.bounce_memory = std::shared_ptr<char>(pool, [](char* p) { std::free(p); });
  nn.bounce_mr = mr;
  for (uint32_t i = 0; i < stage_slots_; ++i) nn.free_bounce.push_back(static_cast<int32_t>(i));
  Log()->info("event=verbs_bounce_pool peer={} device={} slots={} slot_kib={}", nn.node, nn.nic->name(), stage_slots_,
              options_.slice_bytes >> 10);
  return absl::OkStatus();
}

absl::Status VerbsServer::PrepareStaging(const std::string& node) {
  if (stage_sink_ == nullptr) return absl::FailedPreconditionError("this daemon does not stage verbs transfers");
  bool any = false;
  {
    absl::MutexLock l(&mu_);
    for (auto& [key, nn] : node_nics_) {
      if (key.first != node) continue;
      bool speaks = false;
      for (const auto& [qpn, q] : nn->qps) speaks = speaks || (q->records >= kRecordsStaged && !q->dead);
      if (!speaks) continue;
      any = true;
      PODLINK_RETURN_IF_ERROR(EnsurePoolLocked(*nn));
    }
  }
  if (!any) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, "'s queue pairs to this node do not take staged records (an older podlinkd)"));
  }
  absl::MutexLock l(&stage_mu_);
  if (!stager_.joinable() && !stop_.load(std::memory_order_acquire)) stager_ = std::thread([this] { StageLoop(); });
  return absl::OkStatus();
}

size_t VerbsServer::FreeBounceSlots(const std::string& node) const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [key, nn] : node_nics_) {
    if (key.first == node) n += nn->free_bounce.size();
  }
  return n;
}

void VerbsServer::Queue(StageJob job) {
  absl::MutexLock l(&stage_mu_);
  if (stop_.load(std::memory_order_acquire)) return;
  jobs_.push_back(std::move(job));
}

void VerbsServer::StageLoop() {
  for (;;) {
    StageJob job;
    {
      absl::MutexLock l(&stage_mu_);
      stage_mu_.Await(absl::Condition(
          +[](VerbsServer* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->stage_mu_) {
            return s->stop_.load(std::memory_order_acquire) || !s->jobs_.empty();
          },
          this));
      if (stop_.load(std::memory_order_acquire)) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Stage(std::move(job));
  }
}

void VerbsServer::RepostLocked(NodeNic& nn, uint32_t qpn, uint64_t recv_id) {
  auto it = nn.qps.find(qpn);
  if (it == nn.qps.end() || it->second->dead) return;
  Served& q = *it->second;
  ibv_recv_wr wr{};
  wr.wr_id = recv_id;
  ibv_recv_wr* bad = nullptr;
  if (int rc = nics_->api()->post_recv(q.qp, &wr, &bad)) {
    Log()->warn("event=verbs_peer_qp_failed peer={} qp={} why=\"post_recv: {}\"", nn.node, qpn, std::strerror(rc));
    q.dead = true;
    ToError(nics_->api(), q.qp);
  }
}

std::optional<VerbsServer::StageJob> VerbsServer::ReleaseLocked(NodeNic& nn, int32_t slot, uint32_t qpn) {
  auto h = nn.holding.find(slot);
  if (h == nn.holding.end() || h->second.qpn != qpn) return std::nullopt;  // released already
  nn.holding.erase(h);
  nn.free_bounce.push_back(slot);
  if (nn.waiting.empty()) return std::nullopt;
  StageJob next = std::move(nn.waiting.front());
  nn.waiting.pop_front();
  return next;
}

void VerbsServer::SendDone(const std::shared_ptr<NodeNic>& nn, uint64_t wr_id, uint32_t qpn, bool ok) {
  const uint64_t kind = StageKind(wr_id);
  const int32_t slot = StageSlot(wr_id);
  std::optional<StageJob> next;
  {
    absl::MutexLock l(&mu_);
    if (kind == kSendRead && ok) {
      auto h = nn->holding.find(slot);
      if (h != nn->holding.end() && h->second.qpn == qpn) {
        h->second.landed = true;  // the bytes are in the bounce slot: copy them in
        next = h->second;
      }
    } else if (kind == kSendRead || kind == kSendAck) {
      next = ReleaseLocked(*nn, slot, qpn);
    }
    // An answer went: the peer may send another record (at most kRecvDepth
    // records, and so 2 * kRecvDepth sends, per QP at once).
    if (ok && (kind == kSendAck || kind == kSendRefusal)) RepostLocked(*nn, qpn, StageRecv(wr_id));
  }
  if (next) Queue(std::move(*next));
}

VerbsServer::TransferKey VerbsServer::KeyOf(const StageJob& job) {
  return {job.nn->node, job.link_instance, job.transfer};
}

bool VerbsServer::EndedLocked(const TransferKey& key) const {
  auto it = ended_.find(std::get<0>(key));
  return it != ended_.end() && it->second.contains({std::get<1>(key), std::get<2>(key)});
}

void VerbsServer::EndLocked(const TransferKey& key) {
  // A late copy is one whose QP failed after the owner took its bytes: it
  // reaches the sink within about the importer's answer_timeout, so twice
  // that (a minute at least) of memory suffices, bounded per node and in all.
  constexpr size_t kPerNode = 65536, kNodes = 1024;
  const absl::Time now = absl::Now();
  const absl::Time old = now - std::max(absl::Minutes(1), 2 * options_.answer_timeout);
  if (now - last_prune_ >= absl::Seconds(1)) {  // expiry walks everything: at most once a second
    last_prune_ = now;
    for (auto it = ended_.begin(); it != ended_.end();) {
      auto& m = it->second;
      for (auto e = m.begin(); e != m.end();) e = e->second < old ? m.erase(e) : std::next(e);
      it = m.empty() ? ended_.erase(it) : std::next(it);
    }
  }
  const std::string& node = std::get<0>(key);
  if (!ended_.contains(node) && ended_.size() >= kNodes) ended_.erase(ended_.begin());
  auto& m = ended_[node];
  m[{std::get<1>(key), std::get<2>(key)}] = now;
  if (m.size() > kPerNode) m.erase(m.begin());
}

void VerbsServer::Stage(StageJob job) {
  const VerbsApi* api = nics_->api();
  NodeNic& nn = *job.nn;
  absl::Status st;
  const bool write = job.kind == kRecordStagedWrite;
  if (job.kind == kRecordStagedDone && job.guarded) {
    // Every slice of the transfer was answered, some of one attempt that
    // failed: its copies already in the sink land before this is answered
    // (this thread copied those queued before it), later ones are dropped.
    absl::Status answer;
    {
      absl::MutexLock x(&xfer_mu_);
      const TransferKey key = KeyOf(job);
      EndLocked(key);
      if (writing_.contains(key)) {
        // Held until they finish. Each holds its QP's receive, but QPs can
        // be replaced meanwhile: at most kMaxHeldDone per peer node.
        size_t held = 0;
        for (auto it = done_waiting_.lower_bound({std::get<0>(key), 0, 0});
             it != done_waiting_.end() && std::get<0>(it->first) == std::get<0>(key); ++it) {
          held += it->second.size();
        }
        if (held < kMaxHeldDone) return done_waiting_[key].push_back(std::move(job));
        answer = absl::ResourceExhaustedError("too many DONE records held for this node");
      }
    }
    return Answer(job, answer);
  }
  if (write && job.guarded) {
    bool ended = false;
    {
      absl::MutexLock x(&xfer_mu_);
      ended = EndedLocked(KeyOf(job));
    }
    if (ended) {
      // A copy from an attempt that failed over, of a transfer that ended:
      // the bytes the pod wrote since must not be overwritten by it.
      staged_late_dropped_.fetch_add(1, std::memory_order_relaxed);
      job.dropped = true;
      return Answer(job, absl::OkStatus());
    }
  }
  if (job.kind != kRecordStagedWrite && job.kind != kRecordStagedRead) {
    st = absl::InvalidArgumentError(absl::StrCat("unknown mailbox record kind ", job.kind));
  } else if (job.length == 0 || job.length > options_.slice_bytes) {
    st = absl::InvalidArgumentError(absl::StrCat("a staged slice of ", job.length, " bytes (1 to ",
                                                 options_.slice_bytes, ")"));
  }
  char* buf = nullptr;
  if (st.ok()) {
    absl::MutexLock l(&mu_);
    auto q = nn.qps.find(job.qpn);
    if (q == nn.qps.end() || q->second->dead) {
      // Its QP went: nobody to answer. A slot it holds goes back.
      if (job.slot >= 0) {
        if (std::optional<StageJob> next = ReleaseLocked(nn, job.slot, job.qpn)) {
          absl::MutexLock s(&stage_mu_);  // stage_mu_ ranks after mu_
          if (!stop_.load(std::memory_order_acquire)) jobs_.push_back(std::move(*next));
        }
      }
      return;
    }
    // A device of the peer reached after its grant was staged gets its pool
    // at its first record.
    if (job.slot < 0 && nn.bounce == nullptr) st = EnsurePoolLocked(nn);
    if (!st.ok()) {
      // refused below, with the reason
    } else if (job.slot < 0) {
      if (nn.free_bounce.empty()) {
        nn.waiting.push_back(std::move(job));  // at most kRecvDepth per QP: each holds a receive until answered
        return;
      } else {
        job.slot = nn.free_bounce.back();
        nn.free_bounce.pop_back();
        nn.holding[job.slot] = job;
      }
    }
    if (st.ok() && job.slot >= 0) buf = nn.bounce + uint64_t(job.slot) * options_.slice_bytes;
  }
  if (st.ok() && write && !job.landed) {
    // The importer's bytes into the bounce slot first.
    absl::MutexLock l(&mu_);
    auto q = nn.qps.find(job.qpn);
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf), job.length, nn.bounce_mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = StageWr(kSendRead, job.slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = job.addr;
    wr.wr.rdma.rkey = job.rkey;
    ibv_send_wr* bad = nullptr;
    if (q == nn.qps.end() || q->second->dead || api->post_send(q->second->qp, &wr, &bad) != 0) {
      if (q != nn.qps.end() && !q->second->dead) {
        q->second->dead = true;
        ToError(api, q->second->qp);  // the importer sees it fail and sends elsewhere
      }
      std::optional<StageJob> next = ReleaseLocked(nn, job.slot, job.qpn);
      if (next) {
        // Queue takes stage_mu_, which ranks after mu_.
        absl::MutexLock s(&stage_mu_);
        if (!stop_.load(std::memory_order_acquire)) jobs_.push_back(std::move(*next));
      }
    }
    return;
  }
  if (!st.ok()) return Answer(job, st);
  std::shared_ptr<const void> keep;
  {
    absl::MutexLock l(&mu_);
    auto h = nn.holding.find(job.slot);
    if (h == nn.holding.end() || h->second.qpn != job.qpn) return;  // its QP went meanwhile: the slot went with it
    h->second.in_sink = true;
    job.in_sink = true;
    keep = nn.bounce_memory;
  }
  if (write && job.guarded) {
    // In the sink until answered: a DONE of its transfer waits for it (this
    // thread also serves DONE records, so none came since the check above).
    absl::MutexLock x(&xfer_mu_);
    ++writing_[KeyOf(job)];
    job.counted = true;
  }
  stage_sink_(nn.node, job.grant, write, job.offset, buf, job.length, std::move(keep),
              [alive = alive_, job](absl::Status result) {
                absl::MutexLock l(&alive->mu);
                if (alive->server != nullptr) alive->server->Answer(job, result);
              });
}

void VerbsServer::Answer(const StageJob& job, const absl::Status& st) {
  const VerbsApi* api = nics_->api();
  NodeNic& nn = *job.nn;
  const bool write = job.kind == kRecordStagedWrite;
  if (job.counted) {
    // The transfer's last write in the sink answered: DONE records held for
    // it are answered now (before this slice's own acknowledgement: its
    // bytes are where they go already).
    std::vector<StageJob> released;
    {
      absl::MutexLock x(&xfer_mu_);
      const TransferKey key = KeyOf(job);
      auto it = writing_.find(key);
      if (it != writing_.end() && --it->second == 0) {
        writing_.erase(it);
        if (auto w = done_waiting_.find(key); w != done_waiting_.end()) {
          released = std::move(w->second);
          done_waiting_.erase(w);
        }
      }
    }
    for (const StageJob& d : released) Answer(d, absl::OkStatus());
  }
  if (job.kind == kRecordStagedDone && job.guarded) {
    if (st.ok()) staged_done_.fetch_add(1, std::memory_order_relaxed);
  } else if (job.dropped) {
    // counted as dropped
  } else if (st.ok()) {
    staged_slices_.fetch_add(1, std::memory_order_relaxed);
  } else {
    staged_refused_.fetch_add(1, std::memory_order_relaxed);
    if (Due(refused_log)) {
      Log()->warn("event=verbs_staged_refused peer={} grant={} write={} offset={} length={} why=\"{}\" (refused so far: {})",
                  nn.node, job.grant, write, job.offset, job.length, st.message(),
                  staged_refused_.load(std::memory_order_relaxed));
    }
  }
  // The answer: a good read's bytes, then the acknowledgement (same QP, so
  // in order), {slot, status} in its immediate.
  absl::MutexLock l(&mu_);
  if (job.slot >= 0) {
    auto h = nn.holding.find(job.slot);
    if (h != nn.holding.end() && h->second.qpn == job.qpn) h->second.in_sink = false;
  }
  char* buf = job.slot >= 0 && nn.bounce != nullptr ? nn.bounce + uint64_t(job.slot) * options_.slice_bytes : nullptr;
  auto q = nn.qps.find(job.qpn);
  bool posted = false;
  if (q != nn.qps.end() && !q->second->dead) {
    Served& served = *q->second;
    // The acknowledgement is sent from the QP's own mailbox (registered in
    // the same protection domain; its content does not matter), so a
    // refusal needs no bounce pool.
    ibv_sge word{reinterpret_cast<uintptr_t>(served.mailbox), kAckBytes, served.mr->lkey};
    ibv_sge data{reinterpret_cast<uintptr_t>(buf), job.length, nn.bounce_mr != nullptr ? nn.bounce_mr->lkey : 0};
    ibv_send_wr wrs[2]{};
    wrs[0].wr_id = StageWr(kSendData, job.slot);
    wrs[0].sg_list = &data;
    wrs[0].num_sge = 1;
    wrs[0].opcode = IBV_WR_RDMA_WRITE;
    wrs[0].wr.rdma.remote_addr = job.addr;
    wrs[0].wr.rdma.rkey = job.rkey;
    wrs[0].next = &wrs[1];
    wrs[1].wr_id = job.slot >= 0 ? StageWr(kSendAck, job.slot, job.recv_id) : StageWr(kSendRefusal, 0, job.recv_id);
    wrs[1].sg_list = &word;
    wrs[1].num_sge = 1;
    wrs[1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wrs[1].send_flags = IBV_SEND_SIGNALED;
    wrs[1].imm_data = htonl(AckImm(job.tag, st.code()));
    wrs[1].wr.rdma.remote_addr = job.ack_addr;
    wrs[1].wr.rdma.rkey = job.rkey;
    ibv_send_wr* bad = nullptr;
    posted = api->post_send(served.qp, st.ok() && !write && buf != nullptr ? &wrs[0] : &wrs[1], &bad) == 0;
    if (!posted) {
      served.dead = true;
      ToError(api, served.qp);
    }
  }
  if (!posted && job.slot >= 0) {
    std::optional<StageJob> next = ReleaseLocked(nn, job.slot, job.qpn);
    if (next) {
      absl::MutexLock s(&stage_mu_);
      if (!stop_.load(std::memory_order_acquire)) jobs_.push_back(std::move(*next));
    }
  }
}

}  // namespace podlink::mesh::verbs
