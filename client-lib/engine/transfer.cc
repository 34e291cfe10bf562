#include "podlink/transfer.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client-lib/transports/backend.h"
#include "client-lib/transports/select.h"
#include "common/cuda_driver.h"
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
    case Transport::kMesh:
      return "podlink/mesh";
  }
  return "podlink/unknown";
}

std::string RegionDescriptor::Serialize() const {
  std::string base = absl::StrCat(";", node_id, ";", export_id, ";", size, ";", static_cast<int>(handle_type), ";",
                                  gpu_uuid);
  if (mesh_addresses.empty()) return "podlink1" + base;
  return absl::StrCat("podlink2", base, ";", node_name, ";", mesh_port, ";", absl::StrJoin(mesh_addresses, ","));
}

absl::StatusOr<RegionDescriptor> RegionDescriptor::Parse(absl::string_view text) {
  std::vector<std::string> f = absl::StrSplit(text, ';');
  RegionDescriptor d;
  int type = 0;
  bool v2 = f.size() == 9 && f[0] == "podlink2";
  if (!(v2 || (f.size() == 6 && f[0] == "podlink1")) || f[1].empty() || !absl::SimpleAtoi(f[2], &d.export_id) ||
      !absl::SimpleAtoi(f[3], &d.size) || !absl::SimpleAtoi(f[4], &type) || type < 1 || type > 4 ||
      (v2 && (f[6].empty() || !absl::SimpleAtoi(f[7], &d.mesh_port) || d.mesh_port == 0 || d.mesh_port > 65535 ||
              f[8].empty()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a podlink region descriptor: '", text.substr(0, 200), "'"));
  }
  d.node_id = f[1];
  d.handle_type = static_cast<HandleType>(type);
  d.gpu_uuid = f[5];
  if (v2) {
    d.node_name = f[6];
    d.mesh_addresses = absl::StrSplit(f[8], ',', absl::SkipEmpty());
    if (d.mesh_addresses.size() > 64) return absl::InvalidArgumentError("descriptor names over 64 mesh addresses");
  }
  return d;
}

namespace {

// The CUDA ordinal of the GPU that holds a cuMem allocation (-1: unknown).
int AllocationDevice(uint64_t device_ptr) {
  auto d = cu::LoadDriver();
  if (!d.ok()) return -1;
  cu::MemHandle h = 0;
  if ((*d)->MemRetainAllocationHandle(&h, reinterpret_cast<void*>(device_ptr)) != cu::kSuccess) return -1;
  cu::MemAllocationProp prop{};
  int device = -1;
  if ((*d)->MemGetAllocationPropertiesFromHandle(&prop, h) == cu::kSuccess &&
      prop.location.type == cu::kLocationTypeDevice) {
    device = prop.location.id;
  }
  (*d)->MemRelease(h);
  return device;
}

// Where host memory of this process lies in a memfd: the descriptor this
// process holds for it, the offset of `addr` in the file and the file's size.
// NOT_FOUND when the range does not start in a memfd this process holds (it
// is then registered as process memory).
struct MemfdRange {
  UniqueFd fd;
  uint64_t file_offset = 0;
  uint64_t file_size = 0;
};

absl::StatusOr<MemfdRange> FindMemfd(const void* addr, size_t size) {
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  if (size == 0 || a + size < a) return absl::InvalidArgumentError("an empty or wrapping host range");
  std::ifstream maps("/proc/self/maps");
  std::string line;
  auto refused = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "host memory at 0x", absl::Hex(a), " (+", size, ") cannot be registered: ", why,
        ". Register memory from podlink's host allocator (Client::AllocateHost, Python alloc_host), a sealed "
        "memfd of your own, or memory this process allocated (malloc, numpy)"));
  };
  while (std::getline(maps, line)) {
    // start-end perms offset dev inode [path]
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5) continue;
    std::pair<absl::string_view, absl::string_view> range = absl::StrSplit(f[0], '-');
    uint64_t start = 0, end = 0, off = 0, inode = 0;
    if (!absl::SimpleHexAtoi(range.first, &start) || !absl::SimpleHexAtoi(range.second, &end)) continue;
    if (a < start || a >= end) continue;
    if (f[1].size() < 4 || f[1][3] != 's' || f.size() < 6 || !absl::StartsWith(f[5], "/memfd:")) {
      return absl::NotFoundError("not in a shared mapping of a memfd");
    }
    if (a + size > end) return refused("it runs past the end of its memfd mapping");
    std::pair<absl::string_view, absl::string_view> dev = absl::StrSplit(f[3], ':');
    uint32_t dev_major = 0, dev_minor = 0;
    if (!absl::SimpleHexAtoi(f[2], &off) || !absl::SimpleAtoi(f[4], &inode) ||
        !absl::SimpleHexAtoi(dev.first, &dev_major) || !absl::SimpleHexAtoi(dev.second, &dev_minor)) {
      return refused("unreadable mapping");
    }
    // The descriptor: one this process holds open on the same file.
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      int n = 0;
      if (!absl::SimpleAtoi(entry.path().filename().string(), &n)) continue;
      struct stat st {};
      if (::fstat(n, &st) != 0 || !S_ISREG(st.st_mode) || st.st_ino != inode || major(st.st_dev) != dev_major ||
          minor(st.st_dev) != dev_minor) {
        continue;
      }
      UniqueFd fd(::fcntl(n, F_DUPFD_CLOEXEC, 0));
      if (!fd) return ErrnoStatus(errno, "dup of the memfd");
      MemfdRange r;
      r.fd = std::move(fd);
      r.file_offset = off + (a - start);
      r.file_size = static_cast<uint64_t>(st.st_size);
      if (r.file_offset + size > r.file_size) return refused("its mapping runs past the end of the memfd");
      return r;
    }
    return absl::NotFoundError("this process holds no descriptor of its memfd");
  }
  return refused("it is not mapped");
}

struct Opened {
  Imported imported;  // keeps the import record (the relay's authorization) alive
  std::unique_ptr<Mapping> mapping;  // for transports that copy through a mapping
  RemoteRegion region;
};

struct Batch {
  absl::Status status;                   // the first failure
  std::vector<TransportBackend*> parts;  // backends still holding part of it
};

}  // namespace

// Regions, batches and notifications; the bytes move in the transport
// backends (client-lib/transports/), which select.h makes and picks.
class TransferEngine::Impl {
 public:
  Impl(Client& client, Options opt)
      : client_(client), opt_(opt) {}
  Client& client() { return client_; }

  ~Impl() {
    absl::MutexLock l(&mu_);
    // Let every copy that touches our memory finish before it goes away.
    // WaitLocked erases what it waited for: iterate over a copy of the ids.
    std::vector<uint64_t> ids;
    for (const auto& [id, b] : batches_) ids.push_back(id);
    for (uint64_t id : ids) (void)WaitLocked(id, absl::Seconds(5));
    for (auto& [id, b] : batches_) {
      for (TransportBackend* t : b.parts) t->Abandon(id);
    }
  }

  absl::Status Init() {
    // Node first: a session's ring cannot be opened twice, so nothing may
    // fail after it is handed to podlinkd.
    auto node = client_.GetNodeInfo();
    if (!node.ok()) return node.status();
    node_id_ = node->node_id;
    node_name_ = node->node_name;
    mesh_port_ = node->mesh_port;
    mesh_addresses_ = node->mesh_addresses;
    PODLINK_ASSIGN_OR_RETURN(transports_, Transports::Create(client_, opt_));
    return absl::OkStatus();
  }

  absl::StatusOr<LocalRegion> Register(uint64_t export_id, uint64_t size, void* host, uint64_t dev, int device,
                                       HandleType type, const std::string& gpu_uuid) {
    LocalRegion r{export_id, size, host, dev, device};
    absl::MutexLock l(&mu_);
    local_[export_id] = RegionDescriptor{node_id_, export_id, size, type, gpu_uuid, node_name_, mesh_port_,
                                         mesh_addresses_};
    return r;
  }

  // Local offsets below `floor` are outside what this process mapped (RegisterHost).
  void SetFloor(uint64_t export_id, uint64_t floor) {
    absl::MutexLock l(&mu_);
    local_floor_[export_id] = floor;
  }

  absl::Status Unregister(uint64_t export_id) {
    {
      absl::MutexLock l(&mu_);
      local_floor_.erase(export_id);
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
      for (auto k = remote_keys_.begin(); k != remote_keys_.end(); ++k) {
        if (k->second == export_id) {
          remote_keys_.erase(k);
          break;
        }
      }
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

  absl::StatusOr<RemoteRegion> OpenOtherNode(const RegionDescriptor& d) {
    if (d.mesh_addresses.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region ", d.export_id, " lives on node ", d.node_id, ", this is node ", node_id_,
          ": its descriptor names no mesh addresses (the owner's podlinkd runs without mesh.enabled)"));
    }
    std::string key = absl::StrCat(d.node_id, "/", d.export_id);
    {
      absl::MutexLock l(&mu_);
      if (auto it = remote_keys_.find(key); it != remote_keys_.end()) return opened_[it->second]->region;
    }
    PODLINK_ASSIGN_OR_RETURN(Imported imp,
                             client_.OpenRemote(d.node_name, d.mesh_addresses, d.mesh_port, d.export_id));
    auto o = std::make_unique<Opened>(Opened{std::move(imp), nullptr, {}});
    o->region.export_id = o->imported.remote_handle();
    o->region.size = o->imported.info().size;
    o->region.transport = Transport::kMesh;
    RemoteRegion out = o->region;
    absl::MutexLock l(&mu_);
    if (auto it = remote_keys_.find(key); it != remote_keys_.end()) {  // raced: keep the first
      (void)client_.DropImport(out.export_id);
      return opened_[it->second]->region;
    }
    if (opt_.log_transport && !logged_[static_cast<int>(out.transport)]) {
      logged_[static_cast<int>(out.transport)] = true;
      std::fprintf(stderr, "podlink: region %llu of %s/%s on node %s via %s\n",
                   static_cast<unsigned long long>(d.export_id), o->imported.info().owner.namespace_.c_str(),
                   o->imported.info().owner.name.c_str(), d.node_name.c_str(), TransportName(out.transport));
    }
    remote_keys_[key] = out.export_id;
    opened_[out.export_id] = std::move(o);
    return out;
  }

  absl::StatusOr<RemoteRegion> Open(const RegionDescriptor& d) {
    if (d.node_id != node_id_) return OpenOtherNode(d);
    {
      // Opening a region twice returns the first opening: its mapping may be
      // in use by copies in flight.
      absl::MutexLock l(&mu_);
      auto it = opened_.find(d.export_id);
      if (it != opened_.end()) return it->second->region;
    }
    PODLINK_ASSIGN_OR_RETURN(Imported imp, client_.Import(d.export_id));
    PODLINK_ASSIGN_OR_RETURN(TransportChoice choice, transports_->Choose(client_, imp));
    auto o = std::make_unique<Opened>(Opened{std::move(imp), std::move(choice.mapping), {}});
    o->region.export_id = d.export_id;
    o->region.size = o->imported.info().size;
    o->region.transport = choice.transport;
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
    for (const TransferOp& op : ops) {
      absl::Status st = Validate(op);
      if (st.ok()) {
        const Opened& o = *opened_.find(op.remote->export_id)->second;
        Transport via = o.region.transport;
        Copy c;
        c.write = write;
        c.op = &op;
        c.local_is_host = op.local->host != nullptr;
        c.local_addr = c.local_is_host ? reinterpret_cast<uint64_t>(op.local->host) : op.local->device_ptr;
        if (o.mapping != nullptr) {
          c.remote_is_host = o.mapping->host_ptr() != nullptr;
          c.remote_addr = c.remote_is_host ? reinterpret_cast<uint64_t>(o.mapping->host_ptr())
                                           : o.mapping->device_ptr();
          if (via == Transport::kDirect) {
            c.device = DirectCopyDevice(op.local->device, c.local_is_host, o.mapping->device(),
                                        o.mapping->access_devices());
            // This process's GPUs cannot reach both sides, or the copy is one the relay does better.
            if (c.device < 0 || (opt_.direct_max_bytes != 0 && op.length > opt_.direct_max_bytes)) {
              via = Transport::kRelay;
            }
          } else {
            c.device = HostMappingCopyDevice(op.local->device, c.local_is_host, opt_.device);
          }
        }
        TransportBackend* t = transports_->For(via);
        if (std::find(b.parts.begin(), b.parts.end(), t) == b.parts.end()) b.parts.push_back(t);
        st = t->Submit(id, c);
      }
      if (!st.ok()) {
        // Ops before this one are already submitted and still complete;
        // the batch reports the first error and stops here.
        if (b.status.ok()) b.status = st;
        break;
      }
    }
    for (TransportBackend* t : b.parts) t->Flush(id);
    transports_->relay().RingDoorbell();
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

  // Queues a notification (with `message` when given) as a batch of its own.
  absl::StatusOr<uint64_t> NotifyAsync(uint64_t export_id, uint64_t value, std::optional<absl::string_view> message) {
    absl::MutexLock l(&mu_);
    return NotifyLocked(export_id, value, message);
  }

  absl::Status Notify(uint64_t export_id, uint64_t value, std::optional<absl::string_view> message) {
    absl::MutexLock l(&mu_);
    PODLINK_ASSIGN_OR_RETURN(uint64_t id, NotifyLocked(export_id, value, message));
    return WaitLocked(id, opt_.timeout);
  }

  std::vector<Notification> PollNotifications() {
    absl::MutexLock l(&mu_);
    return transports_->relay().PollNotifications();
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
    if (auto f = local_floor_.find(op.local->export_id); f != local_floor_.end() && op.local_offset < f->second) {
      return absl::OutOfRangeError(absl::StrCat("local range [", op.local_offset, ", +", op.length,
                                                ") starts before the registered memory of region ",
                                                op.local->export_id, " (at offset ", f->second, ")"));
    }
    return fits(op.remote_offset, opened_[op.remote->export_id]->region.size, "remote", op.remote->export_id);
  }

  absl::StatusOr<uint64_t> NotifyLocked(uint64_t export_id, uint64_t value, std::optional<absl::string_view> message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!opened_.contains(export_id)) {
      return absl::FailedPreconditionError(absl::StrCat("region ", export_id, " was not opened by this engine"));
    }
    if (message.has_value() && message->size() > kMaxNotifyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a notification carries at most ", kMaxNotifyBytes, " bytes, not ", message->size()));
    }
    // Every copy must be visible before the notification leaves (the relay
    // orders it after its own copies; in-process copies are waited for).
    for (TransportBackend* t : transports_->All()) PODLINK_RETURN_IF_ERROR(t->Fence());
    RelayBackend& relay = transports_->relay();
    uint64_t id = next_batch_++;
    batches_[id].parts.push_back(&relay);
    absl::Status pushed = message.has_value() ? relay.NotifyMessage(id, export_id, value, *message)
                                              : relay.Notify(id, export_id, value);
    if (!pushed.ok()) {
      batches_.erase(id);
      return pushed;
    }
    return id;
  }

  // Done once every backend's part is; the backends forget their parts then.
  absl::StatusOr<bool> PollLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = batches_.find(id);
    if (it == batches_.end()) return absl::NotFoundError(absl::StrCat("no batch ", id, " (already waited for?)"));
    Batch& b = it->second;
    for (size_t i = 0; i < b.parts.size();) {
      absl::Status part;
      PODLINK_ASSIGN_OR_RETURN(bool done, b.parts[i]->Poll(id, &part));
      if (!done) return false;
      if (!part.ok() && b.status.ok()) b.status = part;
      b.parts.erase(b.parts.begin() + static_cast<std::ptrdiff_t>(i));
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
        transports_->relay().RingDoorbell();
        mu_.Unlock();
        sched_yield();
        mu_.Lock();
      }
    }
  }

  Client& client_;
  const Options opt_;
  std::string node_id_;
  std::string node_name_;
  uint32_t mesh_port_ = 0;
  std::vector<std::string> mesh_addresses_;

  absl::Mutex mu_;  // the engine's state below, and every backend (they are called with it held)
  // Set once in Init. Its backends are called with mu_ held; Choose (in
  // Open, without mu_) reads only the options.
  std::unique_ptr<Transports> transports_;
  uint64_t next_batch_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Batch> batches_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<Opened>> opened_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> remote_keys_ ABSL_GUARDED_BY(mu_);  // "node id/export id" -> remote handle
  std::map<uint64_t, RegionDescriptor> local_ ABSL_GUARDED_BY(mu_);  // registered regions
  std::map<uint64_t, uint64_t> local_floor_ ABSL_GUARDED_BY(mu_);    // RegisterHost's: the first offset mapped
  bool logged_[5] ABSL_GUARDED_BY(mu_) = {false, false, false, false, false};
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
  return impl_->Register(id, buf.size(), nullptr, buf.device_ptr(), buf.device(), buf.handle_type(), buf.gpu_uuid());
}

absl::StatusOr<LocalRegion> TransferEngine::Register(const HostBuffer& buf, const ExportOptions& opts) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->client().Export(buf, opts));
  return impl_->Register(id, buf.size(), buf.data(), 0, -1, HandleType::kHostMemfd, "");
}

absl::StatusOr<LocalRegion> TransferEngine::RegisterExisting(uint64_t device_ptr, size_t size,
                                                             const ExportOptions& opts) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->client().ExportExisting(device_ptr, size, opts));
  // The descriptor's GPU UUID is informational; the daemon knows the export's GPU.
  return impl_->Register(id, size, nullptr, device_ptr, AllocationDevice(device_ptr), HandleType::kPosixFd, "");
}

absl::StatusOr<TransferEngine::HostRange> TransferEngine::RegisterHost(void* addr, size_t size,
                                                                      const ExportOptions& opts) {
  absl::StatusOr<MemfdRange> found = FindMemfd(addr, size);
  if (!found.ok() && absl::IsNotFound(found.status())) {
    // Memory as it is (malloc, numpy): podlinkd's relay reads and writes it
    // in this process.
    PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->client().ExportProcessMemory(addr, size, opts));
    PODLINK_ASSIGN_OR_RETURN(LocalRegion r,
                             impl_->Register(id, size, addr, 0, -1, HandleType::kProcessMemory, ""));
    return HostRange{r, 0};
  }
  PODLINK_ASSIGN_OR_RETURN(MemfdRange m, std::move(found));
  // The export ends where the range does: offsets past it are no one's business.
  const uint64_t export_size = m.file_offset + size;
  PODLINK_ASSIGN_OR_RETURN(uint64_t id, impl_->client().ExportHostFd(m.fd.get(), export_size, opts));
  // The region's host pointer stands for offset 0 of the file, which this
  // process may not have mapped: the engine takes no local offset below the range.
  void* base = static_cast<char*>(addr) - m.file_offset;
  PODLINK_ASSIGN_OR_RETURN(LocalRegion r, impl_->Register(id, export_size, base, 0, -1, HandleType::kHostMemfd, ""));
  impl_->SetFloor(id, m.file_offset);
  return HostRange{r, m.file_offset};
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
  return impl_->Notify(remote.export_id, value, std::nullopt);
}
absl::Status TransferEngine::Notify(const RemoteRegion& remote, uint64_t value, absl::string_view message) {
  return impl_->Notify(remote.export_id, value, message);
}
absl::StatusOr<uint64_t> TransferEngine::NotifyAsync(const RemoteRegion& remote, uint64_t value,
                                                     std::optional<absl::string_view> message) {
  return impl_->NotifyAsync(remote.export_id, value, message);
}
std::vector<Notification> TransferEngine::PollNotifications() { return impl_->PollNotifications(); }

}  // namespace podlink
