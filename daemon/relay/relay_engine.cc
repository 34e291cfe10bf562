#include "daemon/relay/relay_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"

namespace podlink {
namespace {

const ComponentLog RelayLog("relay");

constexpr uint64_t kWakeKey = ~uint64_t{0};

uint64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

RelayEngine::RelayEngine(Resolver resolve, const GpuInventory& inventory, RelayOptions options)
    : resolve_(std::move(resolve)), inventory_(inventory), options_(options) {
  int ngpu = 0;
  if (inventory_.cuda_available) {
    auto d = cu::LoadDriver();
    if (d.ok()) {
      cuda_ = *d;
      ngpu = static_cast<int>(inventory_.gpus.size());
      contexts_.assign(ngpu, nullptr);
      for (int g = 0; g < ngpu; ++g) {
        if (cuda_->DevicePrimaryCtxRetain(&contexts_[g], g) != cu::kSuccess) contexts_[g] = nullptr;
      }
    }
  }
  if (cuda_ != nullptr) stager_ = std::make_unique<MeshStager>(options_.mesh_staging_threads, options_.mesh_staging_bytes);
  size_t n = options_.workers;
  if (n == 0) n = std::clamp<size_t>(static_cast<size_t>(ngpu), 1, 8);
  for (size_t i = 0; i < n; ++i) {
    auto w = std::make_unique<Worker>();
    w->index = i;
    w->epoll.Reset(::epoll_create1(EPOLL_CLOEXEC));
    w->wake.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeKey;
    ::epoll_ctl(w->epoll.get(), EPOLL_CTL_ADD, w->wake.get(), &ev);
    w->exec = std::make_unique<CopyExecutor>(i, cuda_, contexts_, options_.streams_per_gpu,
                                             options_.bytes_per_event, options_.host_bytes_per_round,
                                             options_.merge_bytes);
    workers_.push_back(std::move(w));
  }
  {
    absl::MutexLock l(&mu_);
    load_.assign(n, 0);
  }
  for (auto& w : workers_) {
    Worker* p = w.get();
    w->thread = std::thread([this, p] { Run(*p); });
  }
}

RelayEngine::~RelayEngine() {
  stager_.reset();  // its jobs hold rings and call back into this engine
  stop_.store(true, std::memory_order_release);
  for (auto& w : workers_) Wake(*w);
  for (auto& w : workers_) w->thread.join();
  for (auto& w : workers_) {
    ApplyChanges(*w);  // rings added after the thread's last look are drained too
    for (auto& [id, r] : w->rings) w->exec->Drain(r->copies);
    w->rings.clear();
    w->exec.reset();  // its streams and events, before the contexts go
  }
  if (cuda_ != nullptr) {
    for (size_t g = 0; g < contexts_.size(); ++g) {
      if (contexts_[g] != nullptr) cuda_->DevicePrimaryCtxRelease(static_cast<int>(g));
    }
  }
}

void RelayEngine::Wake(Worker& w) {
  uint64_t one = 1;
  (void)!::write(w.wake.get(), &one, sizeof(one));
}

absl::Status RelayEngine::AddRing(uint64_t session, std::shared_ptr<MemoryObject> memory, const RingLayout& layout,
                                  UniqueFd doorbell) {
  PODLINK_ASSIGN_OR_RETURN(RelayView view, memory->MapForRelay());
  if (view.on_gpu || view.size < layout.total) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring memfd holds ", view.size, " bytes, the layout needs ", layout.total));
  }
  auto r = std::make_shared<Ring>();
  r->self = r;
  r->session = session;
  r->memory = std::move(memory);
  r->layout = layout;
  auto* base = reinterpret_cast<char*>(view.address);
  r->hdr = reinterpret_cast<RingHeader*>(base);
  // The client wrote the header; the daemon checks it once and from then on
  // uses only its own copy of the sizes.
  if (r->hdr->magic != kRingMagic || r->hdr->version != layout.version() || r->hdr->sq_entries != layout.sq_entries ||
      r->hdr->cq_entries != layout.cq_entries || r->hdr->nq_entries != layout.nq_entries) {
    return absl::InvalidArgumentError("ring header does not match the requested layout (magic, version or sizes)");
  }
  r->sq = reinterpret_cast<const volatile RelaySqe*>(base + layout.sq_offset);
  r->cq = reinterpret_cast<RelayCqe*>(base + layout.cq_offset);
  r->nq = reinterpret_cast<RelayNqe*>(base + layout.nq_offset);
  if (layout.message_slots != 0) {
    r->in = base + layout.in_offset;
    r->out = base + layout.out_offset;
  }
  r->sq_head = r->hdr->sq_head.value.load(std::memory_order_acquire);
  r->cq_tail = r->hdr->cq_tail.value.load(std::memory_order_acquire);
  {
    absl::MutexLock l(&r->nq_mu);
    r->nq_tail = r->hdr->nq_tail.value.load(std::memory_order_acquire);
  }
  r->hdr->daemon_status.value.store(0, std::memory_order_release);
  r->doorbell = std::move(doorbell);
  Worker* w = nullptr;
  {
    absl::MutexLock l(&mu_);
    if (sessions_.contains(session)) {
      return absl::FailedPreconditionError("this session already has a relay ring");
    }
    r->worker = static_cast<size_t>(std::min_element(load_.begin(), load_.end()) - load_.begin());
    ++load_[r->worker];
    sessions_[session] = r;
    rings_count_.store(sessions_.size(), std::memory_order_relaxed);
    w = workers_[r->worker].get();
  }
  {
    absl::MutexLock l(&w->mu);
    uint64_t id = r->session;
    w->changes.push_back({id, std::move(r)});
  }
  Wake(*w);
  return absl::OkStatus();
}

void RelayEngine::RemoveRing(uint64_t session) {
  Worker* w = nullptr;
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    size_t index = it->second->worker;
    --load_[index];
    sessions_.erase(it);
    rings_count_.store(sessions_.size(), std::memory_order_relaxed);
    w = workers_[index].get();
  }
  {
    absl::MutexLock l(&w->mu);
    w->changes.push_back({session, nullptr});
  }
  Wake(*w);
}

RelayCounters RelayEngine::Counters() const {
  RelayCounters c;
  c.ops = ops_.load(std::memory_order_relaxed);
  c.bytes = bytes_.load(std::memory_order_relaxed);
  c.failed = failed_.load(std::memory_order_relaxed);
  c.notifies = notifies_.load(std::memory_order_relaxed);
  c.broken_rings = broken_.load(std::memory_order_relaxed);
  c.rings = rings_count_.load(std::memory_order_relaxed);
  c.workers = static_cast<uint32_t>(workers_.size());
  return c;
}

void RelayEngine::ApplyChanges(Worker& w) {
  std::vector<Worker::Change> changes;
  {
    absl::MutexLock l(&w.mu);
    changes.swap(w.changes);
  }
  for (Worker::Change& c : changes) {
    if (c.ring != nullptr) {
      // Edge-triggered, and never read: the doorbell is shared with the client,
      // which can drain it first (a blocking read would then hang this worker)
      // or hold a huge count in semaphore mode (a level-triggered wait would
      // spin). Each client write is an edge; that is all the daemon needs.
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLET;
      ev.data.u64 = c.session;
      ::epoll_ctl(w.epoll.get(), EPOLL_CTL_ADD, c.ring->doorbell.get(), &ev);
      w.rings[c.session] = std::move(c.ring);
      continue;
    }
    auto it = w.rings.find(c.session);
    if (it == w.rings.end()) continue;
    w.exec->Drain(it->second->copies);
    // Whatever the client still queues here is never served: say so, so its
    // engine fails those transfers now instead of waiting out its timeout.
    uint32_t unserved = 0;
    it->second->hdr->daemon_status.value.compare_exchange_strong(
        unserved, static_cast<uint32_t>(absl::StatusCode::kUnavailable), std::memory_order_release);
    ::epoll_ctl(w.epoll.get(), EPOLL_CTL_DEL, it->second->doorbell.get(), nullptr);
    w.rings.erase(it);
  }
}

void RelayEngine::Run(Worker& w) {
  uint64_t idle_since = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    ApplyChanges(w);
    bool progress = false;
    bool inflight = false;
    // Round robin: start at a different ring each round.
    if (!w.rings.empty()) {
      auto it = w.rings.begin();
      std::advance(it, static_cast<long>(w.round++ % w.rings.size()));
      for (size_t i = 0; i < w.rings.size(); ++i, ++it) {
        if (it == w.rings.end()) it = w.rings.begin();
        Ring& r = *it->second;
        if (r.broken.load(std::memory_order_relaxed)) continue;
        progress |= w.exec->PollGpu(r.copies, Completer(r));
        progress |= w.exec->RunHost(r.copies, Completer(r));
        progress |= DrainMesh(r);
        progress |= FlushNotifies(r);
        progress |= ServeRing(w, r);
        // Mesh ops wake the worker when they complete: waiting for them is
        // not a reason to spin.
        inflight |= r.copies.pending() != 0 || (!r.notifies.empty() && r.mesh_running.empty());
      }
    }
    if (progress || inflight) {
      idle_since = 0;
      continue;
    }
    uint64_t now = NowUs();
    if (idle_since == 0) idle_since = now;
    if (now - idle_since < options_.spin_before_sleep_us) continue;
    Sleep(w);
    idle_since = 0;
  }
}

void RelayEngine::Sleep(Worker& w) {
  // Announce the sleep, then look once more so a request that raced with the
  // announcement is not left waiting for a doorbell that will never ring.
  for (auto& [id, r] : w.rings) r->hdr->daemon_idle.value.store(1, std::memory_order_seq_cst);
  bool work = false;
  for (auto& [id, r] : w.rings) {
    if (r->broken.load(std::memory_order_relaxed) ||
        r->hdr->sq_tail.value.load(std::memory_order_seq_cst) == r->sq_head) {
      continue;
    }
    // Queued requests are work only while their completions have room: a
    // client that never drains its CQ must not keep this thread spinning.
    uint32_t cq_used = r->cq_tail - r->hdr->cq_head.value.load(std::memory_order_seq_cst);
    if (cq_used < r->layout.cq_entries) work = true;
  }
  for (auto& [id, r] : w.rings) {
    absl::MutexLock l(&r->mesh_mu);
    if (!r->mesh_done.empty()) work = true;
  }
  if (!work) {
    epoll_event events[32];
    int n = ::epoll_wait(w.epoll.get(), events, 32, 1000);
    for (int i = 0; i < n; ++i) {
      uint64_t v;
      // Only the daemon's own (non-blocking) wake eventfd is ever read.
      if (events[i].data.u64 == kWakeKey) (void)!::read(w.wake.get(), &v, sizeof(v));
    }
  }
  for (auto& [id, r] : w.rings) r->hdr->daemon_idle.value.store(0, std::memory_order_seq_cst);
}

bool RelayEngine::ServeRing(Worker& w, Ring& r) {
  uint32_t tail = r.hdr->sq_tail.value.load(std::memory_order_acquire);
  uint32_t avail = tail - r.sq_head;
  if (avail == 0) return false;
  if (avail > r.layout.sq_entries) {
    Break(r, absl::StrCat("sq_tail ", tail, " is more than ", r.layout.sq_entries, " ahead of sq_head ", r.sq_head));
    return false;
  }
  uint32_t cq_head = r.hdr->cq_head.value.load(std::memory_order_acquire);
  uint32_t cq_used = r.cq_tail - cq_head;
  if (cq_used > r.layout.cq_entries) {
    Break(r, absl::StrCat("cq_head ", cq_head, " is not within ", r.layout.cq_entries, " of cq_tail ", r.cq_tail));
    return false;
  }
  // Every consumed SQE will post one CQE: take only what the CQ can hold.
  uint64_t pending = r.notifies.size() + r.copies.pending() + r.mesh_running.size();
  uint64_t room = r.layout.cq_entries - cq_used;
  room = room > pending ? room - pending : 0;
  uint64_t cap = options_.inflight_per_ring > pending ? options_.inflight_per_ring - pending : 0;
  // Let a backlog build in the queue while the copy engines are busy: taken
  // together later, contiguous requests merge into fewer, larger copies.
  if (options_.merge_bytes != 0 && r.copies.gpu_bytes() >= options_.inflight_gpu_bytes) cap = 0;
  uint32_t n = static_cast<uint32_t>(std::min<uint64_t>({avail, room, options_.batch_per_ring, cap}));
  w.round_start_ns = NowNs();
  for (uint32_t i = 0; i < n; ++i) {
    RelaySqe e;
    // One copy out of shared memory; everything after looks only at `e`.
    const volatile RelaySqe& src = r.sq[(r.sq_head + i) & (r.layout.sq_entries - 1)];
    e.user_data = src.user_data;
    e.opcode = src.opcode;
    e.flags = src.flags;
    e.local_export = src.local_export;
    e.local_offset = src.local_offset;
    e.remote_export = src.remote_export;
    e.remote_offset = src.remote_offset;
    e.length = src.length;
    e.reserved = src.reserved;
    Process(w, r, e);
    if (r.broken.load(std::memory_order_relaxed)) {
      w.exec->SealRound(r.copies, Completer(r));  // copies already issued still get their event
      return true;
    }
  }
  w.exec->SealRound(r.copies, Completer(r));
  r.sq_head += n;
  r.hdr->sq_head.value.store(r.sq_head, std::memory_order_release);
  return n > 0;
}

void RelayEngine::Process(Worker& w, Ring& r, const RelaySqe& e) {
  if (e.flags != 0 || e.reserved != 0) {
    return Complete(r, e.user_data, absl::InvalidArgumentError("flags and reserved must be 0"));
  }
  switch (static_cast<RelayOp>(e.opcode)) {
    case RelayOp::kWrite:
    case RelayOp::kRead: {
      absl::Status st = IsRemoteHandle(e.remote_export) ? MeshCopy(w, r, e) : Copy(w, r, e);
      if (!st.ok()) Complete(r, e.user_data, st);  // refused or not started: completed now
      return;
    }
    case RelayOp::kNotify:
    case RelayOp::kNotifyMessage: {
      PendingNotify p;
      p.after_seq = CopyExecutor::LastSeq(r.copies);
      p.after_mesh = r.mesh_seq;
      p.sqe = e;
      if (static_cast<RelayOp>(e.opcode) == RelayOp::kNotifyMessage) {
        // The bytes are copied out of shared memory now, once: the client
        // may reuse the slot as soon as the completion arrives, and never
        // sees the daemon read it twice.
        if (r.out == nullptr) {
          return Complete(r, e.user_data,
                          absl::FailedPreconditionError("a notification with bytes needs a version 2 ring"));
        }
        if (e.local_offset >= r.layout.message_slots || e.length > kRingMessageBytes) {
          return Complete(r, e.user_data,
                          absl::InvalidArgumentError(absl::StrCat(
                              "message slot ", e.local_offset, " (of ", r.layout.message_slots, ") or length ",
                              e.length, " (at most ", kRingMessageBytes, " bytes) out of range")));
        }
        if (IsRemoteHandle(e.remote_export)) {
          return Complete(r, e.user_data,
                          absl::UnimplementedError("notifications with bytes do not cross nodes yet (notifications "
                                                   "of a value alone do)"));
        }
        p.message.assign(const_cast<const char*>(r.out) + e.local_offset * kRingMessageBytes, e.length);
        p.has_message = true;
      }
      r.notifies.push_back(std::move(p));
      return;
    }
  }
  Complete(r, e.user_data, absl::InvalidArgumentError(absl::StrCat("unknown relay opcode ", e.opcode)));
}

absl::Status RelayEngine::Copy(Worker& w, Ring& r, const RelaySqe& e) {
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<const ExportRecord> local, resolve_(r.session, e.local_export));
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<const ExportRecord> remote, resolve_(r.session, e.remote_export));
  auto in_bounds = [&](const ExportRecord& x, uint64_t off, const char* which) -> absl::Status {
    if (e.length == 0) return absl::InvalidArgumentError("length must be > 0");
    if (off > x.size || e.length > x.size - off) {  // no overflow: compare against what remains
      return absl::OutOfRangeError(absl::StrCat(which, " range [", off, ", +", e.length, ") exceeds export ", x.id,
                                                " of ", x.size, " bytes"));
    }
    return absl::OkStatus();
  };
  PODLINK_RETURN_IF_ERROR(in_bounds(*local, e.local_offset, "local"));
  PODLINK_RETURN_IF_ERROR(in_bounds(*remote, e.remote_offset, "remote"));
  PODLINK_ASSIGN_OR_RETURN(RelayView lv, local->memory->CopyView());
  PODLINK_ASSIGN_OR_RETURN(RelayView rv, remote->memory->CopyView());
  bool write = static_cast<RelayOp>(e.opcode) == RelayOp::kWrite;
  const RelayView& src = write ? lv : rv;
  const RelayView& dst = write ? rv : lv;
  uint64_t src_addr = src.address + (write ? e.local_offset : e.remote_offset);
  uint64_t dst_addr = dst.address + (write ? e.remote_offset : e.local_offset);
  // The same daemon mapping on both sides (addresses of two processes'
  // memory, or of one through a bounce buffer, may coincide harmlessly).
  if (src_addr < dst_addr + e.length && dst_addr < src_addr + e.length && src.address == dst.address &&
      src.mem_fd < 0 && dst.mem_fd < 0) {
    return absl::InvalidArgumentError("source and destination ranges overlap");
  }
  CopyRequest c;
  c.tag = e.user_data;
  c.start_ns = w.round_start_ns;
  c.src_view = src;
  c.dst_view = dst;
  c.src_off = write ? e.local_offset : e.remote_offset;
  c.dst_off = write ? e.remote_offset : e.local_offset;
  c.length = e.length;
  c.src = write ? std::move(local) : std::move(remote);
  c.dst = write ? std::move(remote) : std::move(local);
  PODLINK_RETURN_IF_ERROR(w.exec->Submit(r.copies, std::move(c)));
  ops_.fetch_add(1, std::memory_order_relaxed);  // counted before any completion is posted
  bytes_.fetch_add(e.length, std::memory_order_relaxed);
  w.exec->SealFull(r.copies, Completer(r));
  return absl::OkStatus();
}

bool RelayEngine::FlushNotifies(Ring& r) {
  bool progress = false;
  while (!r.notifies.empty()) {
    const PendingNotify& p = r.notifies.front();
    if (r.copies.HasRunningUpTo(p.after_seq)) break;  // a copy issued before the notify still runs
    if (!r.mesh_running.empty() && *r.mesh_running.begin() <= p.after_mesh) break;  // so does a mesh op
    if (IsRemoteHandle(p.sqe.remote_export)) {
      // Sent once every earlier op is acknowledged by its destination, so
      // the owner on the other node sees the bytes before the value.
      uint64_t seq = ++r.mesh_seq;
      absl::Status st;
      {
        absl::ReaderMutexLock l(&mesh_port_mu_);
        st = mesh_ == nullptr ? absl::UnavailableError("this podlinkd has no mesh")
                              : mesh_->Notify(r.session, p.sqe.remote_export, p.sqe.length,
                                              MeshCompleter(r, seq, p.sqe.user_data));
      }
      if (st.ok()) {
        r.mesh_running.insert(seq);
        notifies_.fetch_add(1, std::memory_order_relaxed);
      } else {
        Complete(r, p.sqe.user_data, st);
      }
      r.notifies.pop_front();
      progress = true;
      continue;
    }
    absl::Status st = DeliverNotify(r, p);
    Complete(r, p.sqe.user_data, st);
    r.notifies.pop_front();
    progress = true;
  }
  return progress;
}

absl::Status RelayEngine::DeliverNotify(Ring& from, const PendingNotify& p) {
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<const ExportRecord> target, resolve_(from.session, p.sqe.remote_export));
  if (p.has_message) {
    return PostNotification(target->owner_session, target->id, p.sqe.remote_offset, from.session, &p.message);
  }
  return PostNotification(target->owner_session, target->id, p.sqe.length, from.session);
}

absl::Status RelayEngine::PostNotification(uint64_t owner_session, uint64_t export_id, uint64_t value,
                                           uint64_t from_session, const std::string* message) {
  std::shared_ptr<Ring> to;
  {
    absl::MutexLock l(&mu_);
    if (auto it = sessions_.find(owner_session); it != sessions_.end()) to = it->second;
  }
  if (to == nullptr || to->broken.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the owner of export ", export_id, " has no relay ring open to receive notifications"));
  }
  if (message != nullptr && to->in == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the owner of export ", export_id,
                     " takes no notifications with bytes (its libpodlink opened a version 1 relay ring)"));
  }
  absl::MutexLock l(&to->nq_mu);  // the target ring may belong to another worker
  uint32_t head = to->hdr->nq_head.value.load(std::memory_order_acquire);
  uint32_t used = to->nq_tail - head;
  if (used >= to->layout.nq_entries) {
    return absl::ResourceExhaustedError("the peer's notification queue is full (it is not polling notifications)");
  }
  const uint32_t slot = to->nq_tail & (to->layout.nq_entries - 1);
  RelayNqe& n = to->nq[slot];
  n.export_id = export_id;
  n.value = value;
  n.from_session = from_session;
  n.message = 0;
  if (message != nullptr) {  // its length was checked when it was taken off the sender's ring
    std::memcpy(to->in + size_t{slot} * kRingMessageBytes, message->data(), message->size());
    n.message = kNqeHasMessage | message->size();
  }
  ++to->nq_tail;
  to->hdr->nq_tail.value.store(to->nq_tail, std::memory_order_release);
  notifies_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status RelayEngine::MeshCopy(Worker& w, Ring& r, const RelaySqe& e) {
  if (IsRemoteHandle(e.local_export)) return absl::InvalidArgumentError("the local side must be a local export");
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<const ExportRecord> local, resolve_(r.session, e.local_export));
  if (e.length == 0) return absl::InvalidArgumentError("length must be > 0");
  if (e.local_offset > local->size || e.length > local->size - e.local_offset) {
    return absl::OutOfRangeError(absl::StrCat("local range [", e.local_offset, ", +", e.length, ") exceeds export ",
                                              local->id, " of ", local->size, " bytes"));
  }
  PODLINK_ASSIGN_OR_RETURN(RelayView lv, local->memory->MapForRelay());
  // Pages the pod punched out are refused, never faulted in by podlinkd (the
  // mesh's connections read and write this range for the whole transfer).
  PODLINK_RETURN_IF_ERROR(local->memory->CheckPopulated(e.local_offset, e.length));
  MeshTransfer t;
  t.write = static_cast<RelayOp>(e.opcode) == RelayOp::kWrite;
  t.session = r.session;
  t.handle = e.remote_export;
  t.remote_offset = e.remote_offset;
  t.length = e.length;
  t.local = reinterpret_cast<char*>(lv.address) + e.local_offset;
  uint64_t seq = r.mesh_seq + 1;
  MeshPort::Done done = MeshCompleter(r, seq, e.user_data);
  if (lv.on_gpu) return MeshCopyGpu(r, e, std::move(local), std::move(t), seq, std::move(done));
  t.keep = std::move(local);
  {
    absl::ReaderMutexLock l(&mesh_port_mu_);
    absl::Status st = mesh_ == nullptr
                          ? absl::UnavailableError("region lives on another node and this podlinkd runs without the mesh")
                          : mesh_->Start(std::move(t), std::move(done));
    if (!st.ok()) return st;
  }
  MeshStarted(r, seq, e.length);
  (void)w;
  return absl::OkStatus();
}

// GPU memory: through a host buffer of the transfer's size (the mesh links
// move host memory), copied by the GPU's copy engine before a write starts
// and after a read completes. The copies run on the stager's threads, not on
// this worker (its other rings go on meanwhile) nor on a mesh link's thread;
// bounded per ring. The request counts as running from here, so a later
// notify of the ring waits for it.
absl::Status RelayEngine::MeshCopyGpu(Ring& r, const RelaySqe& e, std::shared_ptr<const ExportRecord> local,
                                      MeshTransfer t, uint64_t seq, MeshPort::Done done) {
  const uint64_t cap = options_.mesh_staging_bytes;
  if (e.length > cap) {
    return absl::InvalidArgumentError(absl::StrCat("a transfer between GPU memory and another node moves at most ",
                                                   cap, " bytes (split it)"));
  }
  if (stager_ == nullptr) return absl::FailedPreconditionError("GPU memory without CUDA in podlinkd");
  if (r.mesh_staged.fetch_add(e.length) + e.length > cap) {
    r.mesh_staged.fetch_sub(e.length);
    return absl::ResourceExhaustedError(absl::StrCat(
        "this session has ", cap, " bytes of GPU transfers to other nodes in flight already; wait for some"));
  }
  std::shared_ptr<char[]> staging = stager_->Buffer(e.length);
  if (staging == nullptr) {
    r.mesh_staged.fetch_sub(e.length);
    return absl::ResourceExhaustedError("no memory for GPU staging");
  }
  std::shared_ptr<Ring> ring = r.self.lock();
  const bool write = t.write;
  const uint64_t off = e.local_offset, len = e.length;
  t.local = staging.get();
  t.staging = staging;
  t.keep = local;
  // Completion: the staging budget back, and for a read its copy to the GPU
  // first (on a stager thread).
  auto complete = [ring, len, done = std::move(done)](const absl::Status& st) {
    ring->mesh_staged.fetch_sub(len);
    done(st);
  };
  MeshPort::Done finish = [this, complete, local, staging, write, off, len](const absl::Status& st) {
    if (!st.ok() || write) return complete(st);
    if (!stager_->Post([this, complete, local, staging, off, len] {
          complete(StagingCopy(true, *local, off, staging.get(), len));
        })) {
      complete(absl::UnavailableError("podlinkd is stopping"));
    }
  };
  auto start = [this, t = std::move(t), finish, local, staging, write, off, len]() mutable {
    absl::Status st = write ? StagingCopy(false, *local, off, staging.get(), len) : absl::OkStatus();
    if (st.ok()) {
      absl::ReaderMutexLock l(&mesh_port_mu_);
      st = mesh_ == nullptr
               ? absl::UnavailableError("region lives on another node and this podlinkd runs without the mesh")
               : mesh_->Start(std::move(t), finish);
    }
    if (!st.ok()) finish(st);  // not started: its completion is ours to post
  };
  if (!stager_->Post(std::move(start))) {
    r.mesh_staged.fetch_sub(e.length);
    return absl::UnavailableError("podlinkd is stopping");
  }
  MeshStarted(r, seq, e.length);
  return absl::OkStatus();
}

void RelayEngine::MeshStarted(Ring& r, uint64_t seq, uint64_t length) {
  r.mesh_seq = seq;
  r.mesh_running.insert(seq);
  ops_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(length, std::memory_order_relaxed);
}

absl::Status RelayEngine::StagingCopy(bool to_gpu, const ExportRecord& rec, uint64_t offset, char* buf,
                                      uint64_t length) {
  const uint64_t t0 = NowNs();
  absl::Status st = to_gpu ? rec.memory->CopyIn(offset, buf, length) : rec.memory->CopyOut(offset, buf, length);
  if (st.ok()) stager_->copy_latency().Observe(static_cast<double>(NowNs() - t0) * 1e-9);
  return st;
}

MeshPort::Done RelayEngine::MeshCompleter(Ring& r, uint64_t seq, uint64_t tag) {
  std::shared_ptr<Ring> ring = r.self.lock();
  Worker* w = workers_[r.worker].get();
  uint64_t start = NowNs();
  return [this, ring, w, seq, tag, start](const absl::Status& st) {
    if (st.ok()) latency_.Observe(static_cast<double>(NowNs() - start) * 1e-9);
    {
      absl::MutexLock l(&ring->mesh_mu);
      ring->mesh_done.push_back({seq, tag, st});
    }
    Wake(*w);
  };
}

bool RelayEngine::DrainMesh(Ring& r) {
  std::vector<Ring::MeshDone> done;
  {
    absl::MutexLock l(&r.mesh_mu);
    done.swap(r.mesh_done);
  }
  for (const Ring::MeshDone& d : done) {
    r.mesh_running.erase(d.seq);
    Complete(r, d.tag, d.status);
  }
  return !done.empty();
}

void RelayEngine::Complete(Ring& r, uint64_t user_data, const absl::Status& st) {
  if (!st.ok()) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    // The completion carries only the code: the reason is logged, one a
    // second per ring at info (a client's flood of bad ops stays at debug).
    const uint64_t now = NowNs();
    if (r.fail_logged_ns == 0 || now - r.fail_logged_ns >= 1'000'000'000) {
      RelayLog()->info("event=relay_op_failed session={} user_data={} code={} error={} failed_unlogged={}", r.session,
                       user_data, absl::StatusCodeToString(st.code()), LogQuoted(st.message()), r.fails_unlogged);
      r.fail_logged_ns = now;
      r.fails_unlogged = 0;
    } else {
      ++r.fails_unlogged;
      RelayLog()->debug("event=relay_op_failed session={} user_data={} error={}", r.session, user_data,
                        LogQuoted(st.message()));
    }
  }
  if (r.broken.load(std::memory_order_relaxed)) return;
  RelayCqe& c = r.cq[r.cq_tail & (r.layout.cq_entries - 1)];
  c.user_data = user_data;
  c.status = static_cast<int32_t>(st.code());
  c.reserved = 0;
  ++r.cq_tail;
  r.hdr->cq_tail.value.store(r.cq_tail, std::memory_order_release);
}

void RelayEngine::Break(Ring& r, const std::string& why) {
  r.broken.store(true, std::memory_order_relaxed);
  broken_.fetch_add(1, std::memory_order_relaxed);
  r.hdr->daemon_status.value.store(static_cast<uint32_t>(absl::StatusCode::kDataLoss), std::memory_order_release);
  RelayLog()->warn("event=relay_ring_broken session={} reason={}", r.session, LogQuoted(why));
}

std::string RelayEngine::RenderMetrics() const {
  RelayCounters rc = Counters();
  std::string out;
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    RenderFamily(&out, name, type, help, {{"", v}});
  };
  one("podlink_relay_rings", "gauge", "relay rings served", static_cast<double>(rc.rings));
  one("podlink_relay_workers", "gauge", "relay threads", static_cast<double>(rc.workers));
  one("podlink_relay_ops_total", "counter", "relay transfers issued", static_cast<double>(rc.ops));
  one("podlink_relay_bytes_total", "counter", "bytes moved by the relay", static_cast<double>(rc.bytes));
  one("podlink_relay_failed_total", "counter", "relay requests that failed", static_cast<double>(rc.failed));
  one("podlink_relay_notifies_total", "counter", "notifications delivered", static_cast<double>(rc.notifies));
  one("podlink_relay_broken_rings_total", "counter", "rings no longer served (corrupted)",
      static_cast<double>(rc.broken_rings));
  absl::StrAppend(&out, "# HELP podlink_relay_op_latency_seconds relay request from ring to completion\n",
                  "# TYPE podlink_relay_op_latency_seconds histogram\n");
  latency_.Render("podlink_relay_op_latency_seconds", &out);
  if (stager_ != nullptr) {
    absl::StrAppend(&out, "# HELP podlink_mesh_gpu_staging_copy_seconds copies between a pod's GPU memory and ",
                    "host staging for other nodes (importing side)\n",
                    "# TYPE podlink_mesh_gpu_staging_copy_seconds histogram\n");
    stager_->copy_latency().Render("podlink_mesh_gpu_staging_copy_seconds", &out);
    one("podlink_mesh_gpu_staging_queued", "gauge", "staging copies and mesh starts waiting for a stager thread",
        static_cast<double>(stager_->queued()));
  }
  return out;
}

}  // namespace podlink
