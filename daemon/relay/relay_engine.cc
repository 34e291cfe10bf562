#include "daemon/relay/relay_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"

namespace podlink {
namespace {

std::shared_ptr<spdlog::logger> Log() {
  static auto l = spdlog::get("relay");
  return l ? l : spdlog::default_logger();
}

constexpr uint64_t kWakeKey = ~uint64_t{0};

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

RelayEngine::RelayEngine(Resolver resolve, const GpuInventory& inventory, RelayOptions options)
    : resolve_(std::move(resolve)), inventory_(inventory), options_(options) {
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeKey;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
  if (inventory_.cuda_available) {
    auto d = cu::LoadDriver();
    if (d.ok()) {
      cuda_ = *d;
      int n = static_cast<int>(inventory_.gpus.size());
      contexts_.assign(n, nullptr);
      streams_.assign(n, {});
      next_stream_.assign(n, 0);
      for (int g = 0; g < n; ++g) {
        if (cuda_->DevicePrimaryCtxRetain(&contexts_[g], g) != cu::kSuccess) {
          contexts_[g] = nullptr;
          continue;
        }
        cuda_->CtxSetCurrent(contexts_[g]);
        for (uint32_t i = 0; i < options_.streams_per_gpu; ++i) {
          cu::Stream s = nullptr;
          if (cuda_->StreamCreate(&s, cu::kStreamNonBlocking) == cu::kSuccess) streams_[g].push_back(s);
        }
      }
    }
  }
  thread_ = std::thread([this] { Run(); });
}

RelayEngine::~RelayEngine() {
  stop_.store(true, std::memory_order_release);
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  thread_.join();
  for (auto& [id, r] : rings_) Drain(*r);
  if (cuda_ != nullptr) {
    for (cu::Event e : free_events_) cuda_->EventDestroy(e);
    for (size_t g = 0; g < streams_.size(); ++g) {
      for (cu::Stream s : streams_[g]) cuda_->StreamDestroy(s);
      if (contexts_[g] != nullptr) cuda_->DevicePrimaryCtxRelease(static_cast<int>(g));
    }
  }
}

absl::Status RelayEngine::AddRing(uint64_t session, std::shared_ptr<MemoryObject> memory, const RingLayout& layout,
                                  UniqueFd doorbell) {
  PODLINK_ASSIGN_OR_RETURN(RelayView view, memory->MapForRelay());
  if (view.on_gpu || view.size < layout.total) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring memfd holds ", view.size, " bytes, the layout needs ", layout.total));
  }
  auto r = std::make_unique<Ring>();
  r->session = session;
  r->memory = std::move(memory);
  r->layout = layout;
  auto* base = reinterpret_cast<char*>(view.address);
  r->hdr = reinterpret_cast<RingHeader*>(base);
  // The client wrote the header; the daemon checks it once and from then on
  // uses only its own copy of the sizes.
  if (r->hdr->magic != kRingMagic || r->hdr->version != kRingVersion || r->hdr->sq_entries != layout.sq_entries ||
      r->hdr->cq_entries != layout.cq_entries || r->hdr->nq_entries != layout.nq_entries) {
    return absl::InvalidArgumentError("ring header does not match the requested layout (magic, version or sizes)");
  }
  r->sq = reinterpret_cast<const volatile RelaySqe*>(base + layout.sq_offset);
  r->cq = reinterpret_cast<RelayCqe*>(base + layout.cq_offset);
  r->nq = reinterpret_cast<RelayNqe*>(base + layout.nq_offset);
  r->sq_head = r->hdr->sq_head.value.load(std::memory_order_acquire);
  r->cq_tail = r->hdr->cq_tail.value.load(std::memory_order_acquire);
  r->nq_tail = r->hdr->nq_tail.value.load(std::memory_order_acquire);
  r->hdr->daemon_status.value.store(0, std::memory_order_release);
  r->doorbell = std::move(doorbell);
  {
    absl::MutexLock l(&mu_);
    if (registered_.contains(session)) {
      return absl::FailedPreconditionError("this session already has a relay ring");
    }
    registered_[session] = true;
    to_add_.emplace_back(session, std::move(r));
  }
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  return absl::OkStatus();
}

void RelayEngine::RemoveRing(uint64_t session) {
  {
    absl::MutexLock l(&mu_);
    if (registered_.erase(session) == 0) return;
    to_remove_.push_back(session);
  }
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
}

RelayCounters RelayEngine::Counters() const {
  RelayCounters c;
  c.ops = ops_.load(std::memory_order_relaxed);
  c.bytes = bytes_.load(std::memory_order_relaxed);
  c.failed = failed_.load(std::memory_order_relaxed);
  c.notifies = notifies_.load(std::memory_order_relaxed);
  c.broken_rings = broken_.load(std::memory_order_relaxed);
  c.rings = rings_count_.load(std::memory_order_relaxed);
  return c;
}

void RelayEngine::ApplyChanges() {
  std::vector<std::pair<uint64_t, std::unique_ptr<Ring>>> add;
  std::vector<uint64_t> remove;
  {
    absl::MutexLock l(&mu_);
    add.swap(to_add_);
    remove.swap(to_remove_);
  }
  for (auto& [id, r] : add) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, r->doorbell.get(), &ev);
    rings_[id] = std::move(r);
  }
  rings_count_.store(rings_.size(), std::memory_order_relaxed);
  for (uint64_t id : remove) {
    auto it = rings_.find(id);
    if (it == rings_.end()) continue;
    Drain(*it->second);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second->doorbell.get(), nullptr);
    rings_.erase(it);
  }
  rings_count_.store(rings_.size(), std::memory_order_relaxed);
}

void RelayEngine::Run() {
  if (cuda_ != nullptr && !contexts_.empty() && contexts_[0] != nullptr) cuda_->CtxSetCurrent(contexts_[0]);
  uint64_t idle_since = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    ApplyChanges();
    bool progress = false;
    bool inflight = false;
    // Round robin: start at a different ring each round.
    if (!rings_.empty()) {
      auto it = rings_.begin();
      std::advance(it, static_cast<long>(round_++ % rings_.size()));
      for (size_t i = 0; i < rings_.size(); ++i, ++it) {
        if (it == rings_.end()) it = rings_.begin();
        Ring& r = *it->second;
        if (r.broken) continue;
        progress |= PollInflight(r);
        progress |= FlushNotifies(r);
        progress |= ServeRing(r);
        inflight |= !r.inflight.empty() || !r.notifies.empty();
      }
    }
    if (progress || inflight) {
      idle_since = 0;
      continue;
    }
    uint64_t now = NowUs();
    if (idle_since == 0) idle_since = now;
    if (now - idle_since < options_.spin_before_sleep_us) continue;
    Sleep();
    idle_since = 0;
  }
}

void RelayEngine::Sleep() {
  // Announce the sleep, then look once more so a request that raced with the
  // announcement is not left waiting for a doorbell that will never ring.
  for (auto& [id, r] : rings_) r->hdr->daemon_idle.value.store(1, std::memory_order_seq_cst);
  bool work = false;
  for (auto& [id, r] : rings_) {
    if (!r->broken && r->hdr->sq_tail.value.load(std::memory_order_seq_cst) != r->sq_head) work = true;
  }
  if (!work) {
    epoll_event events[32];
    int n = ::epoll_wait(epoll_.get(), events, 32, 1000);
    for (int i = 0; i < n; ++i) {
      uint64_t v;
      if (events[i].data.u64 == kWakeKey) {
        (void)!::read(wake_.get(), &v, sizeof(v));
      } else if (auto it = rings_.find(events[i].data.u64); it != rings_.end()) {
        (void)!::read(it->second->doorbell.get(), &v, sizeof(v));
      }
    }
  }
  for (auto& [id, r] : rings_) r->hdr->daemon_idle.value.store(0, std::memory_order_seq_cst);
}

bool RelayEngine::ServeRing(Ring& r) {
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
  uint64_t pending = r.notifies.size();
  for (const Inflight& f : r.inflight) pending += f.done ? 0 : f.user_data.size();
  uint64_t room = r.layout.cq_entries - cq_used;
  room = room > pending ? room - pending : 0;
  uint64_t cap = options_.inflight_per_ring > pending ? options_.inflight_per_ring - pending : 0;
  uint32_t n = static_cast<uint32_t>(std::min<uint64_t>({avail, room, options_.batch_per_ring, cap}));
  round_start_ns_ = NowNs();
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
    Process(r, e);
    if (r.broken) {
      SealRound(r);  // copies already issued still get their event
      return true;
    }
  }
  SealRound(r);
  r.sq_head += n;
  r.hdr->sq_head.value.store(r.sq_head, std::memory_order_release);
  return n > 0;
}

void RelayEngine::Process(Ring& r, const RelaySqe& e) {
  if (e.flags != 0 || e.reserved != 0) {
    return Complete(r, e.user_data, absl::InvalidArgumentError("flags and reserved must be 0"));
  }
  switch (static_cast<RelayOp>(e.opcode)) {
    case RelayOp::kWrite:
    case RelayOp::kRead: {
      bool async = false;
      absl::Status st = Copy(r, e, &async);
      if (!async) {
        if (st.ok()) latency_.Observe((NowNs() - round_start_ns_) * 1e-9);
        Complete(r, e.user_data, st);
      }
      return;
    }
    case RelayOp::kNotify: {
      PendingNotify p;
      p.after_seq = r.next_seq - 1;
      p.sqe = e;
      r.notifies.push_back(p);
      return;
    }
  }
  Complete(r, e.user_data, absl::InvalidArgumentError(absl::StrCat("unknown relay opcode ", e.opcode)));
}

absl::Status RelayEngine::Copy(Ring& r, const RelaySqe& e, bool* async) {
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
  PODLINK_ASSIGN_OR_RETURN(RelayView lv, local->memory->MapForRelay());
  PODLINK_ASSIGN_OR_RETURN(RelayView rv, remote->memory->MapForRelay());
  bool write = static_cast<RelayOp>(e.opcode) == RelayOp::kWrite;
  const RelayView& src = write ? lv : rv;
  const RelayView& dst = write ? rv : lv;
  uint64_t src_addr = src.address + (write ? e.local_offset : e.remote_offset);
  uint64_t dst_addr = dst.address + (write ? e.remote_offset : e.local_offset);
  if (src_addr < dst_addr + e.length && dst_addr < src_addr + e.length && src.address == dst.address) {
    return absl::InvalidArgumentError("source and destination ranges overlap");
  }
  if (!src.on_gpu && !dst.on_gpu) {
    std::memcpy(reinterpret_cast<void*>(dst_addr), reinterpret_cast<const void*>(src_addr), e.length);
    ops_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(e.length, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (cuda_ == nullptr) return absl::FailedPreconditionError("GPU relay needs CUDA in podlinkd");
  // The copy engine of the GPU that holds the source (or the destination
  // when the source is host memory) does the work.
  int gpu = src.on_gpu ? src.gpu : dst.gpu;
  if (gpu < 0 || gpu >= static_cast<int>(streams_.size()) || streams_[gpu].empty()) {
    return absl::InternalError(absl::StrCat("no relay stream on GPU ", gpu));
  }
  uint32_t si = next_stream_[gpu]++ % streams_[gpu].size();
  cuda_->CtxSetCurrent(contexts_[gpu]);
  PODLINK_RETURN_IF_ERROR(
      cu::CuStatus(cuda_->MemcpyAsync(dst_addr, src_addr, e.length, streams_[gpu][si]), "cuMemcpyAsync"));
  Inflight& f = r.building[{gpu, si}];
  uint64_t seq = r.next_seq++;
  if (f.user_data.empty()) {
    f.first_seq = seq;
    f.start_ns = round_start_ns_;
  }
  f.user_data.push_back(e.user_data);
  f.keep.push_back(std::move(local));
  f.keep.push_back(std::move(remote));
  *async = true;
  ops_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(e.length, std::memory_order_relaxed);
  return absl::OkStatus();
}

cu::Event RelayEngine::TakeEvent() {
  if (!free_events_.empty()) {
    cu::Event e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cu::Event e = nullptr;
  if (cuda_->EventCreate(&e, cu::kEventDisableTiming) != cu::kSuccess) return nullptr;
  return e;
}

void RelayEngine::SealRound(Ring& r) {
  for (auto& [key, f] : r.building) {
    auto [gpu, si] = key;
    f.event = TakeEvent();
    if (f.event == nullptr || cuda_->EventRecord(f.event, streams_[gpu][si]) != cu::kSuccess) {
      // No event to poll: finish synchronously.
      absl::Status st = cu::CuStatus(cuda_->StreamSynchronize(streams_[gpu][si]), "relay copy");
      for (uint64_t u : f.user_data) Complete(r, u, st);
      if (f.event) free_events_.push_back(f.event);
      continue;
    }
    r.inflight.push_back(std::move(f));
  }
  r.building.clear();
}

bool RelayEngine::PollInflight(Ring& r) {
  bool progress = false;
  for (Inflight& f : r.inflight) {
    if (f.done) continue;
    cu::Result q = cuda_->EventQuery(f.event);
    if (q == cu::kErrorNotReady) continue;
    f.done = true;
    progress = true;
    absl::Status st = cu::CuStatus(q, "relay copy");
    double secs = (NowNs() - f.start_ns) * 1e-9;
    for (uint64_t u : f.user_data) {
      if (st.ok()) latency_.Observe(secs);
      Complete(r, u, st);
    }
    free_events_.push_back(f.event);
    f.keep.clear();
  }
  while (!r.inflight.empty() && r.inflight.front().done) r.inflight.pop_front();
  return progress;
}

bool RelayEngine::FlushNotifies(Ring& r) {
  bool progress = false;
  while (!r.notifies.empty()) {
    const PendingNotify& p = r.notifies.front();
    bool earlier_pending = false;  // any copy issued before the notify still running?
    for (const Inflight& f : r.inflight) earlier_pending |= !f.done && f.first_seq <= p.after_seq;
    if (earlier_pending) break;
    absl::Status st = DeliverNotify(r, p.sqe);
    Complete(r, p.sqe.user_data, st);
    r.notifies.pop_front();
    progress = true;
  }
  return progress;
}

absl::Status RelayEngine::DeliverNotify(Ring& from, const RelaySqe& e) {
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<const ExportRecord> target, resolve_(from.session, e.remote_export));
  auto it = rings_.find(target->owner_session);
  if (it == rings_.end() || it->second->broken) {
    return absl::FailedPreconditionError(
        absl::StrCat("the owner of export ", target->id, " has no relay ring open to receive notifications"));
  }
  Ring& to = *it->second;
  uint32_t head = to.hdr->nq_head.value.load(std::memory_order_acquire);
  uint32_t used = to.nq_tail - head;
  if (used >= to.layout.nq_entries) {
    return absl::ResourceExhaustedError("the peer's notification queue is full (it is not polling notifications)");
  }
  RelayNqe& n = to.nq[to.nq_tail & (to.layout.nq_entries - 1)];
  n.export_id = target->id;
  n.value = e.length;
  n.from_session = from.session;
  n.reserved = 0;
  ++to.nq_tail;
  to.hdr->nq_tail.value.store(to.nq_tail, std::memory_order_release);
  notifies_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void RelayEngine::Complete(Ring& r, uint64_t user_data, const absl::Status& st) {
  if (!st.ok()) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    Log()->debug("event=relay_op_failed session={} user_data={} error=\"{}\"", r.session, user_data, st.message());
  }
  if (r.broken) return;
  RelayCqe& c = r.cq[r.cq_tail & (r.layout.cq_entries - 1)];
  c.user_data = user_data;
  c.status = static_cast<int32_t>(st.code());
  c.reserved = 0;
  ++r.cq_tail;
  r.hdr->cq_tail.value.store(r.cq_tail, std::memory_order_release);
}

void RelayEngine::Break(Ring& r, const std::string& why) {
  r.broken = true;
  broken_.fetch_add(1, std::memory_order_relaxed);
  r.hdr->daemon_status.value.store(static_cast<uint32_t>(absl::StatusCode::kDataLoss), std::memory_order_release);
  Log()->warn("event=relay_ring_broken session={} reason=\"{}\"", r.session, why);
}

void RelayEngine::Drain(Ring& r) {
  for (Inflight& f : r.inflight) {
    if (!f.done) {
      cuda_->EventSynchronize(f.event);
      free_events_.push_back(f.event);
    }
  }
  r.inflight.clear();
}

}  // namespace podlink
