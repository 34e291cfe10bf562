#include "daemon/broker/fd_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/status_util.h"
#include "common/log.h"

namespace podlink {
namespace {

constexpr uint64_t kListenKey = 0;
constexpr uint64_t kWakeKey = ~uint64_t{0};
constexpr int kMessagesPerWake = 32;

std::shared_ptr<spdlog::logger> Log() {
  static auto l = spdlog::get("fdchan");
  return l ? l : spdlog::default_logger();
}

}  // namespace

absl::StatusOr<std::unique_ptr<FdServer>> FdServer::Start(Broker* broker, const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  UniqueFd ls(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!ls) return ErrnoStatus(errno, "socket(AF_UNIX, SOCK_SEQPACKET)");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind ", path));
  }
  ::chmod(path.c_str(), 0666);
  if (::listen(ls.get(), 128) != 0) return ErrnoStatus(errno, "listen");
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep) return ErrnoStatus(errno, "epoll_create1");
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoStatus(errno, "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenKey;
  ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, ls.get(), &ev);
  ev.data.u64 = kWakeKey;
  ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, wake.get(), &ev);
  std::unique_ptr<FdServer> srv(
      new FdServer(broker, std::move(ls), std::move(ep), std::move(wake), path));
  srv->thread_ = std::thread([s = srv.get()] { s->Run(); });
  return srv;
}

FdServer::FdServer(Broker* broker, UniqueFd listen, UniqueFd epoll, UniqueFd wake, std::string path)
    : broker_(broker),
      listen_(std::move(listen)),
      epoll_(std::move(epoll)),
      wake_(std::move(wake)),
      path_(std::move(path)) {}

FdServer::~FdServer() { Stop(); }

void FdServer::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  thread_.join();
  for (auto& [id, s] : sessions_) broker_->CloseSession(id, "daemon stopping");
  sessions_.clear();
  ::unlink(path_.c_str());
}

void FdServer::Run() {
  epoll_event events[64];
  auto last_expiry = std::chrono::steady_clock::now();
  for (;;) {
    int n = ::epoll_wait(epoll_.get(), events, 64, 1000);
    if (auto now = std::chrono::steady_clock::now(); now - last_expiry >= std::chrono::seconds(1)) {
      broker_->ExpireOffers();  // unused offers do not stay open forever
      last_expiry = now;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      Log()->error("event=epoll_failed error={}", LogQuoted(std::strerror(errno)));
      return;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64;
      if (key == kWakeKey) return;
      if (key == kListenKey) {
        Accept();
      } else {
        Drain(key);
      }
    }
  }
}

void FdServer::Accept() {
  for (int i = 0; i < kMessagesPerWake; ++i) {
    int c = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno != EAGAIN && errno != EINTR) {
        Log()->warn("event=accept_failed error={}", LogQuoted(std::strerror(errno)));
      }
      return;
    }
    absl::StatusOr<std::shared_ptr<Session>> s = broker_->OpenSession(UniqueFd(c));
    if (!s.ok()) {
      Log()->warn("event=session_refused reason={}", LogQuoted(s.status().ToString()));
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = (*s)->id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, (*s)->sock.get(), &ev) != 0) {
      broker_->CloseSession((*s)->id, "epoll registration failed");
      continue;
    }
    sessions_[(*s)->id] = *s;
  }
}

void FdServer::Drain(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  std::shared_ptr<Session> s = it->second;
  auto close = [&](const std::string& why) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, s->sock.get(), nullptr);
    sessions_.erase(session_id);
    broker_->CloseSession(session_id, why);
  };
  for (int i = 0; i < kMessagesPerWake; ++i) {
    absl::StatusOr<std::optional<ReceivedMessage>> got = RecvFdMessage(s->sock.get(), /*dontwait=*/true);
    if (got.ok() && !got->has_value()) return;  // drained
    absl::StatusOr<ReceivedMessage> m =
        got.ok() ? absl::StatusOr<ReceivedMessage>(std::move(**got)) : got.status();
    if (!m.ok()) {
      if (absl::IsNotFound(m.status())) return close("client closed its descriptor channel");
      if (absl::IsUnavailable(m.status())) return close(std::string(m.status().message()));
      Log()->warn("event=protocol_violation session={} error={}", session_id, LogQuoted(m.status().message()));
      return close(absl::StrCat("protocol violation: ", m.status().message()));
    }
    if (m->msg.type != static_cast<uint16_t>(FdMsgType::kOffer)) {
      Log()->warn("event=protocol_violation session={} type={}", session_id, m->msg.type);
      return close(absl::StrCat("protocol violation: unexpected message type ", m->msg.type));
    }
    broker_->OnOffer(*s, m->msg.seq, std::move(m->fd));
  }
  // Budget used up: level-triggered epoll brings us back after the others.
}

}  // namespace podlink
