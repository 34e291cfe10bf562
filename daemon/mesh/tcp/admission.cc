#include "daemon/mesh/tcp/admission.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/links/random.h"
#include "daemon/mesh/links/wire.h"

namespace podlink::mesh {
namespace {

const ComponentLog AdmissionLog("mesh");

std::string RandomCookie() {
  std::string c(kCookieBytes, '\0');
  for (size_t i = 0; i < kCookieBytes; i += 8) {
    const uint64_t v = RandomU64();
    std::memcpy(c.data() + i, &v, std::min<size_t>(8, kCookieBytes - i));
  }
  return c;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> DataAdmission::IssueCookies(const std::string& node, uint32_t n,
                                                                     const std::string& source,
                                                                     const std::vector<std::string>& sources) {
  if (n == 0 || n > 64) return absl::InvalidArgumentError("OpenLink: 1 to 64 connections");
  if (sources.size() > kMaxClaimedSources) {
    return absl::InvalidArgumentError(absl::StrCat("OpenLink: at most ", kMaxClaimedSources, " source addresses"));
  }
  std::vector<std::string> claimed;
  for (const std::string& s : sources) {
    // A whole address ("10.0.1.2", "fd00::1"), written as the data port's
    // accept writes a connection's source.
    absl::StatusOr<IpPrefix> a = IpPrefix::Parse(s);
    if (!a.ok() || s.find('/') != std::string::npos) {
      return absl::InvalidArgumentError("OpenLink: a source is not an IP address");
    }
    std::string text = a->AddressText();
    if (std::find(claimed.begin(), claimed.end(), text) == claimed.end()) claimed.push_back(std::move(text));
  }
  const absl::Time now = absl::Now();
  absl::MutexLock l(&mu_);
  RememberSource(source);
  size_t mine = 0;
  for (auto it = cookies_.begin(); it != cookies_.end();) {
    if (it->second.expires < now) {
      it = cookies_.erase(it);
      continue;
    }
    mine += it->second.node == node;
    ++it;
  }
  if (mine + n > kMaxCookiesPerNode) {
    return absl::ResourceExhaustedError(absl::StrCat("node ", node, " holds ", mine, " unused link cookies"));
  }
  // The addresses its paths connect from, once the call is taken: they replace the node's earlier ones.
  std::vector<std::string>& mine_before = sources_of_node_[node];
  for (const std::string& s : mine_before) {
    if (auto it = claimed_sources_.find(s); it != claimed_sources_.end() && --it->second == 0) {
      claimed_sources_.erase(it);
    }
  }
  for (const std::string& s : claimed) ++claimed_sources_[s];
  mine_before = std::move(claimed);
  std::vector<std::string> out;
  for (uint32_t i = 0; i < n; ++i) {
    std::string c = RandomCookie();
    cookies_[c] = Cookie{node, now + kCookieLifetime};
    out.push_back(std::move(c));
  }
  return out;
}

void DataAdmission::RememberSource(const std::string& address) {
  if (address.empty()) return;
  known_sources_[address] = absl::Now();
  if (known_sources_.size() <= kMaxKnownSources) return;
  auto oldest = known_sources_.begin();
  for (auto it = known_sources_.begin(); it != known_sources_.end(); ++it) {
    if (it->second < oldest->second) oldest = it;
  }
  known_sources_.erase(oldest);
}

std::optional<DataAdmission::Pending> DataAdmission::Admit(int fd, const std::string& source) {
  absl::MutexLock l(&mu_);
  // Before AUTH, a connection takes one of a few slots: per source address,
  // and strangers' (addresses no peer has used) only half of them, so a
  // flood cannot take the slots of peers. Authenticated connections are
  // counted per peer (Authenticate). The thread bound: both together.
  const bool stranger = !known_sources_.contains(source) && !claimed_sources_.contains(source);
  auto of = unauthenticated_of_.find(source);
  const size_t from_source = of == unauthenticated_of_.end() ? 0 : of->second;
  if (serving_ >= limits_.max_connections + kMaxUnauthenticated || unauthenticated_ >= kMaxUnauthenticated ||
      from_source >= kMaxUnauthenticatedPerSource || (stranger && unauthenticated_strangers_ >= kStrangerShare)) {
    ++refused_;
    return std::nullopt;
  }
  ++serving_;
  ++unauthenticated_;
  ++unauthenticated_of_[source];
  if (stranger) ++unauthenticated_strangers_;
  serving_fds_.insert(fd);
  return Pending{source, stranger};
}

absl::StatusOr<std::string> DataAdmission::Authenticate(const Pending& p, const std::string* cookie) {
  absl::MutexLock l(&mu_);
  --unauthenticated_;
  if (p.stranger) --unauthenticated_strangers_;
  if (auto of = unauthenticated_of_.find(p.source); of != unauthenticated_of_.end() && --of->second == 0) {
    unauthenticated_of_.erase(of);
  }
  auto it = cookie != nullptr ? cookies_.find(*cookie) : cookies_.end();
  if (it == cookies_.end() || it->second.expires < absl::Now()) {
    ++refused_;
    if (cookie != nullptr) AdmissionLog()->warn("event=mesh_data_refused reason=\"unknown or expired cookie\" source={}", p.source);
    return absl::PermissionDeniedError("unknown or expired cookie");
  }
  std::string node = it->second.node;
  cookies_.erase(it);
  // Every peer may hold its share, whatever the others hold: the total
  // bound turns away only peers past kGuaranteedConnections.
  auto c = conns_of_.find(node);
  const uint32_t mine = c == conns_of_.end() ? 0 : c->second;
  const char* over = mine >= limits_.max_per_peer ? "the peer's own share"
                     : authenticated_ >= limits_.max_connections && mine >= kGuaranteedConnections
                         ? "all peers' connections"
                         : nullptr;
  if (over != nullptr) {
    ++refused_;
    AdmissionLog()->warn("event=mesh_data_refused peer={} reason=\"over {}\" held={}", node, over, mine);
    return absl::ResourceExhaustedError(absl::StrCat("over ", over));
  }
  RememberSource(p.source);
  ++conns_of_[node];
  ++authenticated_;
  return node;
}

void DataAdmission::Disconnected(const std::string& node) {
  absl::MutexLock l(&mu_);
  --authenticated_;
  if (auto c = conns_of_.find(node); c != conns_of_.end() && --c->second == 0) conns_of_.erase(c);
}

void DataAdmission::Closed(int fd, const std::function<void()>& close) {
  absl::MutexLock l(&mu_);
  serving_fds_.erase(fd);
  close();
  --serving_;
}

void DataAdmission::ShutdownAndWait() {
  absl::MutexLock l(&mu_);
  for (int fd : serving_fds_) ::shutdown(fd, SHUT_RDWR);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return serving_ == 0; };
  mu_.Await(absl::Condition(&done));
}

bool DataAdmission::Connected(const std::string& node) const {
  absl::MutexLock l(&mu_);
  return conns_of_.contains(node);
}

DataAdmission::Counts DataAdmission::counts() const {
  absl::MutexLock l(&mu_);
  return Counts{refused_, authenticated_, unauthenticated_, serving_};
}

}  // namespace podlink::mesh
