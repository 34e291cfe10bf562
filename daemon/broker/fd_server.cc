#include "daemon/broker/fd_server.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/status_util.h"
#include "common/log.h"

namespace podlink {
namespace {

constexpr uint64_t kListenKey = 0;
constexpr uint64_t kWakeKey = ~uint64_t{0};
constexpr uint64_t kOpenedKey = ~uint64_t{1};
constexpr int kMessagesPerWake = 32;
constexpr int kOpeners = 4;
constexpr size_t kMaxWaiting = 512;      // clients waiting for the pod source, in all
constexpr size_t kMaxWaitingPerPod = 8;  // and per pod

const ComponentLog FdLog("fdchan");

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
  UniqueFd opened(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!opened) return ErrnoStatus(errno, "eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenKey;
  ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, ls.get(), &ev);
  ev.data.u64 = kWakeKey;
  ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, wake.get(), &ev);
  ev.data.u64 = kOpenedKey;
  ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, opened.get(), &ev);
  std::unique_ptr<FdServer> srv(
      new FdServer(broker, std::move(ls), std::move(ep), std::move(wake), std::move(opened), path));
  srv->thread_ = std::thread([s = srv.get()] { s->Run(); });
  for (int i = 0; i < kOpeners; ++i) srv->openers_.emplace_back([s = srv.get()] { s->Opener(); });
  return srv;
}

FdServer::FdServer(Broker* broker, UniqueFd listen, UniqueFd epoll, UniqueFd wake, UniqueFd opened_wake,
                   std::string path)
    : broker_(broker),
      listen_(std::move(listen)),
      epoll_(std::move(epoll)),
      wake_(std::move(wake)),
      opened_wake_(std::move(opened_wake)),
      path_(std::move(path)) {}

FdServer::~FdServer() { Stop(); }

void FdServer::Stop() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock l(&open_mu_);
    stopping_ = true;
    open_cv_.SignalAll();
  }
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  thread_.join();
  for (std::thread& t : openers_) t.join();  // one asking the runtime returns within its deadline
  openers_.clear();
  std::vector<std::shared_ptr<Session>> opened;
  std::deque<Waiting> waiting;
  {
    absl::MutexLock l(&open_mu_);
    opened.swap(opened_);
    waiting.swap(waiting_);
  }
  for (Waiting& w : waiting) {
    (void)broker_->FinishOpen(std::move(w.sock), std::move(w.peer), absl::UnavailableError("podlinkd is stopping"));
  }
  for (auto& s : opened) sessions_[s->id] = s;
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
      FdLog()->error("event=epoll_failed error={}", LogQuoted(std::strerror(errno)));
      return;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64;
      if (key == kWakeKey) return;
      if (key == kOpenedKey) {
        RegisterOpened();
      } else if (key == kListenKey) {
        Accept();
      } else {
        Drain(key);
      }
    }
  }
}

namespace {
// Bytes; the kernel doubles it and charges each small SCM_RIGHTS message about 770 (2026-12-07, Debian 12's 6.1):
// some 2,700 deliveries.
constexpr int kSessionSendBuffer = 1 << 20;
}  // namespace

void FdServer::Accept() {
  for (int i = 0; i < kMessagesPerWake; ++i) {
    UniqueFd sock(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!sock) {
      if (errno != EAGAIN && errno != EINTR) {
        FdLog()->warn("event=accept_failed error={}", LogQuoted(std::strerror(errno)));
      }
      return;
    }
    // Room for an import's deliveries, which podlinkd sends without waiting before the client reads any: one
    // per allocation of a chunked GPU export (up to max_export_chunks, 1024 by default; the default buffer holds
    // about 270). SO_SNDBUFFORCE, as root; where it is refused the default stays and a larger import fails
    // cleanly (ResourceExhausted).
    const int sndbuf = kSessionSendBuffer;
    (void)::setsockopt(sock.get(), SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf));
    absl::StatusOr<PeerIdentity> peer = broker_->IdentifyClient(sock.get());
    if (!peer.ok()) {
      absl::Status why = peer.status();
      Register(broker_->FinishOpen(std::move(sock), std::move(peer), why));
      continue;
    }
    if (std::optional<absl::StatusOr<PodInfo>> pod = broker_->ResolvePodCached(*peer)) {
      Register(broker_->FinishOpen(std::move(sock), std::move(peer), *std::move(pod)));
      continue;
    }
    // Only the pod source can tell, perhaps after asking the runtime: an opener does that.
    const std::string pod_uid = peer->cgroup.pod_uid;
    bool queued = false;
    {
      absl::MutexLock l(&open_mu_);
      size_t& mine = waiting_per_pod_[pod_uid];
      if (waiting_.size() < kMaxWaiting && mine < kMaxWaitingPerPod) {
        ++mine;
        waiting_.push_back(Waiting{std::move(sock), *std::move(peer)});
        open_cv_.Signal();
        queued = true;
      } else if (mine == 0) {
        waiting_per_pod_.erase(pod_uid);
      }
    }
    if (!queued) {
      Register(broker_->FinishOpen(
          std::move(sock), std::move(peer),
          absl::ResourceExhaustedError(absl::StrCat("podlinkd is already waiting for the container runtime on ",
                                                    "other connections from this pod; retry in a moment"))));
    }
  }
}

void FdServer::Opener() {
  for (;;) {
    Waiting w;
    {
      absl::MutexLock l(&open_mu_);
      // The oldest client whose pod no other opener is resolving: one pod
      // never holds more than one opener.
      auto next = waiting_.end();
      for (;;) {
        if (stopping_) return;
        next = std::find_if(waiting_.begin(), waiting_.end(),
                            [&](const Waiting& x) { return resolving_.count(x.peer.cgroup.pod_uid) == 0; });
        if (next != waiting_.end()) break;
        open_cv_.Wait(&open_mu_);
      }
      w = std::move(*next);
      waiting_.erase(next);
      auto it = waiting_per_pod_.find(w.peer.cgroup.pod_uid);
      if (it != waiting_per_pod_.end() && --it->second == 0) waiting_per_pod_.erase(it);
      resolving_.insert(w.peer.cgroup.pod_uid);
    }
    // A client that gave up waiting (its connect timed out) is not worth a lookup.
    pollfd hup{w.sock.get(), POLLRDHUP, 0};
    const bool gone = ::poll(&hup, 1, 0) == 1 && (hup.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    absl::StatusOr<PodInfo> pod = gone ? absl::CancelledError("the client hung up while waiting")
                                       : broker_->ResolvePod(w.peer);
    bool stopping;
    {
      absl::MutexLock l(&open_mu_);
      resolving_.erase(w.peer.cgroup.pod_uid);
      open_cv_.SignalAll();  // that pod's next client may go now
      stopping = stopping_;
    }
    if (gone) continue;
    if (stopping) pod = absl::UnavailableError("podlinkd is stopping");
    absl::StatusOr<std::shared_ptr<Session>> s = broker_->FinishOpen(std::move(w.sock), std::move(w.peer), pod);
    if (!s.ok()) {
      FdLog()->warn("event=session_refused reason={}", LogQuoted(s.status().ToString()));
      continue;
    }
    {
      absl::MutexLock l(&open_mu_);
      stopping = stopping_;
      if (!stopping) opened_.push_back(*s);
    }
    if (stopping) {
      broker_->CloseSession((*s)->id, "daemon stopping");
      continue;
    }
    uint64_t one = 1;
    (void)!::write(opened_wake_.get(), &one, sizeof(one));
  }
}

void FdServer::RegisterOpened() {
  uint64_t n;
  (void)!::read(opened_wake_.get(), &n, sizeof(n));
  std::vector<std::shared_ptr<Session>> opened;
  {
    absl::MutexLock l(&open_mu_);
    opened.swap(opened_);
  }
  for (auto& s : opened) Register(std::move(s));
}

void FdServer::Register(absl::StatusOr<std::shared_ptr<Session>> s) {
  if (!s.ok()) {
    FdLog()->warn("event=session_refused reason={}", LogQuoted(s.status().ToString()));
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = (*s)->id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, (*s)->sock.get(), &ev) != 0) {
    broker_->CloseSession((*s)->id, "epoll registration failed");
    return;
  }
  sessions_[(*s)->id] = *std::move(s);
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
      FdLog()->warn("event=protocol_violation session={} error={}", session_id, LogQuoted(m.status().message()));
      return close(absl::StrCat("protocol violation: ", m.status().message()));
    }
    if (m->msg.type != static_cast<uint16_t>(FdMsgType::kOffer)) {
      FdLog()->warn("event=protocol_violation session={} type={}", session_id, m->msg.type);
      return close(absl::StrCat("protocol violation: unexpected message type ", m->msg.type));
    }
    broker_->OnOffer(*s, m->msg.seq, std::move(m->fd));
  }
  // Budget used up: level-triggered epoll brings us back after the others.
}

}  // namespace podlink
