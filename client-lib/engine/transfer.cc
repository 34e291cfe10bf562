#include "podlink/transfer.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_driver.h"
#include "common/relay_ring.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

namespace podlink {

const char* TransportName(Transport t) {
  switch (t) {
    case Transport::kHostMemcpy:
      return "podlink/host";
    case Transport::kDirect:
      return "podlink/direct";
    case Transport::kRelay:
      return "podlink/relay";
  }
  return "podlink/unknown";
}

std::string RegionDescriptor::Serialize() const {
  return absl::StrCat("podlink1;", node_id, ";", export_id, ";", size, ";", static_cast<int>(handle_type), ";",
                      gpu_uuid);
}

absl::StatusOr<RegionDescriptor> RegionDescriptor::Parse(absl::string_view text) {
  std::vector<std::string> f = absl::StrSplit(text, ';');
  RegionDescriptor d;
  int type = 0;
  if (f.size() != 6 || f[0] != "podlink1" || f[1].empty() || !absl::SimpleAtoi(f[2], &d.export_id) ||
      !absl::SimpleAtoi(f[3], &d.size) || !absl::SimpleAtoi(f[4], &type) || type < 1 || type > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a podlink region descriptor: '", text.substr(0, 200), "'"));
  }
  d.node_id = f[1];
  d.handle_type = static_cast<HandleType>(type);
  d.gpu_uuid = f[5];
  return d;
}

namespace {

struct Opened {
  Imported imported;  // keeps the import record (the relay's authorization) alive
  std::unique_ptr<Mapping> mapping;  // for host and direct transports
  RemoteRegion region;
};

struct Batch {
  uint32_t remaining = 0;  // relay completions still due
  absl::Status status;
  cu::Event event = nullptr;  // in-process GPU copies
};

}  // namespace

class TransferEngine::Impl {
 public:
  Impl(Client& client, Options opt) : client_(client), opt_(opt) {}
  Client& client() { return client_; }

  ~Impl() {
    absl::MutexLock l(&mu_);
    // Let every relay copy that touches our memory finish before it goes away.
    // WaitLocked erases what it waited for: iterate over a copy of the ids.
    std::vector<uint64_t> ids;
    for (const auto& [id, b] : batches_) ids.push_back(id);
    for (uint64_t id : ids) (void)WaitLocked(id, absl::Seconds(5));
    if (cuda_ != nullptr) {
      for (auto& [id, b] : batches_) {
        if (b.event) cuda_->EventDestroy(b.event);
      }
      if (stream_ != nullptr) cuda_->StreamDestroy(stream_);
    }
    if (ring_ != nullptr) ::munmap(ring_, layout_.total);
  }

  absl::Status Init() {
    uint32_t n = opt_.ring_entries;
    PODLINK_ASSIGN_OR_RETURN(layout_, RingLayout::Make(n, n, n));
    UniqueFd fd(::memfd_create("podlink-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) return ErrnoStatus(errno, "memfd_create (relay ring)");
    if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(layout_.total)); err != 0) {
      return ErrnoStatus(err, "fallocate ring");
    }
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      return ErrnoStatus(errno, "seal ring");
    }
    void* p = ::mmap(nullptr, layout_.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap ring");
    ring_ = p;
    auto* base = static_cast<char*>(p);
    hdr_ = reinterpret_cast<RingHeader*>(base);
    hdr_->magic = kRingMagic;
    hdr_->version = kRingVersion;
    hdr_->sq_entries = hdr_->cq_entries = hdr_->nq_entries = n;
    sq_ = reinterpret_cast<RelaySqe*>(base + layout_.sq_offset);
    cq_ = reinterpret_cast<const RelayCqe*>(base + layout_.cq_offset);
    nq_ = reinterpret_cast<const RelayNqe*>(base + layout_.nq_offset);
    bell_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!bell_) return ErrnoStatus(errno, "eventfd (relay doorbell)");
    auto node = client_.GetNodeInfo();
    if (!node.ok()) return node.status();
    node_id_ = node->node_id;
    return client_.OpenRelayRing(fd.get(), bell_.get(), n, n, n);
  }

  absl::StatusOr<LocalRegion> Register(uint64_t export_id, uint64_t size, void* host, uint64_t dev, HandleType type,
                                       const std::string& gpu_uuid) {
    LocalRegion r{export_id, size, host, dev};
    absl::MutexLock l(&mu_);
    local_[export_id] = RegionDescriptor{node_id_, export_id, size, type, gpu_uuid};
    return r;
  }

  absl::Status Unregister(uint64_t export_id) {
    {
      absl::MutexLock l(&mu_);
      if (local_.erase(export_id) == 0) {
        return absl::NotFoundError(absl::StrCat("region ", export_id, " was not registered with this engine"));
      }
    }
    return client_.Release(export_id);
  }

  absl::Status Close(uint64_t export_id) {
    std::unique_ptr<Opened> o;
    {
      absl::MutexLock l(&mu_);
      auto it = opened_.find(export_id);
      if (it == opened_.end()) {
        return absl::NotFoundError(absl::StrCat("region ", export_id, " was not opened by this engine"));
      }
      o = std::move(it->second);
      opened_.erase(it);
    }
    o.reset();  // unmaps and closes the descriptor
    // Only the import record: a region this engine's own session exported
    // stays exported for everyone else.
    absl::Status st = client_.DropImport(export_id);
    // An export its owner already withdrew has no import record left to drop.
    return st.code() == absl::StatusCode::kNotFound ? absl::OkStatus() : st;
  }

  absl::StatusOr<RegionDescriptor> Describe(const LocalRegion& r) {
    absl::MutexLock l(&mu_);
    auto it = local_.find(r.export_id);
    if (it == local_.end()) {
      return absl::NotFoundError(absl::StrCat("region ", r.export_id, " was not registered with this engine"));
    }
    return it->second;
  }

  absl::StatusOr<RemoteRegion> Open(const RegionDescriptor& d) {
    if (d.node_id != node_id_) {
      return absl::UnimplementedError(absl::StrCat(
          "region ", d.export_id, " lives on node ", d.node_id, ", this is node ", node_id_,
          ": transfers between nodes need the mesh transport, which podlink does not have yet"));
    }
    {
      // Opening a region twice returns the first opening: its mapping may be
      // in use by copies in flight.
      absl::MutexLock l(&mu_);
      auto it = opened_.find(d.export_id);
      if (it != opened_.end()) return it->second->region;
    }
    PODLINK_ASSIGN_OR_RETURN(Imported imp, client_.Import(d.export_id));
    auto o = std::make_unique<Opened>(Opened{std::move(imp), nullptr, {}});
    o->region.export_id = d.export_id;
    o->region.size = o->imported.info().size;
    if (opt_.force_relay) {
      o->region.transport = Transport::kRelay;
    } else if (o->imported.info().handle_type == HandleType::kHostMemfd) {
      PODLINK_ASSIGN_OR_RETURN(o->mapping, client_.Map(o->imported));
      o->region.transport = Transport::kHostMemcpy;
    } else {
      o->region.transport = Transport::kRelay;
      if (opt_.allow_direct) {
        auto m = client_.Map(o->imported, opt_.device);
        if (m.ok()) {
          o->mapping = *std::move(m);
          o->region.transport = Transport::kDirect;
        }
        // Otherwise (typically: the peer GPU's device node is not in this
        // container) the relay moves the bytes.
      }
    }
    RemoteRegion out = o->region;
    absl::MutexLock l(&mu_);
    if (auto it = opened_.find(d.export_id); it != opened_.end()) return it->second->region;  // raced
    if (opt_.log_transport && !logged_[static_cast<int>(out.transport)]) {
      logged_[static_cast<int>(out.transport)] = true;
      std::fprintf(stderr, "podlink: region %llu of %s/%s via %s\n", static_cast<unsigned long long>(d.export_id),
                   o->imported.info().owner.namespace_.c_str(), o->imported.info().owner.name.c_str(),
                   TransportName(out.transport));
    }
    opened_[d.export_id] = std::move(o);
    return out;
  }

  absl::StatusOr<uint64_t> Submit(const std::vector<TransferOp>& ops, bool write) {
    absl::MutexLock l(&mu_);
    uint64_t id = next_batch_++;
    Batch& b = batches_[id];
    bool any_gpu_copy = false;
    for (const TransferOp& op : ops) {
      absl::Status st = Validate(op);
      if (!st.ok()) {
        // Ops before this one are already submitted and still complete;
        // the batch reports the first error and stops here.
        if (b.status.ok()) b.status = st;
        break;
      }
      auto it = opened_.find(op.remote->export_id);
      Opened& o = *it->second;
      if (o.region.transport == Transport::kRelay) {
        RelaySqe e{};
        e.user_data = id;
        e.opcode = static_cast<uint32_t>(write ? RelayOp::kWrite : RelayOp::kRead);
        e.local_export = op.local->export_id;
        e.local_offset = op.local_offset;
        e.remote_export = op.remote->export_id;
        e.remote_offset = op.remote_offset;
        e.length = op.length;
        absl::Status pushed = PushLocked(e);
        if (!pushed.ok()) {
          if (b.status.ok()) b.status = pushed;
          break;
        }
        ++b.remaining;
        continue;
      }
      // In-process copy through the mapping.
      uint64_t local = op.local->host ? reinterpret_cast<uint64_t>(op.local->host) : op.local->device_ptr;
      uint64_t remote = o.mapping->host_ptr() ? reinterpret_cast<uint64_t>(o.mapping->host_ptr())
                                              : o.mapping->device_ptr();
      local += op.local_offset;
      remote += op.remote_offset;
      uint64_t dst = write ? remote : local, src = write ? local : remote;
      if (op.local->host && o.mapping->host_ptr()) {
        std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), op.length);
        continue;
      }
      absl::Status st2 = EnsureStream();
      if (st2.ok()) st2 = cu::CuStatus(cuda_->MemcpyAsync(dst, src, op.length, stream_), "cuMemcpyAsync");
      if (!st2.ok()) {
        if (b.status.ok()) b.status = st2;
        break;
      }
      any_gpu_copy = true;
    }
    if (any_gpu_copy) {
      if (cuda_->EventCreate(&b.event, cu::kEventDisableTiming) != cu::kSuccess ||
          cuda_->EventRecord(b.event, stream_) != cu::kSuccess) {
        cuda_->StreamSynchronize(stream_);
        if (b.event) cuda_->EventDestroy(b.event);
        b.event = nullptr;
      }
    }
    RingDoorbell();
    return id;
  }

  absl::StatusOr<bool> Poll(uint64_t id) {
    absl::MutexLock l(&mu_);
    return PollLocked(id);
  }

  absl::Status Wait(uint64_t id) {
    absl::MutexLock l(&mu_);
    return WaitLocked(id, opt_.timeout);
  }

  absl::Status Notify(uint64_t export_id, uint64_t value) {
    absl::MutexLock l(&mu_);
    if (!opened_.contains(export_id)) {
      return absl::FailedPreconditionError(absl::StrCat("region ", export_id, " was not opened by this engine"));
    }
    // In-process copies must be visible before the notification leaves.
    for (auto& [id, b] : batches_) {
      if (b.event) PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda_->EventSynchronize(b.event), "cuEventSynchronize"));
    }
    uint64_t id = next_batch_++;
    Batch& b = batches_[id];
    RelaySqe e{};
    e.user_data = id;
    e.opcode = static_cast<uint32_t>(RelayOp::kNotify);
    e.remote_export = export_id;
    e.length = value;
    PODLINK_RETURN_IF_ERROR(PushLocked(e));
    ++b.remaining;
    RingDoorbell();
    return WaitLocked(id, opt_.timeout);
  }

  std::vector<Notification> PollNotifications() {
    absl::MutexLock l(&mu_);
    std::vector<Notification> out;
    uint32_t tail = hdr_->nq_tail.value.load(std::memory_order_acquire);
    while (nq_head_ != tail) {
      const RelayNqe& n = nq_[nq_head_ & (layout_.nq_entries - 1)];
      out.push_back({n.export_id, n.value});
      ++nq_head_;
    }
    hdr_->nq_head.value.store(nq_head_, std::memory_order_release);
    return out;
  }

 private:
  absl::Status Validate(const TransferOp& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (op.local == nullptr || op.remote == nullptr) return absl::InvalidArgumentError("op without regions");
    if (op.length == 0) return absl::InvalidArgumentError("length must be > 0");
    if (!local_.contains(op.local->export_id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("local region ", op.local->export_id, " was not registered with this engine"));
    }
    if (!opened_.contains(op.remote->export_id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("remote region ", op.remote->export_id, " was not opened by this engine"));
    }
    auto fits = [&](uint64_t off, uint64_t size, const char* which, uint64_t id) -> absl::Status {
      if (off > size || op.length > size - off) {
        return absl::OutOfRangeError(absl::StrCat(which, " range [", off, ", +", op.length, ") exceeds region ", id,
                                                  " of ", size, " bytes"));
      }
      return absl::OkStatus();
    };
    PODLINK_RETURN_IF_ERROR(fits(op.local_offset, local_[op.local->export_id].size, "local", op.local->export_id));
    return fits(op.remote_offset, opened_[op.remote->export_id]->region.size, "remote", op.remote->export_id);
  }

  absl::Status EnsureStream() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stream_ != nullptr) return absl::OkStatus();
    PODLINK_ASSIGN_OR_RETURN(cuda_, cu::LoadDriver());
    cu::Context ctx = nullptr;
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda_->DevicePrimaryCtxRetain(&ctx, opt_.device), "cuDevicePrimaryCtxRetain"));
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(cuda_->CtxSetCurrent(ctx), "cuCtxSetCurrent"));
    return cu::CuStatus(cuda_->StreamCreate(&stream_, cu::kStreamNonBlocking), "cuStreamCreate");
  }

  absl::Status CheckServed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint32_t st = hdr_->daemon_status.value.load(std::memory_order_acquire);
    if (st == 0) return absl::OkStatus();
    auto code = static_cast<absl::StatusCode>(st);
    return absl::Status(code, code == absl::StatusCode::kUnavailable
                                  ? "podlinkd stopped serving this relay ring: the session closed (reconnect)"
                                  : "podlinkd stopped serving this relay ring (its indices were corrupted)");
  }

  absl::Status PushLocked(const RelaySqe& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Time deadline = absl::Now() + opt_.timeout;
    while (sq_tail_ - hdr_->sq_head.value.load(std::memory_order_acquire) >= layout_.sq_entries) {
      Reap();
      PODLINK_RETURN_IF_ERROR(CheckServed());
      RingDoorbell();
      if (absl::Now() > deadline) return absl::DeadlineExceededError("relay queue stayed full");
      sched_yield();
    }
    sq_[sq_tail_ & (layout_.sq_entries - 1)] = e;
    ++sq_tail_;
    hdr_->sq_tail.value.store(sq_tail_, std::memory_order_release);
    return absl::OkStatus();
  }

  void RingDoorbell() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (hdr_->daemon_idle.value.load(std::memory_order_seq_cst) != 0) {
      uint64_t one = 1;
      (void)!::write(bell_.get(), &one, sizeof(one));
    }
  }

  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint32_t tail = hdr_->cq_tail.value.load(std::memory_order_acquire);
    while (cq_head_ != tail) {
      RelayCqe c = cq_[cq_head_ & (layout_.cq_entries - 1)];
      ++cq_head_;
      auto it = batches_.find(c.user_data);
      if (it == batches_.end()) continue;
      if (it->second.remaining > 0) --it->second.remaining;
      if (c.status != 0 && it->second.status.ok()) {
        it->second.status = absl::Status(static_cast<absl::StatusCode>(c.status),
                                         "podlinkd refused or failed a relay transfer of this batch (its log says why)");
      }
    }
    hdr_->cq_head.value.store(cq_head_, std::memory_order_release);
  }

  absl::StatusOr<bool> PollLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = batches_.find(id);
    if (it == batches_.end()) return absl::NotFoundError(absl::StrCat("no batch ", id, " (already waited for?)"));
    Reap();
    Batch& b = it->second;
    if (b.remaining > 0) {
      PODLINK_RETURN_IF_ERROR(CheckServed());
      return false;
    }
    if (b.event != nullptr) {
      cu::Result q = cuda_->EventQuery(b.event);
      if (q == cu::kErrorNotReady) return false;
      if (q != cu::kSuccess && b.status.ok()) b.status = cu::CuStatus(q, "in-process copy");
      cuda_->EventDestroy(b.event);
      b.event = nullptr;
    }
    return true;
  }

  absl::Status WaitLocked(uint64_t id, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Time deadline = absl::Now() + timeout;
    for (uint64_t spins = 0;; ++spins) {
      PODLINK_ASSIGN_OR_RETURN(bool done, PollLocked(id));
      if (done) {
        absl::Status st = batches_[id].status;
        batches_.erase(id);
        return st;
      }
      if ((spins & 1023) == 1023) {
        if (absl::Now() > deadline) return absl::DeadlineExceededError("relay transfer did not complete in time");
        RingDoorbell();
        mu_.Unlock();
        sched_yield();
        mu_.Lock();
      }
    }
  }

  Client& client_;
  const Options opt_;
  std::string node_id_;
  RingLayout layout_;
  void* ring_ = nullptr;
  RingHeader* hdr_ = nullptr;
  RelaySqe* sq_ = nullptr;
  const RelayCqe* cq_ = nullptr;
  const RelayNqe* nq_ = nullptr;
  UniqueFd bell_;
  const cu::Driver* cuda_ = nullptr;

  absl::Mutex mu_;  // the engine's state below; ring positions are this side's own
  uint32_t sq_tail_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t cq_head_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t nq_head_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_batch_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Batch> batches_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<Opened>> opened_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, RegionDescriptor> local_ ABSL_GUARDED_BY(mu_);  // registered regions
  cu::Stream stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool logged_[4] ABSL_GUARDED_BY(mu_) = {false, false, false, false};
};

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(Client& client, Options options) {
  auto impl = std::make_unique<Impl>(client, options);
  PODLINK_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

absl::StatusOr<LocalRegion> TransferEngine::Register(const GpuBuffer& buf, const ExportOptions& opts) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->client().Export(buf, opts));
  return impl_->Register(id, buf.size(), nullptr, buf.device_ptr(), buf.handle_type(), buf.gpu_uuid());
}

absl::StatusOr<LocalRegion> TransferEngine::Register(const HostBuffer& buf, const ExportOptions& opts) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->client().Export(buf, opts));
  return impl_->Register(id, buf.size(), buf.data(), 0, HandleType::kHostMemfd, "");
}

absl::StatusOr<LocalRegion> TransferEngine::RegisterExisting(uint64_t device_ptr, size_t size,
                                                             const ExportOptions& opts) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->client().ExportExisting(device_ptr, size, opts));
  // The descriptor's GPU UUID is informational; the daemon knows the export's GPU.
  return impl_->Register(id, size, nullptr, device_ptr, HandleType::kPosixFd, "");
}

absl::Status TransferEngine::Unregister(const LocalRegion& r) { return impl_->Unregister(r.export_id); }
absl::Status TransferEngine::Close(const RemoteRegion& r) { return impl_->Close(r.export_id); }

absl::StatusOr<RegionDescriptor> TransferEngine::Describe(const LocalRegion& r) { return impl_->Describe(r); }
absl::StatusOr<RemoteRegion> TransferEngine::Open(const RegionDescriptor& d) { return impl_->Open(d); }

absl::Status TransferEngine::Write(const TransferOp& op) { return Writev({op}); }
absl::Status TransferEngine::Read(const TransferOp& op) { return Readv({op}); }

absl::Status TransferEngine::Writev(const std::vector<TransferOp>& ops) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->Submit(ops, true));
  return impl_->Wait(id);
}

absl::Status TransferEngine::Readv(const std::vector<TransferOp>& ops) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->Submit(ops, false));
  return impl_->Wait(id);
}

absl::StatusOr<uint64_t> TransferEngine::WriteAsync(const std::vector<TransferOp>& ops) {
  return impl_->Submit(ops, true);
}
absl::StatusOr<uint64_t> TransferEngine::ReadAsync(const std::vector<TransferOp>& ops) {
  return impl_->Submit(ops, false);
}
absl::StatusOr<bool> TransferEngine::Poll(uint64_t batch) { return impl_->Poll(batch); }
absl::Status TransferEngine::Wait(uint64_t batch) { return impl_->Wait(batch); }

absl::Status TransferEngine::Notify(const RemoteRegion& remote, uint64_t value) {
  return impl_->Notify(remote.export_id, value);
}
std::vector<Notification> TransferEngine::PollNotifications() { return impl_->PollNotifications(); }

}  // namespace podlink
