// libpodlink: the client library of podlinkd.
//
//   auto client = podlink::Client::Connect();                 // /run/podlink or $PODLINK_SOCKET_DIR
//   auto buf = client->AllocateGpu(64 << 20, /*device=*/0);   // exportable cuMem memory
//   auto id = client->Export(*buf, {.name = "kv-0"});
//   ...in another pod...
//   auto imp = client->Import("kv-0");
//   auto map = client->Map(*imp);                             // device pointer into the peer's memory
//
// Every call returns absl::Status / StatusOr with a message that says what to
// do. A Client is thread-safe. Objects it returns own their resources (RAII)
// and may outlive the Client, except that exports die with the Client's
// session (the daemon drops them when the session closes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "podlink/podlink.h"  // PODLINK_API

namespace podlink {
namespace v1 {
class ImportRequest;
}

// kProcessMemory: host memory of the exporting process as it is (malloc,
// numpy): no importer can map it; podlinkd's relay moves it.
enum class HandleType : int { kPosixFd = 1, kFabric = 2, kHostMemfd = 3, kProcessMemory = 4 };
PODLINK_API const char* HandleTypeName(HandleType t);

struct PodRef {
  std::string namespace_;
  std::string name;
};

struct GpuPeerInfo {
  std::string uuid;
  unsigned link_count = 0;
  bool p2p_supported = false;
};

struct GpuInfo {
  unsigned index = 0;  // the daemon's ordinal, not necessarily this process's
  std::string uuid;
  std::string pci_bus_id;
  std::string device_node;
  std::string name;
  uint64_t total_memory = 0;
  uint64_t granularity = 0;
  bool posix_fd_supported = false;
  bool fabric_supported = false;
  std::vector<GpuPeerInfo> peers;
};

struct NodeInfo {
  std::string node_id;    // podlinkd's node identity (boot id based)
  std::string node_name;  // the Kubernetes node's name, else the host name; empty from older daemons
  std::string daemon_version;
  bool cuda_available = false;
  std::string cuda_status;
  int cuda_driver_version = 0;
  std::vector<GpuInfo> gpus;
  std::vector<HandleType> handle_types;
  // The daemons' mesh (other nodes), when this node's daemon runs it.
  std::vector<std::string> mesh_addresses;  // "addr/prefix"
  uint32_t mesh_port = 0;
  // The NICs under mesh_addresses (empty from older daemons).
  struct MeshNic {
    std::string address, netdev;
    uint32_t speed_mbps = 0;  // 0: unknown
    std::string pci_path;     // the PCI function's sysfs path as the daemon reads it; empty: virtual
    int numa_node = -1;
  };
  std::vector<MeshNic> mesh_nics;
};

struct Identity {
  uint64_t session_id = 0;
  uint32_t pid = 0, uid = 0, gid = 0;
  std::string container_id, pod_uid, namespace_, pod_name, qos_class, cgroup_path, source;
  std::map<std::string, std::string> annotations;
};

struct ExportInfo {
  uint64_t export_id = 0;
  std::string name;
  uint64_t size = 0;
  std::string gpu_uuid;  // empty for host memory
  HandleType handle_type = HandleType::kHostMemfd;
  PodRef owner;
  std::vector<PodRef> allowed_importers;
  std::string peer_group;
  uint32_t import_count = 0;   // sessions holding an import now
  uint64_t imports_total = 0;  // imports ever made
  bool owned_by_caller = false;
  // GPU memory of several cuMem allocations (torch's expandable segments),
  // or a range that does not start its allocation: each allocation's size,
  // and where the export's byte 0 lies in the first. Empty otherwise.
  std::vector<uint64_t> chunk_sizes;
  uint64_t offset = 0;
};

struct ExportOptions {
  std::string name;                     // optional; unique within the pod's namespace
  std::vector<PodRef> allowed_importers;  // besides the pod's peer group
  // Host memory only: the PCI function it is used with ("0000:18:00.0"; a GPU
  // whose data it stages, or a NIC); the daemon's mesh prefers the links
  // nearest to it for this memory's transfers to other nodes.
  std::string mesh_affinity;
};

// Host memory in a sealed memfd, mapped read-write.
class PODLINK_API HostBuffer {
 public:
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  friend class Client;
  HostBuffer(int fd, void* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  void* data_;
  size_t size_;
};

// Exportable GPU memory: a cuMem allocation mapped into this process with
// read-write access from its device.
class PODLINK_API GpuBuffer {
 public:
  ~GpuBuffer();
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  uint64_t device_ptr() const { return va_; }
  size_t size() const { return size_; }
  int device() const { return device_; }  // this process's CUDA ordinal
  HandleType handle_type() const { return type_; }
  const std::string& gpu_uuid() const { return uuid_; }

 private:
  friend class Client;
  GpuBuffer() = default;
  unsigned long long handle_ = 0;
  unsigned long long va_ = 0;
  size_t size_ = 0;
  int device_ = 0;
  int ctx_device_ = -1;  // primary context retained for this buffer's lifetime
  HandleType type_ = HandleType::kPosixFd;
  std::string uuid_;
};

// An export obtained from the daemon: its description and the descriptor or
// fabric handle. Map() turns it into usable memory.
class PODLINK_API Imported {
 public:
  ~Imported();
  Imported(Imported&& o) noexcept;
  Imported& operator=(Imported&&) = delete;
  Imported(const Imported&) = delete;
  const ExportInfo& info() const { return info_; }
  int fd() const { return fd_; }  // -1 for fabric handles
  const std::string& gpu_pci_bus_id() const { return gpu_pci_bus_id_; }
  const std::string& gpu_device_node() const { return gpu_device_node_; }
  // Regions of other nodes (Client::OpenRemote): the handle relay requests
  // name instead of an export id; 0 for regions of this node.
  uint64_t remote_handle() const { return remote_handle_; }

 private:
  friend class Client;
  Imported() = default;
  uint64_t remote_handle_ = 0;
  ExportInfo info_;
  int fd_ = -1;
  std::vector<int> chunk_fds_;  // a chunked export: one descriptor per allocation (fd_ is the first)
  std::string fabric_handle_;
  std::string gpu_pci_bus_id_;
  std::string gpu_device_node_;
};

// A peer's memory mapped into this process: host_ptr() for host memory,
// device_ptr() for GPU memory.
class PODLINK_API Mapping {
 public:
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* host_ptr() const { return host_; }
  uint64_t device_ptr() const { return va_; }
  size_t size() const { return size_; }
  int device() const { return device_; }  // ordinal with access, -1 for host
  // Bit d set: CUDA ordinal d of this process may access the mapping (device()
  // always, others where Map was asked for a device and peer access works).
  uint64_t access_devices() const { return access_; }

 private:
  friend class Client;
  Mapping() = default;
  void* host_ = nullptr;
  unsigned long long va_ = 0;
  size_t size_ = 0;
  size_t reserved_ = 0;
  int device_ = -1;
  uint64_t access_ = 0;
  int ctx_device_ = -1;  // primary context retained for this mapping's lifetime
  // GPU memory: the reservation's start (va_ is the export's byte 0 in it)
  // and each allocation mapped there, in order, with its size (one for a
  // plain export, one per cuMem allocation for a chunked one).
  unsigned long long base_ = 0;
  std::vector<std::pair<unsigned long long, uint64_t>> chunks_;
};

struct WatchEvent {
  enum class Type { kReady = 1, kExportGone = 2, kSessionClosed = 3 };
  Type type = Type::kReady;
  uint64_t export_id = 0;
  std::string export_name;
  std::string reason;
};

// A running Watch stream; destroying it stops the stream.
class PODLINK_API Watcher {
 public:
  virtual ~Watcher() = default;
};

struct ConnectOptions {
  // Directory holding podlink.sock and podlink.fd.sock. Empty: $PODLINK_SOCKET_DIR
  // (a directory, or the path of podlink.sock), else /run/podlink.
  std::string socket_dir;
  absl::Duration timeout = absl::Seconds(10);  // per call
};

class PODLINK_API Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& options = {});
  ~Client();  // closes the session: the daemon drops this client's exports

  uint64_t session_id() const;

  absl::StatusOr<NodeInfo> GetNodeInfo();
  absl::StatusOr<Identity> WhoAmI();

  // Host memory (sealed memfd), zero-filled.
  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t size);
  absl::StatusOr<uint64_t> Export(const HostBuffer& buf, const ExportOptions& opts = {});
  // Exports [0, size) of a memfd this process holds, as Export(HostBuffer)
  // does (podlinkd accepts it sealed against shrinking, growing and sealing,
  // and populated); `memfd` stays the caller's.
  absl::StatusOr<uint64_t> ExportHostFd(int memfd, size_t size, const ExportOptions& opts = {});
  // Exports [addr, addr + size) of this process's own memory as it is
  // (malloc, numpy, a pinned tensor): podlinkd reads and writes it in this
  // process's address space through its relay (importers cannot map it).
  // Only the process that connected may export this way (a forked child
  // connects a Client of its own). The range must be memory the process can
  // read and write; it stays the caller's, and must stay mapped while
  // exported (a transfer into an unmapped range fails with an error).
  absl::StatusOr<uint64_t> ExportProcessMemory(const void* addr, size_t size, const ExportOptions& opts = {});

  // GPU memory on `device` (this process's CUDA ordinal), size rounded up to
  // the allocation granularity. `type` kFabric falls back to kPosixFd when the
  // node cannot create fabric handles.
  absl::StatusOr<std::unique_ptr<GpuBuffer>> AllocateGpu(size_t size, int device,
                                                         HandleType type = HandleType::kPosixFd);
  absl::StatusOr<uint64_t> Export(const GpuBuffer& buf, const ExportOptions& opts = {});
  // Exports an allocation this process made itself with cuMemCreate and a
  // POSIX-FD handle type (cuMemRetainAllocationHandle finds it from `ptr`).
  absl::StatusOr<uint64_t> ExportExisting(uint64_t device_ptr, size_t size, const ExportOptions& opts = {});

  absl::StatusOr<Imported> Import(uint64_t export_id);
  absl::StatusOr<Imported> Import(const std::string& name);  // "name" or "namespace/name"
  // A region of a pod on another node, through this node's daemon and the
  // daemons' mesh (the owner's node decides by its own policy). `addresses`
  // and `mesh_port` are the owner daemon's (its NodeInfo, or a descriptor).
  // Moved through the relay ring only; DropImport(remote_handle()) drops it.
  absl::StatusOr<Imported> OpenRemote(const std::string& node_name, const std::vector<std::string>& addresses,
                                      uint32_t mesh_port, uint64_t export_id);

  // Maps an import. GPU memory is mapped with read-write access from
  // `access_device` (this process's ordinal; -1: the GPU holding the memory).
  absl::StatusOr<std::unique_ptr<Mapping>> Map(const Imported& imp, int access_device = -1);

  // Withdraws an own export (importers are told) or drops an import record.
  absl::Status Release(uint64_t export_id);
  // Drops only this session's import record of `export_id`; the export stays,
  // also when this session owns it. NOT_FOUND when there is no such record.
  absl::Status DropImport(uint64_t export_id);
  absl::StatusOr<std::vector<ExportInfo>> List();

  // NCCL native mode (docs/nccl.md), for the NCCL plugin: joins this pod to
  // its peer group's NCCL IPC bridge and /dev/shm when its annotation
  // podlink.io/nccl-native is "true" (joined false, and OK, when the pod did
  // not ask); an error says why a pod that asked cannot join.
  struct NcclNative {
    bool joined = false;
    std::string host_id;  // NCCL_HOSTID for the pod's ranks
    uint32_t members = 0;
    bool shm_mounted = false;
  };
  absl::StatusOr<NcclNative> JoinNcclNative();
  // Mirrors the NCCL IPC sockets this pod has bound now into its group.
  absl::Status SyncNcclIpc();

  // Node-wide views for operators (root on the host, outside containers).
  struct NodeStats {
    uint64_t sessions = 0, exports = 0, imports_total = 0, denials_total = 0;
    uint64_t relay_rings = 0, relay_ops_total = 0, relay_bytes_total = 0, relay_failed_total = 0,
             relay_notifies_total = 0;
  };
  absl::StatusOr<std::vector<ExportInfo>> ListAll();
  absl::StatusOr<NodeStats> GetStats();
  // The daemons' mesh as this node's podlinkd sees it (enabled false: off).
  struct MeshConnection {
    std::string path;  // "local address->remote address"
    bool up = false;
    uint64_t bytes_sent = 0;
  };
  // An address of a node's mesh and the NIC under it (sysfs).
  struct MeshLink {
    std::string address, netdev;
    uint32_t speed_mbps = 0;  // 0: unknown
    std::string pci_path;     // empty for virtual devices
    int numa_node = -1;
    std::string rdma_device;  // empty: no RDMA device holds the address
    int gid_index = -1;
    std::string gid_type;
  };
  struct MeshPeer {
    std::string node;
    std::vector<MeshLink> links;  // as that node's daemon advertised them
    uint32_t connections_up = 0, remote_handles = 0;
    uint64_t bytes_sent = 0, bytes_received = 0, connection_failures = 0, resent_slices = 0;
    std::vector<MeshConnection> connections;  // TCP connections, or RC queue pairs (verbs)
    std::string transport;                     // "tcp" or "verbs"
  };
  struct MeshRoute {
    std::string destination;       // a node whose regions this node's pods hold
    std::vector<std::string> via;  // relays, first hop first; empty: direct
    uint32_t remote_handles = 0;
  };
  struct MeshKnownNode {
    std::string node;
    std::vector<std::string> addresses;
    uint32_t port = 0;
    int64_t advert_age_seconds = -1;  // -1: known from configuration or a hello only
  };
  struct MeshStatus {
    bool enabled = false;
    std::string node_name;
    std::vector<std::string> addresses;
    uint32_t port = 0, data_port = 0;
    std::vector<MeshPeer> peers;
    uint64_t grants = 0, served_write_bytes = 0, served_read_bytes = 0, refused_connections = 0,
             refused_frames = 0, denials = 0;
    std::vector<MeshRoute> routes;
    uint64_t relayed_grants = 0, relay_forwarded_bytes = 0;  // as a relay for other nodes
    std::vector<MeshLink> links;                              // this node's
    std::vector<MeshKnownNode> known_nodes;                   // relay candidates
    // "apiserver": other nodes' pods are confirmed with the API server;
    // "forwarded": believed as their daemons state them.
    std::string remote_pods;
    std::string remote_pods_problem;  // why they are refused now; empty: none
  };
  absl::StatusOr<MeshStatus> GetMeshStatus();

  // Hands podlinkd this session's relay ring and doorbell (see
  // common/relay_ring.h; TransferEngine does this for you).
  // message_slots: 0 for a version 1 ring, else its OUT message slots.
  absl::Status OpenRelayRing(int ring_memfd, int doorbell_eventfd, uint32_t sq_entries, uint32_t cq_entries,
                             uint32_t nq_entries, uint32_t message_slots = 0);

  // Calls `cb` from a private thread for each event of this session.
  absl::StatusOr<std::unique_ptr<Watcher>> Watch(std::function<void(const WatchEvent&)> cb);

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  absl::StatusOr<Imported> DoImport(const v1::ImportRequest& req);
  std::unique_ptr<Impl> impl_;
};

}  // namespace podlink
