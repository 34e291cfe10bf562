#include "daemon/broker/grpc_listener.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "daemon/identity/peer_identity.h"
#include "daemon/identity/standalone_source.h"
#include "daemon/metrics/metrics.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"
#include "common/log.h"

namespace podlink {
namespace {

constexpr uint64_t kListenKey = 0;
constexpr uint64_t kWakeKey = 1;
constexpr int kAcceptsPerWake = 64;

const ComponentLog ListenerLog("grpc");

int64_t MonotonicSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcListener>> GrpcListener::Start(grpc::Server* server, const std::string& path,
                                                                  const GrpcListenerOptions& options) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  UniqueFd ls(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!ls) return ErrnoStatus(errno, "socket(AF_UNIX, SOCK_STREAM)");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ::unlink(path.c_str());
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind ", path));
  }
  ::chmod(path.c_str(), 0666);  // authorization is by kernel identity and session token
  if (::listen(ls.get(), 128) != 0) return ErrnoStatus(errno, "listen");
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep) return ErrnoStatus(errno, "epoll_create1");
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoStatus(errno, "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenKey;
  if (::epoll_ctl(ep.get(), EPOLL_CTL_ADD, ls.get(), &ev) != 0) return ErrnoStatus(errno, "epoll_ctl");
  ev.data.u64 = kWakeKey;
  if (::epoll_ctl(ep.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0) return ErrnoStatus(errno, "epoll_ctl");
  std::unique_ptr<GrpcListener> l(
      new GrpcListener(server, std::move(ls), std::move(ep), std::move(wake), path, options));
  l->thread_ = std::thread([p = l.get()] { p->Run(); });
  return l;
}

GrpcListener::GrpcListener(grpc::Server* server, UniqueFd listen, UniqueFd epoll, UniqueFd wake, std::string path,
                           GrpcListenerOptions options)
    : server_(server),
      listen_(std::move(listen)),
      epoll_(std::move(epoll)),
      wake_(std::move(wake)),
      path_(std::move(path)),
      options_(std::move(options)) {}

GrpcListener::~GrpcListener() { Stop(); }

void GrpcListener::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  thread_.join();
  listen_.Reset();
  ::unlink(path_.c_str());
}

void GrpcListener::Run() {
  epoll_event events[64];
  for (;;) {
    int n = ::epoll_wait(epoll_.get(), events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      ListenerLog()->error("event=epoll_failed error={}", LogQuoted(std::strerror(errno)));
      return;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64;
      if (key == kWakeKey) return;
      if (key == kListenKey) {
        Accept();
      } else {
        Closed(key);
      }
    }
  }
}

void GrpcListener::Accept() {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!c) {
      if (errno != EAGAIN && errno != EINTR) {
        ListenerLog()->warn("event=accept_failed error={}", LogQuoted(std::strerror(errno)));
      }
      return;
    }
    std::string refusal;
    std::string key;
    absl::StatusOr<PeerIdentity> peer = IdentifyPeer(c.get(), options_.cgroup_layout);
    if (!peer.ok()) {
      refusal = std::string(peer.status().message());
    } else {
      key = IdentityKey(*peer);
      auto it = per_key_.find(key);
      size_t mine = it == per_key_.end() ? 0 : it->second;
      if (conns_.size() >= options_.max_connections) {
        refusal = absl::StrCat("podlinkd holds ", conns_.size(), " gRPC connections, its limit");
      } else if (mine >= options_.max_connections_per_pod) {
        refusal = absl::StrCat(key, " holds ", mine, " gRPC connections, the per-pod limit");
      }
    }
    UniqueFd watch;
    if (refusal.empty()) {
      watch.Reset(::fcntl(c.get(), F_DUPFD_CLOEXEC, 0));
      if (!watch) refusal = absl::StrCat("dup: ", std::strerror(errno));
    }
    uint64_t id = next_id_;
    if (refusal.empty()) {
      epoll_event ev{};
      ev.events = EPOLLRDHUP;  // plus EPOLLHUP and EPOLLERR, always reported
      ev.data.u64 = id;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, watch.get(), &ev) != 0) {
        refusal = absl::StrCat("epoll_ctl: ", std::strerror(errno));
      }
    }
    if (!refusal.empty()) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      // One line per second at most: a flood of refusals must not flood the log.
      if (int64_t now = MonotonicSeconds(); now != last_refusal_log_) {
        last_refusal_log_ = now;
        ListenerLog()->warn("event=grpc_connection_refused refused_total={} reason={}", refused(), LogQuoted(refusal));
      }
      continue;  // `c` closes
    }
    ++next_id_;
    ++per_key_[key];
    conns_.emplace(id, Conn{std::move(watch), std::move(key)});
    open_.store(conns_.size(), std::memory_order_relaxed);
    grpc::AddInsecureChannelFromFd(server_, c.Release());  // gRPC owns the socket now
  }
}

void GrpcListener::Closed(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.watch.get(), nullptr);
  auto k = per_key_.find(it->second.key);
  if (k != per_key_.end() && --k->second == 0) per_key_.erase(k);
  conns_.erase(it);
  open_.store(conns_.size(), std::memory_order_relaxed);
}

std::string GrpcListener::RenderMetrics() const {
  std::string out;
  RenderFamily(&out, "podlink_grpc_connections", "gauge", "open connections to the gRPC socket",
               {{"", static_cast<double>(connections())}});
  RenderFamily(&out, "podlink_grpc_connections_refused_total", "counter",
               "gRPC connections closed at once (limits, unidentifiable peers)",
               {{"", static_cast<double>(refused())}});
  return out;
}

}  // namespace podlink
