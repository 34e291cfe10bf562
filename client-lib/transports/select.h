// The one place that picks the transport for a region TransferEngine opens.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

namespace podlink {

struct TransportChoice {
  Transport transport = Transport::kRelay;
  std::unique_ptr<Mapping> mapping;  // for transports that copy through a mapping
};

// force_relay: always the relay. A host (memfd) export: host memcpy through
// a mapping (a failed mapping is an error). GPU memory: direct when
// allow_direct and this process can map the peer's GPU memory on `device`
// (it needs the peer GPU's device node), otherwise the relay.
absl::StatusOr<TransportChoice> ChooseTransport(Client& client, const Imported& imported,
                                                const TransferEngine::Options& opt);

}  // namespace podlink
