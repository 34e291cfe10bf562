// The importing side of the verbs transport (VerbsLinks): paths, lanes,
// slices and their completions.
#include "daemon/mesh/verbs/verbs_internal.h"

namespace podlink::mesh::verbs {
namespace {
const ComponentLog Log("mesh");
}  // namespace

// --- importing side ------------------------------------------------------------

struct VerbsLinks::OpState : Transfer {
  // Set before its slices are queued, read-only after: the local memory's
  // registration per path (none: every slice is copied through staging).
  std::vector<std::pair<const Path*, std::shared_ptr<LocalReg>>> regs;
};

uint32_t VerbsLinks::LkeyFor(const Slice& s, const Path* p) {
  for (const auto& [path, reg] : static_cast<const OpState&>(*s.op).regs) {
    if (path == p && reg->mr != nullptr) return reg->mr->lkey;
  }
  return 0;
}

VerbsLinks::LocalReg::~LocalReg() {
  if (mr != nullptr) api->dereg_mr(mr);
}

VerbsLinks::VerbsLinks(std::string node, VerbsOptions options)
    : node_(std::move(node)),
      options_(std::move(options)),
      instance_(RandomInstance()),
      sched_(&mu_,
             SliceScheduler::Options{.max_attempts = kMaxAttempts, .done_after_failure = true,
                                     .empty_is_one_slice = false},
             [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
               return !stop_.load(std::memory_order_acquire) && stats_.connections_up > 0;
             },
             [this] { Pump(); },
             absl::StrCat("no verbs queue pair to node ", node_, " is up to end a staged write sent partly twice")) {}

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
    std::vector<Slice> queued = sched_.TakeAll();
    left.insert(left.end(), std::make_move_iterator(queued.begin()), std::make_move_iterator(queued.end()));
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
  for (const Slice& s : left) sched_.Settle(s, absl::UnavailableError("verbs link to node " + node_ + " closed"));
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
    if (op.length == 0) return absl::InvalidArgumentError("length must be > 0");
    absl::MutexLock l(&mu_);
    if (auto it = staged_regions_.find(op.grant); it != staged_regions_.end()) {
      slice = it->second;
      staged = true;
    }
  }
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
    PODLINK_RETURN_IF_ERROR(sched_.Cut(std::move(st), slice));
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
    size_t resume = 0;           // the slices before it were skipped: no lane they may use has room left
    while (!lanes.empty()) {
      // The lane with the most room takes the slice (faster lanes drain
      // their slots sooner, so they take more: striping by pull). A slice
      // whose preferred paths (nic_rank.h) have no room waits for them while
      // later ones go.
      Lane* best = nullptr;
      std::optional<Slice> taken = sched_.Next([&](const Slice& s) {
        const bool notify = s.op->op.type == FrameType::kNotify;
        best = nullptr;
        size_t room = 0;
        bool restricted = false;
        for (size_t k = 0; k < lanes.size(); ++k) {
          Lane* lane = lanes[(next_lane_ + k) % lanes.size()];
          if (s.op->op.prefer != nullptr && up.empty()) {
            for (Lane* l : lanes) up.insert(l->path->name);
          }
          if (!SliceScheduler::MayCarry(s, lane->path->name, up)) {
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
        if (best != nullptr) return SliceScheduler::Verdict::kTake;
        return restricted ? SliceScheduler::Verdict::kSkip : SliceScheduler::Verdict::kStop;  // no lane has room
      }, &resume);
      if (!taken.has_value()) break;
      Slice& s = *taken;
      const bool notify = s.op->op.type == FrameType::kNotify;
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
        continue;
      }
      if (r.staged && r.records < kRecordsStaged) {
        failed.emplace_back(std::move(s), absl::FailedPreconditionError(absl::StrCat(
                                              "node ", node_, " stages this region but its queue pairs on device ",
                                              best->path->remote_device, " do not take staged records")));
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
          continue;
        }
        r.post.slot = best->free_slots.back();
        best->free_slots.pop_back();
        r.remote_addr = key->base + s.op->op.offset + s.offset;
        r.rkey = key->rkey;
        r.post.lkey = LkeyFor(s, best->path);
      }
      SliceScheduler::Sent(s);
      r.post.slice = std::move(s);
      best->pending[r.post.wr_id] = Pending{r.post.slice, r.post.slot, r.post.lkey != 0, r.staged, absl::Now()};
      if (r.post.lkey != 0) ++stats_.zero_copy_slices;
      ready.push_back(std::move(r));
    }
  }
  for (auto& [s, st] : failed) sched_.Settle(s, st);
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
      rec.transfer = r.post.slice.op->number;
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
        sched_.Settle(pend.slice, absl::OkStatus());
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
    if (unexpected_ack_log.Due()) {
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
  sched_.Settle(pend.slice, st);
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
      // A notification may have arrived: never sent twice.
      const bool notify = s.op->op.type == FrameType::kNotify;
      if (!notify && sched_.Resend(s, /*mark_resent=*/false, /*nothing_left=*/stats_.connections_up == 0)) {
        if (!s.done_record) ++stats_.resent_slices;
      } else {
        finish.emplace_back(std::move(s), why);
      }
    }
    if (stats_.connections_up == 0) {
      for (Slice& s : sched_.TakeAll()) finish.emplace_back(std::move(s), why);
    }
  }
  for (auto& [s, st] : finish) sched_.Settle(s, st);
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

}  // namespace podlink::mesh::verbs
