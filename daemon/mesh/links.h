// The data path to one peer daemon, whatever carries it: TCP connections
// (tcp_link.h) or RDMA queue pairs (verbs/verbs_link.h). The engine hands a
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
#include "daemon/mesh/nic_rank.h"
#include "daemon/mesh/wire.h"

namespace podlink::mesh {

struct LinkOp {
  FrameType type = FrameType::kWrite;  // kWrite, kRead or kNotify
  uint64_t grant = 0;
  uint64_t offset = 0;                 // remote offset (kNotify: the value)
  uint64_t length = 0;
  char* local = nullptr;               // source (kWrite) or destination (kRead)
  std::shared_ptr<const void> keep;    // keeps `local` mapped until done
  std::function<void(const absl::Status&)> done;
  // Which paths to use (nic_rank.h: MayUse); nullptr: any.
  std::shared_ptr<const PathPreference> prefer;
};

struct LinkStats {
  uint64_t connections_up = 0, bytes_sent = 0, bytes_received = 0, slices = 0, connection_failures = 0;
  uint64_t resent_slices = 0;
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
};

}  // namespace podlink::mesh
