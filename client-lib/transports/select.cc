#include "client-lib/transports/select.h"

#include <optional>
#include <utility>

#include "common/status_util.h"

namespace podlink {

int DirectCopyDevice(int local_device, bool local_is_host, int mapping_device, uint64_t mapping_access) {
  if (local_is_host) return mapping_device;
  if (local_device < 0 || local_device >= 64) return -1;
  return (mapping_access >> local_device) & 1 ? local_device : -1;
}

int HostMappingCopyDevice(int local_device, bool local_is_host, int fallback) {
  return !local_is_host && local_device >= 0 ? local_device : fallback;
}

Transports::Transports(const TransferEngine::Options& opt)
    : opt_(opt),
      host_(Transport::kHostMemcpy, in_process_),
      direct_(Transport::kDirect, in_process_) {}

absl::StatusOr<std::unique_ptr<Transports>> Transports::Create(Client& client, const TransferEngine::Options& opt) {
  std::unique_ptr<Transports> t(new Transports(opt));
  PODLINK_ASSIGN_OR_RETURN(t->relay_, RelayBackend::Create(client, opt.ring_entries, opt.timeout));
  return t;
}

absl::StatusOr<TransportChoice> Transports::Choose(Client& client, const Imported& imported) const {
  TransportChoice c;
  if (opt_.force_relay) return c;
  if (imported.info().handle_type == HandleType::kHostMemfd) {
    auto m = client.Map(imported);
    if (!m.ok()) return m.status();
    c.mapping = *std::move(m);
    c.transport = Transport::kHostMemcpy;
    return c;
  }
  if (imported.info().handle_type == HandleType::kProcessMemory) return c;  // no one maps it: the relay
  if (opt_.allow_direct) {
    // Map makes a GPU's primary context current: put the caller's back (the
    // engine's user, e.g. NCCL's proxy thread, keeps its device).
    auto d = cu::LoadDriver();
    cu::Context caller = nullptr;
    if (d.ok() && (*d)->CtxGetCurrent(&caller) != cu::kSuccess) caller = nullptr;
    std::optional<cu::ScopedContext> keep;
    if (d.ok()) keep.emplace(**d, caller);
    auto m = client.Map(imported, opt_.device);
    if (m.ok()) {
      c.mapping = *std::move(m);
      c.transport = Transport::kDirect;
    }
    // Otherwise (typically: the peer GPU's device node is not in this
    // container) the relay moves the bytes.
  }
  return c;
}

TransportBackend* Transports::For(Transport t) {
  switch (t) {
    case Transport::kHostMemcpy:
      return &host_;
    case Transport::kDirect:
      return &direct_;
    case Transport::kRelay:
    case Transport::kMesh:  // through the ring too: podlinkd hands these to its mesh links
      break;
  }
  return relay_.get();
}

}  // namespace podlink
