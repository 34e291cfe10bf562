// One-sided transfers between pods, shaped after what KV-cache movers (NIXL,
// UCCL P2P, Mooncake) call: register local memory, advertise it as a small
// serializable descriptor, and write/read into a peer's region.
//
//   TransferEngine eng = *TransferEngine::Create(client);
//   LocalRegion kv = *eng.Register(*gpu_buffer);
//   std::string wire = eng.Describe(kv).Serialize();     // ship it through your own channel
//   ...peer...
//   RemoteRegion peer = *eng.Open(*RegionDescriptor::Parse(wire));
//   eng.Write({&kv, 0, &peer, 0, 1 << 20});
//   eng.Notify(peer, /*value=*/42);                      // delivered after the data is visible
//
// The transport is chosen per remote region and logged once: host memcpy for
// host-memory exports, direct (mapped in this process, copied by this
// process's GPU) where the peer's GPU is accessible, otherwise the relay
// (podlinkd copies with the GPUs' copy engines); regions of other nodes go
// through podlinkd and its mesh links to the owner's podlinkd.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "podlink/client.h"

namespace podlink {

struct PODLINK_API RegionDescriptor {
  std::string node_id;
  uint64_t export_id = 0;
  uint64_t size = 0;
  HandleType handle_type = HandleType::kHostMemfd;
  std::string gpu_uuid;
  // How other nodes reach the owner (its daemon's mesh); empty without one.
  std::string node_name;
  uint32_t mesh_port = 0;
  std::vector<std::string> mesh_addresses;  // "addr/prefix"

  // "podlink1;<node>;<id>;<size>;<type>;<uuid>" without a mesh;
  // "podlink2;<node>;<id>;<size>;<type>;<uuid>;<node name>;<mesh port>;<addr>,<addr>..."
  // with one. Text; Parse takes both.
  std::string Serialize() const;
  static absl::StatusOr<RegionDescriptor> Parse(absl::string_view text);
};

// kMesh: a region of another node, moved by the daemons' mesh links (the
// request goes through this process's relay ring to its own podlinkd).
enum class Transport { kHostMemcpy = 1, kDirect = 2, kRelay = 3, kMesh = 4 };
PODLINK_API const char* TransportName(Transport t);

// Memory of this process registered with the engine (exported to podlinkd).
struct LocalRegion {
  uint64_t export_id = 0;
  uint64_t size = 0;
  void* host = nullptr;         // host memory
  uint64_t device_ptr = 0;      // GPU memory
  int device = -1;              // GPU memory: the CUDA ordinal (in this process) that holds it; -1: unknown
};

// A peer's region, opened (imported) by this process.
struct RemoteRegion {
  uint64_t export_id = 0;
  uint64_t size = 0;
  Transport transport = Transport::kRelay;
};

struct TransferOp {
  const LocalRegion* local = nullptr;
  uint64_t local_offset = 0;
  const RemoteRegion* remote = nullptr;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

struct Notification {
  uint64_t export_id = 0;  // which of this process's regions the peer named
  uint64_t value = 0;
  // Notifications with bytes (TransferEngine::kMaxNotifyBytes at most).
  bool has_message = false;
  std::string message;
  // podlinkd's session of the sender on this node (0: a sender on another node).
  uint64_t from_session = 0;
};

class PODLINK_API TransferEngine {
 public:
  struct Options {
    uint32_t ring_entries = 512;  // relay queue depth (power of two)
    bool allow_direct = true;     // map peers' GPU memory when this container can
    int device = 0;               // this process's CUDA ordinal used for direct copies
    absl::Duration timeout = absl::Seconds(30);
    bool log_transport = true;    // one stderr line per transport the first time it is used
    bool force_relay = false;     // always let podlinkd move the bytes (tests, benchmarks)
    // Direct (in-process) copies only up to this many bytes; larger ones go
    // through the relay, which merges contiguous requests into larger copies.
    // 0: no limit.
    uint64_t direct_max_bytes = 0;
  };

  // The client must outlive the engine. A session has one relay ring, so
  // create one engine per Client (a second fails FAILED_PRECONDITION).
  static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(Client& client, Options options);
  static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(Client& client) { return Create(client, Options()); }
  ~TransferEngine();

  absl::StatusOr<LocalRegion> Register(const GpuBuffer& buf, const ExportOptions& opts = {});
  absl::StatusOr<LocalRegion> Register(const HostBuffer& buf, const ExportOptions& opts = {});
  // Exports and registers memory this process allocated itself with
  // cuMemCreate and a POSIX-FD handle type (see Client::ExportExisting).
  absl::StatusOr<LocalRegion> RegisterExisting(uint64_t device_ptr, size_t size, const ExportOptions& opts = {});
  // Host memory this process has, by address. In a shared mapping of a memfd
  // podlinkd accepts (sealed against shrinking, growing and sealing,
  // populated: what Client::AllocateHost makes, whoever mapped it), the memfd
  // is exported up to the range's end, once per call, and peers map it
  // (zero-copy): `offset` is where addr lies in the export. Any other memory
  // the process can read and write (malloc, new, numpy, bytearray, a pinned
  // tensor registered with cudaHostRegister) is exported as process memory
  // (Client::ExportProcessMemory, `offset` 0): podlinkd's relay copies it,
  // one copy more than a mapping, and not to or from GPU memory yet. Unregister
  // the region as any other; keep the range mapped while it is registered.
  struct HostRange {
    LocalRegion region;
    uint64_t offset = 0;
  };
  absl::StatusOr<HostRange> RegisterHost(void* addr, size_t size, const ExportOptions& opts = {});
  // Withdraws the region's export; transfers already submitted complete.
  absl::Status Unregister(const LocalRegion& region);
  absl::StatusOr<RegionDescriptor> Describe(const LocalRegion& region);
  absl::StatusOr<RemoteRegion> Open(const RegionDescriptor& desc);
  // Drops an opened region (its mapping and import record). Transfers to it
  // must be complete.
  absl::Status Close(const RemoteRegion& remote);

  // Blocking: return when every byte is at its destination.
  absl::Status Write(const TransferOp& op);
  absl::Status Read(const TransferOp& op);
  absl::Status Writev(const std::vector<TransferOp>& ops);
  absl::Status Readv(const std::vector<TransferOp>& ops);

  // Non-blocking: returns a batch id for Poll / Wait.
  absl::StatusOr<uint64_t> WriteAsync(const std::vector<TransferOp>& ops);
  absl::StatusOr<uint64_t> ReadAsync(const std::vector<TransferOp>& ops);
  // true once the batch is complete (its status is then returned by Wait).
  absl::StatusOr<bool> Poll(uint64_t batch);
  absl::Status Wait(uint64_t batch);

  // Tells the owner of `remote` `value` once every earlier transfer of this
  // engine is visible at its destination.
  absl::Status Notify(const RemoteRegion& remote, uint64_t value);
  // The same with bytes (at most kMaxNotifyBytes): the owner's notification
  // carries `value` and `message`. Regions of this node only for now (another
  // node's: UNIMPLEMENTED). FAILED_PRECONDITION when the owner's libpodlink
  // predates notifications with bytes.
  static constexpr size_t kMaxNotifyBytes = 4096;
  absl::Status Notify(const RemoteRegion& remote, uint64_t value, absl::string_view message);
  // Non-blocking: the notification (with `message` when given) leaves once
  // every earlier transfer of this engine is visible; the returned batch
  // completes (Poll / Wait) once it was delivered.
  absl::StatusOr<uint64_t> NotifyAsync(const RemoteRegion& remote, uint64_t value,
                                       std::optional<absl::string_view> message = std::nullopt);
  // Notifications peers sent to this process's regions (relay ring only).
  std::vector<Notification> PollNotifications();

  class Impl;

 private:
  explicit TransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace podlink
