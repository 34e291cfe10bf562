// The one place that knows every transport of TransferEngine: it makes their
// backends, picks the transport of each region the engine opens, and says
// which backend serves a transport. Adding a transport: its backend, a
// podlink::Transport value, and this file.
#pragma once

#include <array>
#include <memory>

#include "absl/status/statusor.h"
#include "client-lib/transports/backend.h"
#include "client-lib/transports/mapped_backend.h"
#include "client-lib/transports/relay_backend.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

namespace podlink {

// The GPU that runs an in-process copy between a local region and a peer's
// region mapped into this process (Transport::kDirect), or -1 when this
// process cannot make it (podlinkd's relay moves it then). The GPU that holds
// the local memory does it, if the mapping grants it access (its copy engine
// then reaches the peer's memory over NVLink); local host memory uses the
// mapping's own GPU. The GPU's CUDA ordinal is what matters, whatever its
// position in this process's device list: a pod whose own GPU is ordinal 1
// (the peer's device node sorts first) copies on 1 (docs/nccl.md).
//   local_device: the local region's ordinal (-1: unknown); local_is_host: host memory
//   mapping_device, mapping_access: Mapping::device() and access_devices()
int DirectCopyDevice(int local_device, bool local_is_host, int mapping_device, uint64_t mapping_access);

// The GPU of a copy between local GPU memory and a peer's host (memfd)
// mapping: the local memory's (host memory is reachable from every GPU), or
// `fallback` (the engine's Options::device) when unknown.
int HostMappingCopyDevice(int local_device, bool local_is_host, int fallback);

struct TransportChoice {
  Transport transport = Transport::kRelay;
  std::unique_ptr<Mapping> mapping;  // for transports that copy through a mapping
};

class Transports {
 public:
  // Opens the session's relay ring (a session has one).
  static absl::StatusOr<std::unique_ptr<Transports>> Create(Client& client, const TransferEngine::Options& opt);

  // The transport of a region being opened. force_relay: always the relay.
  // A host (memfd) export: host memcpy through a mapping (a failed mapping is
  // an error). GPU memory: direct when allow_direct and this process can map
  // the peer's memory on opt.device (it needs the peer GPU's device node),
  // otherwise the relay.
  absl::StatusOr<TransportChoice> Choose(Client& client, const Imported& imported) const;

  // The backend that serves `t`.
  TransportBackend* For(Transport t);
  // Every backend, for fences.
  std::array<TransportBackend*, 3> All() { return {&host_, &direct_, relay_.get()}; }
  RelayBackend& relay() { return *relay_; }

 private:
  explicit Transports(const TransferEngine::Options& opt);

  const TransferEngine::Options opt_;
  std::unique_ptr<RelayBackend> relay_;
  InProcessStreams in_process_;  // shared by host_ and direct_ (declared first: outlives them)
  MappedBackend host_;
  MappedBackend direct_;
};

}  // namespace podlink
