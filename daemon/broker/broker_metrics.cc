// The broker's counters and its metric families (sessions, exports, imports,
// denials, its pod source, the NCCL IPC bridge); daemon/main.cc joins them
// with the other components' on the metrics page.
#include "daemon/broker/broker.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>
#include <openssl/sha.h>

#include <cerrno>
#include <fstream>

#include "absl/strings/string_view.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/fd_channel.h"
#include "common/pci.h"
#include "common/status_util.h"
#include "daemon/gpu/host_backend.h"
#include "daemon/identity/standalone_source.h"
#include "daemon/ncclipc/shm_mount.h"
#include "daemon/policy/policy.h"
#include "common/log.h"

namespace podlink {

std::string Broker::RenderMetrics() const {
  BrokerStats st = Stats();
  std::string out;
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    RenderFamily(&out, name, type, help, {{"", v}});
  };
  one("podlink_ready", "gauge", "1 once both sockets serve", ready() ? 1 : 0);
  one("podlink_gpus", "gauge", "GPUs podlinkd sees", static_cast<double>(inventory_.gpus.size()));
  one("podlink_sessions", "gauge", "open client sessions", static_cast<double>(st.sessions));
  one("podlink_sessions_total", "counter", "client sessions opened",
      static_cast<double>(sessions_total_.load(std::memory_order_relaxed)));
  one("podlink_exports", "gauge", "live exports", static_cast<double>(st.exports));
  one("podlink_exports_total", "counter", "exports created",
      static_cast<double>(exports_total_.load(std::memory_order_relaxed)));
  one("podlink_imports_total", "counter", "imports granted", static_cast<double>(st.imports_total));
  std::map<std::string, double> denials;
  for (const char* reason : kDenialReasons) denials[reason] = 0;  // every series exists from the start
  for (const auto& [reason, n] : denials_.Snapshot()) denials[reason] = static_cast<double>(n);
  RenderFamily(&out, "podlink_denials_total", "counter", "imports refused, by reason", denials, "reason");
  absl::StrAppend(&out, pods_->RenderMetrics());
  {
    absl::MutexLock l(&nccl_mu_);
    if (nccl_bridge_ != nullptr) absl::StrAppend(&out, nccl_bridge_->RenderMetrics());
  }
  return out;
}

BrokerStats Broker::Stats() const {
  BrokerStats st;
  {
    absl::MutexLock l(&mu_);
    st.sessions = sessions_.size();
  }
  st.exports = registry_.size();
  st.imports_total = imports_total_.load(std::memory_order_relaxed);
  st.denials_total = denials_total_.load(std::memory_order_relaxed);
  return st;
}

}  // namespace podlink
