#include "client-lib/transports/select.h"

#include <utility>

namespace podlink {

absl::StatusOr<TransportChoice> ChooseTransport(Client& client, const Imported& imported,
                                                const TransferEngine::Options& opt) {
  TransportChoice c;
  if (opt.force_relay) return c;
  if (imported.info().handle_type == HandleType::kHostMemfd) {
    auto m = client.Map(imported);
    if (!m.ok()) return m.status();
    c.mapping = *std::move(m);
    c.transport = Transport::kHostMemcpy;
    return c;
  }
  if (opt.allow_direct) {
    auto m = client.Map(imported, opt.device);
    if (m.ok()) {
      c.mapping = *std::move(m);
      c.transport = Transport::kDirect;
    }
    // Otherwise (typically: the peer GPU's device node is not in this
    // container) the relay moves the bytes.
  }
  return c;
}

}  // namespace podlink
