// The data path to one peer daemon, whatever carries it: TCP connections
// (tcp/tcp_link.h) or RDMA queue pairs (verbs/verbs_link.h). The engine hands a
// link set whole operations on a granted region of the peer; the link set
// cuts, stripes, retries and reports each operation once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "daemon/mesh/links/nic_rank.h"
#include "daemon/mesh/links/wire.h"

namespace podlink {
class MemoryObject;
}

namespace podlink::mesh {

struct LinkOp {
  FrameType type = FrameType::kWrite;  // kWrite, kRead or kNotify
  uint64_t grant = 0;
  uint64_t offset = 0;                 // remote offset (kNotify: the value)
  uint64_t length = 0;
  char* local = nullptr;               // source (kWrite) or destination (kRead)
  std::shared_ptr<const void> keep;    // keeps `local` mapped until done
  // The whole local memory `local` lies in, when this daemon may register it
  // for RDMA (a host export's mapping): the verbs links then send from and
  // read into it directly instead of copying through their staging. Null:
  // `local` is a staging buffer (GPU memory), always copied.
  std::shared_ptr<MemoryObject> local_memory;
  char* local_base = nullptr;
  uint64_t local_size = 0;
  // `local` lies in the transferring pod's own host export (mapped until
  // `done`): TCP may send from it without a copy (MSG_ZEROCOPY). The kernel
  // may read those pages until it is done with them — after the transfer
  // failed, too — so never set for staging buffers (reused for others' bytes)
  // nor for another pod's export the session imported.
  bool local_is_export = false;
  std::function<void(const absl::Status&)> done;
  // Which paths to use (nic_rank.h: MayUse); nullptr: any.
  std::shared_ptr<const PathPreference> prefer;
};

// An export the owner registered for one peer on one of its devices (RDMA:
// the key and the remote address of the export's first byte).
struct RegionKey {
  std::string device;
  uint32_t rkey = 0;
  uint64_t base = 0;  // remote address of the export's first byte
};

struct LinkStats {
  uint64_t connections_up = 0, bytes_sent = 0, bytes_received = 0, slices = 0, connection_failures = 0;
  uint64_t resent_slices = 0;
  uint64_t zero_copy_slices = 0;     // verbs: slices sent from / read into the local export itself
  uint64_t local_registrations = 0;  // verbs: local exports registered for that (now)
  // TCP, MSG_ZEROCOPY (wire.h ZeroCopySends): payload bytes handed to the
  // kernel without a copy, sends it reported done, of those the ones it copied
  // after all, sends copied because it refused to pin.
  uint64_t tcp_zero_copy_bytes = 0, tcp_zero_copy_completed = 0, tcp_zero_copy_copied = 0,
           tcp_zero_copy_fell_back = 0;
};

class DataLinks {
 public:
  virtual ~DataLinks() = default;
  // "tcp" or "verbs".
  virtual const char* transport() const = 0;
  // Random per link set; the peer tells senders apart by it.
  virtual uint64_t instance() const = 0;
  // Queues `op`; on error `done` is never called (UNAVAILABLE: nothing is up).
  virtual absl::Status Submit(LinkOp op) = 0;
  // Connections (TCP) or queue pairs (verbs) that are up.
  virtual size_t live() const = 0;
  virtual LinkStats Stats() const = 0;
  // Per connection or queue pair: path, up, bytes sent.
  virtual std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const = 0;
  // Drops what the link set holds for local memory nobody else holds any
  // more (verbs: registrations of exports that went away); the engine's
  // housekeeping calls it every 200 ms.
  virtual void Sweep() {}
  // Whether the owner registers a region for this link set when it grants it
  // (verbs: RDMA keys, or staging through its bounce pool): an open then asks
  // for that (OpenRegionRequest.verbs, accepts_staged) and the grant is
  // carried by AddRegion or AddStagedRegion. Otherwise a grant needs nothing.
  virtual bool RegistersRegions() const { return false; }
  // The owner's keys for `grant` (RegistersRegions only).
  virtual void AddRegion(uint64_t /*grant*/, std::vector<RegionKey> /*keys*/) {}
  // A grant the owner stages through its bounce pool, in slices of at most
  // `slot_bytes` (0: this side's slice size) (RegistersRegions only).
  virtual void AddStagedRegion(uint64_t /*grant*/, uint64_t /*slot_bytes*/ = 0) {}
  // Forgets what it holds for a grant of the peer that was given back (verbs:
  // the region's keys or staging); nothing where a grant needs nothing.
  virtual void DropRegion(uint64_t /*grant*/) {}
  // Whether one repair of a path replaces everything of it that failed by
  // then (verbs: every queue pair of the path), so one scheduled repair per
  // path is enough; otherwise each repair brings back one connection.
  virtual bool RepairsWholePath() const { return false; }
};

}  // namespace podlink::mesh
