// Who may hold a data connection to this node (the TCP data server's gate):
// one-use cookies from OpenLink, the slots a connection takes before its
// AUTH (per source address, strangers only half of them), the connections
// each peer holds after it, and the sockets being served, so that stopping
// can shut them all. Every count is bounded; every input is a peer's or a
// stranger's. Its own lock, a leaf: nothing is called out of it while it is
// held but `close` in Closed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace podlink::mesh {

class DataAdmission {
 public:
  // Connections before AUTH: at most kMaxUnauthenticated in all, at most
  // kMaxUnauthenticatedPerSource from one address, and addresses that have
  // not been a peer's (kStrangerShare) together at most half: a flood from
  // strangers leaves room for the peers that called OpenLink or
  // authenticated before.
  static constexpr size_t kMaxUnauthenticated = 64;
  static constexpr size_t kMaxUnauthenticatedPerSource = 8;
  static constexpr size_t kStrangerShare = kMaxUnauthenticated / 2;
  static constexpr size_t kMaxKnownSources = 4096;
  static constexpr size_t kMaxClaimedSources = 16;
  static constexpr size_t kMaxCookiesPerNode = 256;
  // A peer holding fewer is admitted even when all connections are taken.
  static constexpr uint32_t kGuaranteedConnections = 16;
  static constexpr absl::Duration kCookieLifetime = absl::Seconds(10);

  struct Limits {
    uint32_t max_connections = 256;  // authenticated, all peers together
    uint32_t max_per_peer = 64;
  };
  explicit DataAdmission(Limits limits) : limits_(limits) {}

  // OpenLink: `n` cookies for `node`. `source`: the caller's address, whose
  // data connections then count as a peer's before their AUTH. `sources`:
  // the addresses the caller says its data connections come from (whole
  // addresses, at most kMaxClaimedSources); they count so too while it says
  // so, replacing what its last OpenLink said.
  absl::StatusOr<std::vector<std::string>> IssueCookies(const std::string& node, uint32_t n, const std::string& source,
                                                        const std::vector<std::string>& sources)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A connection just accepted from `source`: it takes a slot before AUTH,
  // or is refused (counted; the caller closes it) when the slots are taken.
  struct Pending {
    std::string source;
    bool stranger = false;  // from an address no peer has used
  };
  std::optional<Pending> Admit(int fd, const std::string& source) ABSL_LOCKS_EXCLUDED(mu_);
  // Its AUTH was read (`cookie`: null when none came whole in time): gives
  // back its slot; the node its cookie was issued to, whose connection it
  // is now, or why not (counted).
  absl::StatusOr<std::string> Authenticate(const Pending& p, const std::string* cookie) ABSL_LOCKS_EXCLUDED(mu_);
  // An authenticated connection of `node` ended.
  void Disconnected(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // A served socket is forgotten and closed (`close`) under one lock: its
  // number cannot be reused by a new connection while it is still listed.
  void Closed(int fd, const std::function<void()>& close) ABSL_LOCKS_EXCLUDED(mu_);
  // Shuts every served socket down and waits for their threads (Closed).
  void ShutdownAndWait() ABSL_LOCKS_EXCLUDED(mu_);

  bool Connected(const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);
  struct Counts {
    uint64_t refused = 0;  // connections refused: no valid cookie, or over a bound
    size_t authenticated = 0, unauthenticated = 0, serving = 0;
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void RememberSource(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  mutable absl::Mutex mu_;
  struct Cookie {
    std::string node;
    absl::Time expires;
  };
  std::map<std::string, Cookie> cookies_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> known_sources_ ABSL_GUARDED_BY(mu_);  // peers' addresses, last seen
  // What each peer's last OpenLink named as its data connections' sources,
  // and how many peers name each address (kept apart from known_sources_: a
  // peer's claims cannot push other peers' addresses out of that table).
  std::map<std::string, std::vector<std::string>> sources_of_node_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> claimed_sources_ ABSL_GUARDED_BY(mu_);
  size_t unauthenticated_ ABSL_GUARDED_BY(mu_) = 0;
  size_t unauthenticated_strangers_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, size_t> unauthenticated_of_ ABSL_GUARDED_BY(mu_);  // by source address
  size_t authenticated_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint32_t> conns_of_ ABSL_GUARDED_BY(mu_);  // authenticated, by node
  std::set<int> serving_fds_ ABSL_GUARDED_BY(mu_);
  size_t serving_ ABSL_GUARDED_BY(mu_) = 0;  // their threads still running
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace podlink::mesh
