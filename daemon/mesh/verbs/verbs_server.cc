// The exporting side of the verbs transport (VerbsServer): accepting
// queue pairs, registrations, notifications and staged slices.
#include "daemon/mesh/verbs/verbs_internal.h"

namespace podlink::mesh::verbs {
namespace {
const ComponentLog ServerLog("mesh");
}  // namespace

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
          std::clamp<uint64_t>((uint64_t{32} << 20) / std::max<uint64_t>(options_.slice_bytes, 1), 2, kStageSlots))),
      late_copies_(LateCopies::Limits{8192, 8, 1024, std::max(absl::Minutes(1), 2 * options_.answer_timeout)}) {
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
    ServerLog()->info("event=verbs_qps_dropped peer={} count={} why=\"{}\"", node, gone.size(),
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
  ServerLog()->info("event=verbs_accept peer={} device={} gid={} peer_gid={} qps={}", node, nic->name(), Gid(gid.gid),
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
              ServerLog()->warn("event=verbs_peer_qp_failed peer={} qp={} status={}", nn->node, wc.qp_num,
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
  ServerLog()->info("event=verbs_bounce_pool peer={} device={} slots={} slot_kib={}", nn.node, nn.nic->name(), stage_slots_,
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
    ServerLog()->warn("event=verbs_peer_qp_failed peer={} qp={} why=\"post_recv: {}\"", nn.node, qpn, std::strerror(rc));
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

LateCopies::Key VerbsServer::LateKeyOf(const StageJob& job) {
  return {job.nn->node, job.link_instance, job.transfer};
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
      late_copies_.Finish(LateKeyOf(job));
      if (late_copies_.Writing(LateKeyOf(job))) {
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
    if (late_copies_.Finished(LateKeyOf(job))) {
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
    job.counted = late_copies_.BeginWrite(LateKeyOf(job));  // true: no DONE since the check above
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
      if (late_copies_.EndWrite(LateKeyOf(job))) {
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
    if (refused_log.Due()) {
      ServerLog()->warn("event=verbs_staged_refused peer={} grant={} write={} offset={} length={} why=\"{}\" (refused so far: {})",
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
