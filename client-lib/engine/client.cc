#include "podlink/client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "client-lib/engine/existing_range.h"
#include "common/cuda_driver.h"
#include "common/fd_channel.h"
#include "common/metadata_keys.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "grpcpp/grpcpp.h"
#include "podlink/v1/podlink.grpc.pb.h"

namespace podlink {

const char* HandleTypeName(HandleType t) {
  switch (t) {
    case HandleType::kPosixFd:
      return "posix-fd";
    case HandleType::kFabric:
      return "fabric";
    case HandleType::kHostMemfd:
      return "host-memfd";
    case HandleType::kProcessMemory:
      return "process-memory";
  }
  return "unknown";
}

namespace {

std::string ResolveSocketDir(const std::string& configured) {
  if (!configured.empty()) return configured;
  const char* env = getenv("PODLINK_SOCKET_DIR");
  if (env == nullptr || *env == '\0') return "/run/podlink";
  std::string p = env;
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return p;
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

ExportInfo FromProto(const v1::ExportInfo& e) {
  ExportInfo out;
  out.export_id = e.export_id();
  out.name = e.name();
  out.size = e.size();
  out.gpu_uuid = e.gpu_uuid();
  out.handle_type = static_cast<HandleType>(e.handle_type());
  out.owner = {e.owner().namespace_(), e.owner().name()};
  for (const auto& p : e.allowed_importers()) out.allowed_importers.push_back({p.namespace_(), p.name()});
  out.peer_group = e.peer_group();
  out.import_count = e.import_count();
  out.imports_total = e.imports_total();
  out.owned_by_caller = e.owned_by_caller();
  out.chunk_sizes.assign(e.chunk_sizes().begin(), e.chunk_sizes().end());
  out.offset = e.offset();
  return out;
}

// Retains `device`'s primary context (the one the CUDA runtime uses, so
// buffers interoperate with cudaMemcpy and friends) and makes it current on
// this thread. On success the caller owns one reference and stores the device
// in `*retained`, to be released with cuDevicePrimaryCtxRelease.
absl::Status RetainAndUse(const cu::Driver& d, int device, int* retained) {
  cu::Context ctx = nullptr;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.DevicePrimaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain"));
  *retained = device;
  return cu::CuStatus(d.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

// Reserves `size` bytes of address space, maps `handle` there and grants
// read-write access from `device`. Leaves nothing behind on failure.
// Gives `device` read-write access to every chunk mapped back to back from `base`: the first failure's result.
cu::Result SetChunksAccess(const cu::Driver& d, const std::vector<std::pair<unsigned long long, uint64_t>>& chunks,
                           cu::DevicePtr base, int device) {
  cu::MemAccessDesc access{{cu::kLocationTypeDevice, device}, cu::kAccessProtReadWrite};
  for (const auto& [handle, size] : chunks) {
    if (cu::Result r = d.MemSetAccess(base, size, &access, 1); r != cu::kSuccess) return r;
    base += size;
  }
  return cu::kSuccess;
}

// Reserves `span` bytes and maps each allocation whole at its place, back to
// back, with read-write access from `device`; on failure nothing stays mapped
// or reserved (the handles stay the caller's).
absl::StatusOr<cu::DevicePtr> MapChunksWithAccess(const cu::Driver& d,
                                                  const std::vector<std::pair<unsigned long long, uint64_t>>& chunks,
                                                  uint64_t span, int device) {
  cu::DevicePtr base = 0;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.MemAddressReserve(&base, span, 0, 0, 0), "cuMemAddressReserve"));
  size_t mapped = 0;
  cu::DevicePtr at = base;
  absl::Status st;
  for (const auto& [handle, size] : chunks) {
    if (cu::Result r = d.MemMap(at, size, 0, handle, 0); r != cu::kSuccess) {
      st = cu::CuStatus(r, "cuMemMap");
      break;
    }
    ++mapped;
    at += size;
  }
  if (cu::Result r = st.ok() ? SetChunksAccess(d, chunks, base, device) : cu::kSuccess; r != cu::kSuccess) {
    st = cu::CuStatus(r, absl::StrCat("cuMemSetAccess from device ", device,
                                      " (is peer access between the GPUs possible?)").c_str());
  }
  if (!st.ok()) {
    at = base;
    for (size_t i = 0; i < mapped; ++i) {
      d.MemUnmap(at, chunks[i].second);
      at += chunks[i].second;
    }
    d.MemAddressFree(base, span);
    return st;
  }
  return base;
}

absl::StatusOr<cu::DevicePtr> MapWithAccess(const cu::Driver& d, cu::MemHandle handle, size_t size, int device) {
  return MapChunksWithAccess(d, {{handle, size}}, size, device);
}

absl::StatusOr<std::string> DeviceUuid(const cu::Driver& d, int device) {
  cu::Device dev;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.DeviceGet(&dev, device), "cuDeviceGet"));
  cu::Uuid u{};
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.DeviceGetUuid(&u, dev), "cuDeviceGetUuid"));
  return cu::FormatUuid(u);
}

}  // namespace

// ---------------------------------------------------------------------------

class Client::Impl {
 public:
  Impl(UniqueFd sock, uint64_t session, std::string credential, std::shared_ptr<grpc::Channel> ch,
       absl::Duration timeout)
      : sock_(std::move(sock)),
        session_(session),
        credential_(std::move(credential)),
        stub_(v1::Broker::NewStub(ch)),
        timeout_(timeout),
        pid_(::getpid()) {}

  // The process that connected (podlinkd knows the session by it).
  pid_t pid() const { return pid_; }

  // `at_least`: calls that wait on something slower than the daemon itself
  // (another node's daemon) get that much time even when the client's
  // timeout is shorter.
  void Prepare(grpc::ClientContext& ctx, absl::Duration at_least = absl::ZeroDuration()) const {
    ctx.AddMetadata(kSessionMetadataKey, credential_);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(absl::ToInt64Microseconds(std::max(timeout_, at_least))));
  }

  template <typename Req, typename Resp, typename Method>
  absl::StatusOr<Resp> Call(Method method, const Req& req, absl::Duration at_least = absl::ZeroDuration()) {
    grpc::ClientContext ctx;
    Prepare(ctx, at_least);
    Resp resp;
    grpc::Status st = (stub_.get()->*method)(&ctx, req, &resp);
    if (!st.ok()) {
      absl::Status s = FromGrpcStatus(st);
      // UNAVAILABLE that podlinkd answered itself (another node unreachable,
      // podlinkd stopping) is passed on as it is; without its mark, the call
      // never reached it.
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE &&
          ctx.GetServerTrailingMetadata().count(kAnswerMetadataKey) == 0) {
        return absl::UnavailableError(absl::StrCat("podlinkd unreachable: ", s.message()));
      }
      return s;
    }
    return resp;
  }

  // Hands `fd` to the daemon and waits for its ack; returns the slot.
  absl::StatusOr<uint64_t> Offer(int fd) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    uint64_t slot = next_offer_++;
    FdMessage m;
    m.type = static_cast<uint16_t>(FdMsgType::kOffer);
    m.seq = slot;
    PODLINK_RETURN_IF_ERROR(SendFdMessage(sock_.get(), m, fd, /*dontwait=*/false));
    for (;;) {
      PODLINK_ASSIGN_OR_RETURN(ReceivedMessage r, ReadOneLocked());
      if (r.msg.type == static_cast<uint16_t>(FdMsgType::kOfferAck) && r.msg.seq == slot) {
        if (r.msg.a != 0) {
          const char* why = r.msg.a == EMFILE   ? "podlinkd refused the descriptor (too many offered "
                                                  "but not exported)"
                             : r.msg.a == EINVAL ? "podlinkd refused the descriptor (only memfds, cuMem "
                                                  "handles and eventfds may be offered)"
                                                : "podlinkd refused the descriptor";
          return ErrnoStatus(static_cast<int>(r.msg.a), why);
        }
        return slot;
      }
    }
  }

  // Waits for the descriptor the daemon delivered in `slot`.
  absl::StatusOr<UniqueFd> TakeDelivery(uint64_t slot) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    for (;;) {
      auto it = delivered_.find(slot);
      if (it != delivered_.end()) {
        UniqueFd fd = std::move(it->second.fd);
        delivered_.erase(it);
        return fd;
      }
      PODLINK_RETURN_IF_ERROR(ReadOneLocked().status());
    }
  }

  // Closes what arrived in `slot`, if anything did (an answer this client refuses: nothing waits for it).
  void DiscardDelivery(uint64_t slot) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    delivered_.erase(slot);
  }

  uint64_t session() const { return session_; }
  v1::Broker::Stub* stub() { return stub_.get(); }
  const std::string& credential() const { return credential_; }

 private:
  // Reads one message; stashes deliveries. Fails on GOODBYE, EOF, timeout.
  absl::StatusOr<ReceivedMessage> ReadOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    pollfd p{sock_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout_)));
    if (r == 0) return absl::DeadlineExceededError("podlinkd did not answer on the descriptor channel");
    if (r < 0) return ErrnoStatus(errno, "poll descriptor channel");
    PODLINK_ASSIGN_OR_RETURN(std::optional<ReceivedMessage> got, RecvFdMessage(sock_.get(), false));
    if (!got) return absl::UnavailableError("descriptor channel: no message");
    ReceivedMessage m = std::move(*got);
    if (m.msg.type == static_cast<uint16_t>(FdMsgType::kGoodbye)) {
      return absl::UnavailableError("podlinkd closed this session");
    }
    if (m.msg.type == static_cast<uint16_t>(FdMsgType::kDeliver)) {
      absl::Time now = absl::Now();
      // A delivery is claimed right after its Import returns, and the daemon
      // sends it before answering; one nobody claimed within two call
      // timeouts belongs to an Import that timed out here, and never will be.
      absl::erase_if(delivered_, [&](const auto& kv) { return now - kv.second.at > 2 * timeout_; });
      if (m.fd.valid()) delivered_[m.msg.seq] = Delivery{std::move(m.fd), now};
    }
    return m;
  }

  UniqueFd sock_;
  const uint64_t session_;
  const std::string credential_;
  std::unique_ptr<v1::Broker::Stub> stub_;
  const absl::Duration timeout_;
  const pid_t pid_;

  absl::Mutex mu_;  // serializes use of the descriptor channel; protects below
  uint64_t next_offer_ ABSL_GUARDED_BY(mu_) = 1;
  struct Delivery {
    UniqueFd fd;
    absl::Time at;
  };
  absl::flat_hash_map<uint64_t, Delivery> delivered_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------

HostBuffer::~HostBuffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

namespace {
// Undoes what allocation/import and MapWithAccess set up, in reverse order;
// zero / negative members mean "not set up".
void ReleaseCuMemory(unsigned long long va, size_t reserved, unsigned long long handle, int ctx_device) {
  if (va == 0 && handle == 0 && ctx_device < 0) return;
  auto d = cu::LoadDriver();
  if (!d.ok()) return;
  if (va != 0) {
    (*d)->MemUnmap(va, reserved);
    (*d)->MemAddressFree(va, reserved);
  }
  if (handle != 0) (*d)->MemRelease(handle);
  if (ctx_device >= 0) (*d)->DevicePrimaryCtxRelease(ctx_device);
}
}  // namespace

GpuBuffer::~GpuBuffer() { ReleaseCuMemory(va_, size_, handle_, ctx_device_); }

Imported::Imported(Imported&& o) noexcept
    : remote_handle_(o.remote_handle_),
      info_(std::move(o.info_)),
      fd_(std::exchange(o.fd_, -1)),
      chunk_fds_(std::exchange(o.chunk_fds_, {})),
      fabric_handle_(std::move(o.fabric_handle_)),
      gpu_pci_bus_id_(std::move(o.gpu_pci_bus_id_)),
      gpu_device_node_(std::move(o.gpu_device_node_)) {}

Imported::~Imported() {
  if (!chunk_fds_.empty()) {
    for (int fd : chunk_fds_) ::close(fd);  // fd_ is the first of them
  } else if (fd_ >= 0) {
    ::close(fd_);
  }
}

Mapping::~Mapping() {
  if (host_ != nullptr) ::munmap(host_, size_);
  if (!chunks_.empty()) {
    // Each allocation was mapped on its own, at its place in one reservation.
    auto d = cu::LoadDriver();
    if (d.ok()) {
      uint64_t at = base_;
      for (const auto& [handle, size] : chunks_) {
        (*d)->MemUnmap(at, size);
        (*d)->MemRelease(handle);
        at += size;
      }
      (*d)->MemAddressFree(base_, reserved_);
    }
  }
  ReleaseCuMemory(0, 0, 0, ctx_device_);
}

// ---------------------------------------------------------------------------

namespace {

// A refusal: GOODBYE's code and the reason podlinkd sends right after it
// (docs/contract.md); older daemons send no reason.
absl::Status GoodbyeStatus(int sock, const FdMessage& m) {
  const uint64_t code = m.a;
  const auto status_code = code >= 1 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
  std::string reason;
  if (m.b > 0 && m.b <= kGoodbyeTextMax) {
    std::string buf(kGoodbyeTextMax, '\0');
    pollfd p{sock, POLLIN, 0};  // sent right after GOODBYE, perhaps not here yet
    int ready;
    do {
      ready = ::poll(&p, 1, 1000);
    } while (ready < 0 && errno == EINTR);
    ssize_t n = ready == 1 ? ::recv(sock, buf.data(), buf.size(), MSG_DONTWAIT) : -1;
    if (n > 0) reason.assign(buf.data(), static_cast<size_t>(std::min<uint64_t>(m.b, static_cast<uint64_t>(n))));
  }
  // Printable ASCII only: it ends up in the caller's logs and terminals, and
  // parts of it (a cgroup path, the runtime's error) are not podlinkd's words.
  for (char& c : reason) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  if (reason.empty()) {
    reason = "its log names the reason (commonly: the daemon does not run in the host PID namespace, or its session "
             "limit is reached)";
  }
  return absl::Status(status_code, absl::StrCat("podlinkd refused this client: ", reason));
}

}  // namespace

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

uint64_t Client::session_id() const { return impl_->session(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  const std::string dir = ResolveSocketDir(options.socket_dir);
  const std::string fd_path = dir + "/podlink.fd.sock";
  const std::string grpc_path = dir + "/podlink.sock";
  sockaddr_un addr{};
  if (fd_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", fd_path));
  }
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock) return ErrnoStatus(errno, "socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, fd_path.c_str(), fd_path.size() + 1);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    return absl::UnavailableError(absl::StrCat(
        "cannot reach podlinkd at ", fd_path, ": ", std::strerror(err),
        ". Is podlinkd running, and is its socket directory mounted into this container "
        "(set PODLINK_SOCKET_DIR to its location)?"));
  }
  pollfd p{sock.get(), POLLIN, 0};
  int r = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(options.timeout)));
  if (r <= 0) return absl::DeadlineExceededError("podlinkd did not greet this client in time");
  PODLINK_ASSIGN_OR_RETURN(std::optional<ReceivedMessage> hello, RecvFdMessage(sock.get(), false));
  if (!hello) return absl::UnavailableError("podlinkd sent nothing");
  if (hello->msg.type == static_cast<uint16_t>(FdMsgType::kGoodbye)) {
    return GoodbyeStatus(sock.get(), hello->msg);
  }
  if (hello->msg.type != static_cast<uint16_t>(FdMsgType::kHello)) {
    return absl::InternalError("podlinkd sent an unexpected first message");
  }
  std::string credential = absl::StrFormat("%d.%016x%016x", hello->msg.seq, hello->msg.a, hello->msg.b);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  auto channel = grpc::CreateCustomChannel("unix:" + grpc_path, grpc::InsecureChannelCredentials(), args);
  auto impl = std::make_unique<Impl>(std::move(sock), hello->msg.seq, std::move(credential), channel,
                                     options.timeout);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<NodeInfo> Client::GetNodeInfo() {
  PODLINK_ASSIGN_OR_RETURN(v1::NodeInfo n, (impl_->Call<v1::GetNodeInfoRequest, v1::NodeInfo>(
                                               &v1::Broker::Stub::GetNodeInfo, v1::GetNodeInfoRequest())));
  NodeInfo out;
  out.node_id = n.node_id();
  out.node_name = n.node_name();
  out.daemon_version = n.daemon_version();
  out.cuda_available = n.cuda_available();
  out.cuda_status = n.cuda_status();
  out.cuda_driver_version = n.cuda_driver_version();
  for (const v1::Gpu& g : n.gpus()) {
    GpuInfo gi;
    gi.index = g.index();
    gi.uuid = g.uuid();
    gi.pci_bus_id = g.pci_bus_id();
    gi.device_node = g.device_node();
    gi.name = g.name();
    gi.total_memory = g.total_memory();
    gi.granularity = g.granularity();
    gi.posix_fd_supported = g.posix_fd_supported();
    gi.fabric_supported = g.fabric_supported();
    for (const auto& p : g.peers()) gi.peers.push_back({p.uuid(), p.link_count(), p.p2p_supported()});
    out.gpus.push_back(std::move(gi));
  }
  for (int t : n.handle_types()) out.handle_types.push_back(static_cast<HandleType>(t));
  out.mesh_addresses.assign(n.mesh_addresses().begin(), n.mesh_addresses().end());
  out.mesh_port = n.mesh_port();
  for (const auto& l : n.mesh_links()) {
    out.mesh_nics.push_back({l.address(), l.netdev(), l.speed_mbps(), l.pci_path(), l.numa_node()});
  }
  return out;
}

absl::StatusOr<Identity> Client::WhoAmI() {
  PODLINK_ASSIGN_OR_RETURN(v1::WhoAmIResponse r, (impl_->Call<v1::WhoAmIRequest, v1::WhoAmIResponse>(
                                                     &v1::Broker::Stub::WhoAmI, v1::WhoAmIRequest())));
  const v1::Identity& i = r.identity();
  Identity out;
  out.session_id = r.session_id();
  out.pid = i.pid();
  out.uid = i.uid();
  out.gid = i.gid();
  out.container_id = i.container_id();
  out.pod_uid = i.pod_uid();
  out.namespace_ = i.namespace_();
  out.pod_name = i.pod_name();
  out.qos_class = i.qos_class();
  out.cgroup_path = i.cgroup_path();
  out.source = i.source();
  for (const auto& [k, v] : i.annotations()) out.annotations[k] = v;
  return out;
}

absl::StatusOr<std::unique_ptr<HostBuffer>> Client::AllocateHost(size_t size) {
  if (size == 0) return absl::InvalidArgumentError("size must be > 0");
  UniqueFd fd(::memfd_create("podlink-host", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return ErrnoStatus(errno, "memfd_create");
  // Populated now, on this process's memory account: podlinkd refuses sparse
  // exports (it would pay for their pages when it copies into them).
  if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)); err != 0) {
    return ErrnoStatus(err, absl::StrCat("allocating ", size, " bytes of host memory (fallocate memfd)"));
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(errno, "seal memfd");
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap memfd");
  return std::unique_ptr<HostBuffer>(new HostBuffer(fd.Release(), p, size));
}

namespace {
void FillExport(v1::ExportRequest& req, const ExportOptions& opts) {
  req.set_name(opts.name);
  req.set_mesh_affinity(opts.mesh_affinity);
  for (const PodRef& p : opts.allowed_importers) {
    v1::PodRef* r = req.add_allowed_importers();
    r->set_namespace_(p.namespace_);
    r->set_name(p.name);
  }
}
}  // namespace

absl::StatusOr<uint64_t> Client::Export(const HostBuffer& buf, const ExportOptions& opts) {
  return ExportHostFd(buf.fd(), buf.size(), opts);
}

absl::StatusOr<uint64_t> Client::ExportHostFd(int memfd, size_t size, const ExportOptions& opts) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t slot, impl_->Offer(memfd));
  v1::ExportRequest req;
  FillExport(req, opts);
  req.set_size(size);
  req.set_handle_type(v1::HANDLE_TYPE_HOST_MEMFD);
  req.set_fd_slot(slot);
  PODLINK_ASSIGN_OR_RETURN(v1::ExportResponse r, (impl_->Call<v1::ExportRequest, v1::ExportResponse>(
                                                     &v1::Broker::Stub::Export, req)));
  return r.export_id();
}

absl::StatusOr<uint64_t> Client::ExportProcessMemory(const void* addr, size_t size, const ExportOptions& opts) {
  if (::getpid() != impl_->pid()) {
    return absl::FailedPreconditionError(
        "this Client was connected by another process (the parent before a fork): podlinkd would address that "
        "process's memory, not this one's; connect a Client in this process");
  }
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  if (a == 0 || size == 0 || a + size < a) return absl::InvalidArgumentError("an empty, null or wrapping range");
  v1::ExportRequest req;
  FillExport(req, opts);
  req.set_size(size);
  req.set_handle_type(v1::HANDLE_TYPE_PROCESS_MEMORY);
  req.set_address(a);
  PODLINK_ASSIGN_OR_RETURN(v1::ExportResponse r, (impl_->Call<v1::ExportRequest, v1::ExportResponse>(
                                                     &v1::Broker::Stub::Export, req)));
  return r.export_id();
}

absl::StatusOr<std::unique_ptr<GpuBuffer>> Client::AllocateGpu(size_t size, int device, HandleType type) {
  if (size == 0) return absl::InvalidArgumentError("size must be > 0");
  if (type == HandleType::kHostMemfd) return absl::InvalidArgumentError("use AllocateHost for host memory");
  PODLINK_ASSIGN_OR_RETURN(const cu::Driver* d, cu::LoadDriver());
  std::unique_ptr<GpuBuffer> buf(new GpuBuffer());
  PODLINK_RETURN_IF_ERROR(RetainAndUse(*d, device, &buf->ctx_device_));
  buf->device_ = device;
  PODLINK_ASSIGN_OR_RETURN(buf->uuid_, DeviceUuid(*d, device));
  cu::MemAllocationProp prop{};
  prop.type = cu::kAllocationTypePinned;
  prop.location = {cu::kLocationTypeDevice, device};
  prop.requestedHandleTypes = cu::kHandleTypePosixFd;
  // So a NIC can reach it by DMA-BUF (the mesh's verbs backend) where the
  // device allows the flag with VMM allocations.
  int gdr = 0;
  if (d->DeviceGetAttribute(&gdr, cu::kAttrGpuDirectRdmaWithVmm, device) == cu::kSuccess && gdr != 0) {
    prop.allocFlags.gpuDirectRDMACapable = 1;
  }
  size_t gran = 0;
  PODLINK_RETURN_IF_ERROR(
      cu::CuStatus(d->MemGetAllocationGranularity(&gran, &prop, 0), "cuMemGetAllocationGranularity"));
  size = (size + gran - 1) / gran * gran;
  cu::Result r = cu::kErrorNotSupported;
  if (type == HandleType::kFabric) {
    prop.requestedHandleTypes = cu::kHandleTypeFabric | cu::kHandleTypePosixFd;
    r = d->MemCreate(&buf->handle_, size, &prop, 0);
    if (r == cu::kSuccess) buf->type_ = HandleType::kFabric;
  }
  if (r != cu::kSuccess) {  // POSIX-FD, or fabric refused (no IMEX channel)
    prop.requestedHandleTypes = cu::kHandleTypePosixFd;
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(d->MemCreate(&buf->handle_, size, &prop, 0), "cuMemCreate"));
    buf->type_ = HandleType::kPosixFd;
  }
  PODLINK_ASSIGN_OR_RETURN(buf->va_, MapWithAccess(*d, buf->handle_, size, device));
  buf->size_ = size;
  return buf;
}

absl::StatusOr<uint64_t> Client::Export(const GpuBuffer& buf, const ExportOptions& opts) {
  PODLINK_ASSIGN_OR_RETURN(const cu::Driver* d, cu::LoadDriver());
  v1::ExportRequest req;
  FillExport(req, opts);
  req.set_size(buf.size());
  req.set_gpu_uuid(buf.gpu_uuid());
  if (buf.handle_type() == HandleType::kFabric) {
    cu::FabricHandle fh{};
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(
        d->MemExportToShareableHandle(&fh, buf.handle_, cu::kHandleTypeFabric, 0), "cuMemExportToShareableHandle"));
    req.set_handle_type(v1::HANDLE_TYPE_FABRIC);
    req.set_fabric_handle(std::string(reinterpret_cast<const char*>(fh.data), sizeof(fh.data)));
  } else {
    int raw = -1;
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(
        d->MemExportToShareableHandle(&raw, buf.handle_, cu::kHandleTypePosixFd, 0), "cuMemExportToShareableHandle"));
    UniqueFd fd(raw);
    PODLINK_ASSIGN_OR_RETURN(uint64_t slot, impl_->Offer(fd.get()));
    req.set_handle_type(v1::HANDLE_TYPE_POSIX_FD);
    req.set_fd_slot(slot);
  }
  PODLINK_ASSIGN_OR_RETURN(v1::ExportResponse r, (impl_->Call<v1::ExportRequest, v1::ExportResponse>(
                                                     &v1::Broker::Stub::Export, req)));
  return r.export_id();
}

absl::StatusOr<uint64_t> Client::ExportExisting(uint64_t device_ptr, size_t size, const ExportOptions& opts) {
  PODLINK_ASSIGN_OR_RETURN(const cu::Driver* d, cu::LoadDriver());
  PODLINK_ASSIGN_OR_RETURN(ExistingRange range, FindExistingRange(*d, device_ptr, size));
  PODLINK_ASSIGN_OR_RETURN(std::string uuid, DeviceUuid(*d, range.device));
  v1::ExportRequest req;
  FillExport(req, opts);
  req.set_size(size);
  req.set_gpu_uuid(uuid);
  req.set_handle_type(v1::HANDLE_TYPE_POSIX_FD);
  // Each allocation's descriptor goes to podlinkd (which keeps its own
  // duplicate) before the request names them; this process's copies close here.
  for (const ExistingChunk& c : range.chunks) {
    int raw = -1;
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(d->MemExportToShareableHandle(&raw, c.handle, cu::kHandleTypePosixFd, 0),
                                         "cuMemExportToShareableHandle"));
    UniqueFd fd(raw);
    PODLINK_ASSIGN_OR_RETURN(uint64_t slot, impl_->Offer(fd.get()));
    if (range.Whole(size)) {
      req.set_fd_slot(slot);  // one allocation from its start: the plain form every podlinkd knows
    } else {
      v1::ExportChunk* chunk = req.add_chunks();
      chunk->set_fd_slot(slot);
      chunk->set_size(c.size);
    }
  }
  req.set_offset(range.Whole(size) ? 0 : range.offset);
  PODLINK_ASSIGN_OR_RETURN(v1::ExportResponse resp, (impl_->Call<v1::ExportRequest, v1::ExportResponse>(
                                                        &v1::Broker::Stub::Export, req)));
  return resp.export_id();
}

absl::StatusOr<Imported> Client::Import(uint64_t export_id) {
  v1::ImportRequest req;
  req.set_export_id(export_id);
  return DoImport(req);
}

absl::StatusOr<Imported> Client::Import(const std::string& name) {
  v1::ImportRequest req;
  req.set_name(name);
  return DoImport(req);
}

absl::StatusOr<Imported> Client::DoImport(const v1::ImportRequest& req) {
  PODLINK_ASSIGN_OR_RETURN(v1::ImportResponse r, (impl_->Call<v1::ImportRequest, v1::ImportResponse>(
                                                     &v1::Broker::Stub::Import, req)));
  Imported imp;
  imp.info_ = FromProto(r.export_());
  imp.gpu_pci_bus_id_ = r.gpu_pci_bus_id();
  imp.gpu_device_node_ = r.gpu_device_node();
  if (imp.info_.handle_type == HandleType::kFabric) {
    imp.fabric_handle_ = r.fabric_handle();
  } else if (imp.info_.handle_type == HandleType::kProcessMemory) {
    // Nothing to hold: only podlinkd's relay reaches it.
  } else if (r.chunk_delivery_slots_size() > 0) {
    if (static_cast<size_t>(r.chunk_delivery_slots_size()) != imp.info_.chunk_sizes.size()) {
      for (uint64_t slot : r.chunk_delivery_slots()) impl_->DiscardDelivery(slot);
      return absl::InternalError(absl::StrCat("podlinkd delivered ", r.chunk_delivery_slots_size(),
                                              " descriptors for export ", imp.info_.export_id, " of ",
                                              imp.info_.chunk_sizes.size(), " allocations"));
    }
    for (uint64_t slot : r.chunk_delivery_slots()) {
      PODLINK_ASSIGN_OR_RETURN(UniqueFd fd, impl_->TakeDelivery(slot));
      imp.chunk_fds_.push_back(fd.Release());
    }
    imp.fd_ = imp.chunk_fds_.front();
  } else {
    PODLINK_ASSIGN_OR_RETURN(UniqueFd fd, impl_->TakeDelivery(r.delivery_slot()));
    imp.fd_ = fd.Release();
  }
  return imp;
}

namespace {

// Why an import of `imp`'s memory into this process failed (cuMemImportFromShareableHandle's `r`), and the way out.
absl::Status MapFailure(const Imported& imp, cu::Result r) {
  const ExportInfo& info = imp.info();
  std::string where = imp.gpu_device_node().empty()
                          ? absl::StrCat("GPU ", info.gpu_uuid)
                          : absl::StrCat("GPU ", info.gpu_uuid, " (", imp.gpu_pci_bus_id(), ", ",
                                         imp.gpu_device_node(), ")");
  std::string cause = cu::CuStatus(r, "cuMemImportFromShareableHandle").ToString();
  if (r == cu::kErrorInvalidDevice || r == cu::kErrorNoDevice) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot map export ", info.export_id, ": the ", where,
        " that holds it is not accessible in this container (", cause,
        "). Either let podlinkd move the bytes (relay: podlink write/read), or opt the pod into "
        "direct mode (annotation podlink.io/direct=true, which mounts the peer GPU's device node)"));
  }
  return absl::Status(cu::CuStatus(r, "x").code(),
                      absl::StrCat("cannot map export ", info.export_id, " of ", where, ": ", cause));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Mapping>> Client::Map(const Imported& imp, int access_device) {
  std::unique_ptr<Mapping> m(new Mapping());
  const ExportInfo& info = imp.info();
  if (info.handle_type == HandleType::kProcessMemory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export ", info.export_id, " is another process's memory as it is (malloc, numpy): it cannot be mapped; "
        "podlinkd's relay moves it (podlink write/read)"));
  }
  if (info.handle_type == HandleType::kHostMemfd) {
    void* p = ::mmap(nullptr, info.size, PROT_READ | PROT_WRITE, MAP_SHARED, imp.fd(), 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap imported memfd");
    m->host_ = p;
    m->size_ = info.size;
    return m;
  }
  PODLINK_ASSIGN_OR_RETURN(const cu::Driver* d, cu::LoadDriver());
  if (access_device >= 0) PODLINK_RETURN_IF_ERROR(RetainAndUse(*d, access_device, &m->ctx_device_));
  // The allocations to map back to back in one reservation, each whole, with
  // the export's byte 0 at `offset` in the first: one for a plain export, one
  // per cuMem allocation for a chunked one (torch's expandable segments).
  std::vector<std::pair<unsigned long long, uint64_t>> chunks;
  auto release = [&] {
    for (const auto& c : chunks) d->MemRelease(c.first);
  };
  uint64_t span = 0;
  if (!info.chunk_sizes.empty()) {
    // The layout was checked by podlinkd; checked again here, as it decides where this process maps.
    if (imp.chunk_fds_.size() != info.chunk_sizes.size()) {
      return absl::FailedPreconditionError(absl::StrCat("export ", info.export_id, " is ", info.chunk_sizes.size(),
                                                        " allocations; this import holds ",
                                                        imp.chunk_fds_.size(), " descriptors"));
    }
    for (uint64_t c : info.chunk_sizes) {
      if (c == 0 || span + c < span) return absl::InvalidArgumentError("export's allocation sizes do not add up");
      span += c;
    }
    if (info.offset >= info.chunk_sizes[0] || info.size > span - info.offset) {
      return absl::InvalidArgumentError(absl::StrCat("export ", info.export_id, ": ", info.size, " bytes from ",
                                                     info.offset, " do not fit its allocations (", span, ")"));
    }
    for (size_t i = 0; i < info.chunk_sizes.size(); ++i) {
      cu::MemHandle h = 0;
      cu::Result r = d->MemImportFromShareableHandle(
          &h, reinterpret_cast<void*>(static_cast<intptr_t>(imp.chunk_fds_[i])), cu::kHandleTypePosixFd);
      if (r != cu::kSuccess) {
        release();
        return MapFailure(imp, r);
      }
      chunks.emplace_back(h, info.chunk_sizes[i]);
    }
  } else {
    cu::MemHandle h = 0;
    cu::Result r;
    if (info.handle_type == HandleType::kFabric) {
      cu::FabricHandle fh{};
      std::memcpy(fh.data, imp.fabric_handle_.data(), std::min(imp.fabric_handle_.size(), sizeof(fh.data)));
      r = d->MemImportFromShareableHandle(&h, &fh, cu::kHandleTypeFabric);
    } else {
      r = d->MemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(imp.fd())),
                                          cu::kHandleTypePosixFd);
    }
    if (r != cu::kSuccess) return MapFailure(imp, r);
    chunks.emplace_back(h, 0);
  }
  cu::MemAllocationProp prop{};
  absl::Status st = cu::CuStatus(d->MemGetAllocationPropertiesFromHandle(&prop, chunks[0].first),
                                 "cuMemGetAllocationPropertiesFromHandle");
  const int dev = access_device >= 0 ? access_device : prop.location.id;
  if (st.ok() && m->ctx_device_ < 0) st = RetainAndUse(*d, dev, &m->ctx_device_);
  if (st.ok() && info.chunk_sizes.empty()) {
    // A plain export maps its size rounded up to the allocation granularity.
    size_t gran = 0;
    st = cu::CuStatus(d->MemGetAllocationGranularity(&gran, &prop, 0), "cuMemGetAllocationGranularity");
    span = chunks[0].second = (info.size + gran - 1) / gran * gran;
  }
  absl::StatusOr<cu::DevicePtr> base = st.ok() ? MapChunksWithAccess(*d, chunks, span, dev) : st;
  if (!base.ok()) {
    release();
    return base.status();
  }
  m->base_ = *base;
  m->chunks_ = std::move(chunks);
  m->reserved_ = span;
  m->va_ = *base + info.offset;
  m->size_ = info.size;
  m->device_ = dev;
  m->access_ = dev < 64 ? uint64_t{1} << dev : 0;
  if (access_device >= 0) {
    // Asked for in-process copies: let every other GPU of this process that
    // can reach the memory (peer access) use it too, so a copy can run on
    // whichever GPU holds the other side (TransferEngine picks that one).
    int count = 0;
    if (d->DeviceGetCount(&count) != cu::kSuccess) count = 0;
    for (int other = 0; other < std::min(count, 64); ++other) {
      if (other == dev) continue;
      if (SetChunksAccess(*d, m->chunks_, m->base_, other) == cu::kSuccess) m->access_ |= uint64_t{1} << other;
    }
  }
  return m;
}

absl::Status Client::Release(uint64_t export_id) {
  v1::ReleaseRequest req;
  req.set_export_id(export_id);
  return impl_->Call<v1::ReleaseRequest, v1::ReleaseResponse>(&v1::Broker::Stub::Release, req).status();
}

absl::StatusOr<Imported> Client::OpenRemote(const std::string& node_name, const std::vector<std::string>& addresses,
                                            uint32_t mesh_port, uint64_t export_id) {
  v1::OpenRemoteRequest req;
  req.set_node_name(node_name);
  for (const std::string& a : addresses) req.add_addresses(a);
  req.set_mesh_port(mesh_port);
  req.set_export_id(export_id);
  // The first open of a node dials it: TLS, link set up (QPs on every path
  // for verbs), the owner's registration of the export; through relays each
  // of them may dial the next node too. The daemon bounds each step itself
  // (mesh.open_timeout_seconds per node ahead): this is a backstop.
  PODLINK_ASSIGN_OR_RETURN(v1::OpenRemoteResponse r, (impl_->Call<v1::OpenRemoteRequest, v1::OpenRemoteResponse>(
                                                         &v1::Broker::Stub::OpenRemote, req, absl::Seconds(180))));
  Imported imp;
  imp.info_ = FromProto(r.export_());
  imp.remote_handle_ = r.handle();
  return imp;
}

absl::Status Client::DropImport(uint64_t export_id) {
  v1::ReleaseRequest req;
  req.set_export_id(export_id);
  req.set_kind(v1::ReleaseResponse::KIND_IMPORT);
  return impl_->Call<v1::ReleaseRequest, v1::ReleaseResponse>(&v1::Broker::Stub::Release, req).status();
}

absl::StatusOr<std::vector<ExportInfo>> Client::ListAll() {
  v1::ListRequest req;
  req.set_all(true);
  PODLINK_ASSIGN_OR_RETURN(v1::ListResponse r,
                           (impl_->Call<v1::ListRequest, v1::ListResponse>(&v1::Broker::Stub::List, req)));
  std::vector<ExportInfo> out;
  for (const auto& e : r.exports()) out.push_back(FromProto(e));
  return out;
}

absl::StatusOr<Client::MeshStatus> Client::GetMeshStatus() {
  PODLINK_ASSIGN_OR_RETURN(v1::MeshStatus m, (impl_->Call<v1::GetMeshStatusRequest, v1::MeshStatus>(
                                                 &v1::Broker::Stub::GetMeshStatus, v1::GetMeshStatusRequest())));
  auto link = [](const v1::MeshStatus::Link& l) {
    return MeshLink{l.address(), l.netdev(),      l.speed_mbps(), l.pci_path(), l.numa_node(),
                    l.rdma_device(), l.gid_index(), l.gid_type()};
  };
  MeshStatus out;
  out.enabled = m.enabled();
  for (const auto& l : m.links()) out.links.push_back(link(l));
  out.node_name = m.node_name();
  out.addresses.assign(m.addresses().begin(), m.addresses().end());
  out.port = m.port();
  out.data_port = m.data_port();
  for (const auto& p : m.peers()) {
    MeshPeer peer;
    peer.node = p.node();
    peer.connections_up = p.connections_up();
    peer.remote_handles = p.remote_handles();
    peer.bytes_sent = p.bytes_sent();
    peer.bytes_received = p.bytes_received();
    peer.connection_failures = p.connection_failures();
    peer.resent_slices = p.resent_slices();
    peer.transport = p.transport();
    for (const auto& l : p.links()) peer.links.push_back(link(l));
    for (const auto& c : p.connections()) peer.connections.push_back({c.path(), c.up(), c.bytes_sent()});
    out.peers.push_back(std::move(peer));
  }
  out.grants = m.grants();
  out.served_write_bytes = m.served_write_bytes();
  out.served_read_bytes = m.served_read_bytes();
  out.refused_connections = m.refused_connections();
  out.refused_frames = m.refused_frames();
  out.denials = m.denials();
  for (const auto& r : m.routes()) {
    out.routes.push_back({r.destination(), {r.via().begin(), r.via().end()}, r.remote_handles()});
  }
  out.relayed_grants = m.relayed_grants();
  out.relay_forwarded_bytes = m.relay_forwarded_bytes();
  for (const auto& k : m.known_nodes()) {
    out.known_nodes.push_back({k.node(), {k.addresses().begin(), k.addresses().end()}, k.port(), k.advert_age_seconds()});
  }
  out.remote_pods = m.remote_pods();
  out.remote_pods_problem = m.remote_pods_problem();
  return out;
}

absl::StatusOr<Client::NcclNative> Client::JoinNcclNative() {
  PODLINK_ASSIGN_OR_RETURN(v1::JoinNcclNativeResponse r,
                           (impl_->Call<v1::JoinNcclNativeRequest, v1::JoinNcclNativeResponse>(
                               &v1::Broker::Stub::JoinNcclNative, v1::JoinNcclNativeRequest())));
  NcclNative n;
  n.joined = !r.host_id().empty();
  n.host_id = r.host_id();
  n.members = r.members();
  n.shm_mounted = r.shm_mounted();
  return n;
}

absl::Status Client::SyncNcclIpc() {
  return impl_
      ->Call<v1::SyncNcclIpcRequest, v1::SyncNcclIpcResponse>(&v1::Broker::Stub::SyncNcclIpc,
                                                              v1::SyncNcclIpcRequest())
      .status();
}

absl::StatusOr<Client::NodeStats> Client::GetStats() {
  PODLINK_ASSIGN_OR_RETURN(v1::Stats s, (impl_->Call<v1::GetStatsRequest, v1::Stats>(&v1::Broker::Stub::GetStats,
                                                                                   v1::GetStatsRequest())));
  NodeStats n;
  n.sessions = s.sessions();
  n.exports = s.exports();
  n.imports_total = s.imports_total();
  n.denials_total = s.denials_total();
  n.relay_rings = s.relay_rings();
  n.relay_ops_total = s.relay_ops_total();
  n.relay_bytes_total = s.relay_bytes_total();
  n.relay_failed_total = s.relay_failed_total();
  n.relay_notifies_total = s.relay_notifies_total();
  return n;
}

absl::Status Client::OpenRelayRing(int ring_memfd, int doorbell_eventfd, uint32_t sq_entries, uint32_t cq_entries,
                                   uint32_t nq_entries, uint32_t message_slots) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t ring_slot, impl_->Offer(ring_memfd));
  PODLINK_ASSIGN_OR_RETURN(uint64_t bell_slot, impl_->Offer(doorbell_eventfd));
  v1::OpenRelayRequest req;
  req.set_ring_slot(ring_slot);
  req.set_doorbell_slot(bell_slot);
  req.set_sq_entries(sq_entries);
  req.set_cq_entries(cq_entries);
  req.set_nq_entries(nq_entries);
  req.set_message_slots(message_slots);
  return impl_->Call<v1::OpenRelayRequest, v1::OpenRelayResponse>(&v1::Broker::Stub::OpenRelay, req).status();
}

absl::StatusOr<std::vector<ExportInfo>> Client::List() {
  PODLINK_ASSIGN_OR_RETURN(v1::ListResponse r, (impl_->Call<v1::ListRequest, v1::ListResponse>(
                                                   &v1::Broker::Stub::List, v1::ListRequest())));
  std::vector<ExportInfo> out;
  for (const auto& e : r.exports()) out.push_back(FromProto(e));
  return out;
}

namespace {
class StreamWatcher : public Watcher {
 public:
  StreamWatcher(v1::Broker::Stub* stub, const std::string& credential, std::function<void(const WatchEvent&)> cb) {
    ctx_.AddMetadata(kSessionMetadataKey, credential);
    reader_ = stub->Watch(&ctx_, v1::WatchRequest());
    thread_ = std::thread([this, cb = std::move(cb)] {
      v1::Event e;
      while (reader_->Read(&e)) {
        WatchEvent we;
        we.type = static_cast<WatchEvent::Type>(e.type());
        we.export_id = e.export_id();
        we.export_name = e.export_name();
        we.reason = e.reason();
        cb(we);
      }
      status_ = reader_->Finish();
    });
  }
  ~StreamWatcher() override {
    ctx_.TryCancel();
    thread_.join();
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::Event>> reader_;
  grpc::Status status_;
  std::thread thread_;
};
}  // namespace

absl::StatusOr<std::unique_ptr<Watcher>> Client::Watch(std::function<void(const WatchEvent&)> cb) {
  return std::unique_ptr<Watcher>(new StreamWatcher(impl_->stub(), impl_->credential(), std::move(cb)));
}

}  // namespace podlink
