#include "daemon/ncclipc/bridge.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/scm_rights.h"
#include "common/status_util.h"
#include "daemon/ncclipc/unix_names.h"

namespace podlink::ncclipc {
namespace {

const ComponentLog BridgeLog("ncclipc");

constexpr size_t kMaxDatagram = 4096;  // NCCL's ncclIpcHdr is under 200 bytes
constexpr int kMaxFdsPerDatagram = 4;  // room to see (and refuse) more than NCCL's one
constexpr int kBurstPerWakeup = 64;    // datagrams read from one mirror before others get a turn

sockaddr_un AddressOf(const UnixName& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  return a;
}

// A sealed, empty memfd: what a forwarded socket descriptor becomes.
absl::StatusOr<UniqueFd> Placeholder() {
  int fd = ::memfd_create("podlink-nccl-placeholder", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoStatus(errno, "memfd_create");
  UniqueFd f(fd);
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0) {
    return ErrnoStatus(errno, "seal placeholder");
  }
  return f;
}

enum class FdKind { kMemory, kSocket, kOther };

FdKind KindOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return FdKind::kOther;
  if (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)) return FdKind::kMemory;
  if (S_ISSOCK(st.st_mode)) return FdKind::kSocket;
  return FdKind::kOther;
}

}  // namespace

class Bridge::Impl {
 public:
  Impl(BridgeOptions o, NetnsSockets sockets, std::set<uint64_t> host_ns, UniqueFd wake, UniqueFd epoll,
       UniqueFd placeholder)
      : opt_(o),
        sockets_(std::move(sockets)),
        host_ns_(std::move(host_ns)),
        wake_(std::move(wake)),
        epoll_(std::move(epoll)),
        placeholder_(std::move(placeholder)) {}

  void Run();
  void Stop() {
    stop_.store(true, std::memory_order_release);
    Wake();
  }

  // Runs `fn` on the bridge's thread and waits for its status.
  absl::Status Call(std::function<absl::Status()> fn) {
    struct Job {
      std::function<absl::Status()> fn;
      absl::Status result;
      absl::Notification done;
    };
    auto job = std::make_shared<Job>();
    job->fn = std::move(fn);
    {
      absl::MutexLock l(&mu_);
      jobs_.push_back([job] {
        job->result = job->fn();
        job->done.Notify();
      });
    }
    Wake();
    if (!job->done.WaitForNotificationWithTimeout(opt_.call_timeout)) {
      return absl::DeadlineExceededError("podlinkd's NCCL IPC bridge did not answer in time");
    }
    return job->result;
  }

  // Bridge::Sync: one queued scan per session, its callers waiting together.
  absl::Status RequestSync(uint64_t session) {
    std::shared_ptr<PendingSync> p;
    bool queue = false;
    {
      absl::MutexLock l(&mu_);
      std::shared_ptr<PendingSync>& slot = pending_sync_[session];
      if (slot == nullptr) {
        slot = std::make_shared<PendingSync>();
        queue = true;
      }
      if (slot->waiters >= Bridge::kMaxSyncWaiters) {
        syncs_refused_.fetch_add(1, std::memory_order_relaxed);
        return absl::ResourceExhaustedError(absl::StrCat(Bridge::kMaxSyncWaiters,
                                                         " SyncNcclIpc calls of this session wait already"));
      }
      ++slot->waiters;
      p = slot;
      if (queue) {
        jobs_.push_back([this, session, p] {
          {
            // Started: a later call queues a scan of its own.
            absl::MutexLock l(&mu_);
            auto it = pending_sync_.find(session);
            if (it != pending_sync_.end() && it->second == p) pending_sync_.erase(it);
          }
          syncs_scanned_.fetch_add(1, std::memory_order_relaxed);
          p->result = Sync(session);
          p->done.Notify();
        });
      } else {
        syncs_coalesced_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (queue) Wake();
    if (!p->done.WaitForNotificationWithTimeout(opt_.call_timeout)) {
      return absl::DeadlineExceededError("podlinkd's NCCL IPC bridge did not answer in time");
    }
    return p->result;
  }

  absl::Status Join(Member m);
  absl::Status Sync(uint64_t session);
  void Leave(uint64_t session);

  BridgeCounters counters() const {
    absl::MutexLock l(&counters_mu_);
    BridgeCounters c = c_;
    c.syncs_scanned = syncs_scanned_.load(std::memory_order_relaxed);
    c.syncs_coalesced = syncs_coalesced_.load(std::memory_order_relaxed);
    c.syncs_refused = syncs_refused_.load(std::memory_order_relaxed);
    return c;
  }
  std::atomic<size_t> members{0}, mirror_count{0};

 private:
  struct Pod {
    uint64_t ino = 0;
    std::string group, ref;
    UniqueFd netns, diag, sender;  // sender: an unbound datagram socket in the pod's namespace
    std::set<uint64_t> sessions;
    std::map<UnixName, uint64_t> names;  // NCCL names really bound here (last scan) -> inode
    bool over_limit = false;  // more NCCL names bound than max_names_per_pod (at the last scan)
    size_t answers = 0;  // mirrors made elsewhere for this pod's requests, not yet used
    double tokens = 0;
    absl::Time refill = absl::InfinitePast();
  };
  struct Mirror {
    uint64_t in = 0;  // the namespace it is bound in
    uint64_t to = 0;  // the namespace of the real socket
    UnixName name;
    UniqueFd sock;
    uint64_t ino = 0;
    uint64_t id = 0;  // epoll's tag
    bool answer = false;  // made for one answer (not seen by a scan)
    absl::Time expires = absl::InfiniteFuture();
  };
  using Key = std::pair<uint64_t, UnixName>;  // (namespace, name)

  void Wake() {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }
  void Count(uint64_t BridgeCounters::*field) {
    absl::MutexLock l(&counters_mu_);
    ++(c_.*field);
  }
  Pod* PodOf(uint64_t session) {
    auto it = session_pod_.find(session);
    if (it == session_pod_.end()) return nullptr;
    auto p = pods_.find(it->second);
    return p == pods_.end() ? nullptr : &p->second;
  }
  absl::Status Scan(Pod& p);
  void MirrorInto(Pod& target, Pod& origin);
  absl::StatusOr<Mirror*> EnsureMirror(Pod& in, const UnixName& name, uint64_t to, bool answer);
  void RemoveMirror(const Key& k);
  void RemovePod(uint64_t ino);
  // Reads what arrived at `m` and passes it on; false once `m` was removed.
  bool Forward(Mirror* m);
  bool TakeToken(Pod& p);
  void Periodic();

  const BridgeOptions opt_;
  const NetnsSockets sockets_;
  // podlinkd's network namespace and the host's (pid 1's: podlinkd runs in the
  // host PID namespace): never a member's, whose mirrors everyone there would see.
  const std::set<uint64_t> host_ns_;
  UniqueFd wake_, epoll_, placeholder_;
  std::atomic<bool> stop_{false};

  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  struct PendingSync {
    int waiters = 0;
    absl::Status result;
    absl::Notification done;
  };
  std::map<uint64_t, std::shared_ptr<PendingSync>> pending_sync_ ABSL_GUARDED_BY(mu_);  // by session: queued, not started
  std::atomic<uint64_t> syncs_scanned_{0}, syncs_coalesced_{0}, syncs_refused_{0};
  mutable absl::Mutex counters_mu_;
  BridgeCounters c_ ABSL_GUARDED_BY(counters_mu_);

  // The bridge's thread only.
  std::map<uint64_t, Pod> pods_;                       // by network namespace inode
  std::map<uint64_t, uint64_t> session_pod_;           // session -> namespace inode
  std::map<Key, std::unique_ptr<Mirror>> mirrors_;
  std::map<uint64_t, Mirror*> by_id_;  // epoll tag -> mirror (0 is the wake-up eventfd)
  uint64_t next_id_ = 1;
  std::set<uint64_t> own_;                             // inodes of the mirrors' sockets: never mirrored back
  absl::Time next_scan_ = absl::InfinitePast();
  absl::Time last_refusal_log_ = absl::InfinitePast();
};

absl::Status Bridge::Impl::Scan(Pod& p) {
  auto names = ListAbstractDgramNames(p.diag.get());
  if (!names.ok()) return names.status();
  std::map<UnixName, uint64_t> now;
  bool over = false;
  for (BoundName& b : *names) {
    if (own_.count(b.inode) != 0 || !IsNcclIpcName(b.name)) continue;
    if (now.size() >= opt_.max_names_per_pod && now.count(b.name) == 0) {
      over = true;
      continue;
    }
    now.emplace(std::move(b.name), b.inode);
  }
  if (over && !p.over_limit) {
    Count(&BridgeCounters::mirror_limit);
    BridgeLog()->warn("event=names_over_limit pod={} limit={}", p.ref, opt_.max_names_per_pod);
  }
  p.over_limit = over;
  // Names gone from this namespace: their mirrors elsewhere go too (a mirror
  // made for an answer stays until it is used or expires).
  for (const auto& [name, ino] : p.names) {
    if (now.count(name) != 0) continue;
    for (auto& [oino, other] : pods_) {
      if (oino == p.ino) continue;
      auto it = mirrors_.find(Key{oino, name});
      if (it != mirrors_.end() && it->second->to == p.ino && !it->second->answer) RemoveMirror(it->first);
    }
  }
  p.names = std::move(now);
  for (auto& [oino, other] : pods_) {
    if (oino != p.ino && other.group == p.group) MirrorInto(other, p);
  }
  return absl::OkStatus();
}

void Bridge::Impl::MirrorInto(Pod& target, Pod& origin) {
  for (const auto& [name, ino] : origin.names) {
    if (target.names.count(name) != 0) {
      // The same name really bound in both: neither can reach the other's.
      if (mirrors_.count(Key{target.ino, name}) == 0) Count(&BridgeCounters::name_conflicts);
      continue;
    }
    auto it = mirrors_.find(Key{target.ino, name});
    if (it != mirrors_.end()) {
      if (it->second->to == origin.ino && it->second->answer) {
        if (origin.answers > 0) --origin.answers;
        it->second->answer = false;  // a scan saw the name: it lives as long as the name
        it->second->expires = absl::InfiniteFuture();
      }
      continue;
    }
    auto m = EnsureMirror(target, name, origin.ino, false);
    if (!m.ok()) {
      BridgeLog()->warn("event=mirror_failed name={} from={} into={} error={}", Printable(name), origin.ref, target.ref,
                  LogQuoted(m.status().message()));
    }
  }
}

absl::StatusOr<Bridge::Impl::Mirror*> Bridge::Impl::EnsureMirror(Pod& in, const UnixName& name, uint64_t to,
                                                                 bool answer) {
  auto it = mirrors_.find(Key{in.ino, name});
  if (it != mirrors_.end()) {
    if (it->second->to != to) return absl::AlreadyExistsError("name mirrored from another pod");
    return it->second.get();
  }
  auto owner = pods_.find(to);
  if (owner == pods_.end()) return absl::NotFoundError("no such member");
  if (answer && owner->second.answers >= opt_.max_answers_per_pod) {
    Count(&BridgeCounters::mirror_limit);
    return absl::ResourceExhaustedError(absl::StrCat(owner->second.ref, " has ", owner->second.answers,
                                                     " NCCL requests waiting for answers already (the limit)"));
  }
  PODLINK_ASSIGN_OR_RETURN(UniqueFd sock, sockets_.Socket(in.netns.get(), AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0));
  socklen_t len = 0;
  sockaddr_un a = AddressOf(name, &len);
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
    int err = errno;
    if (err == EADDRINUSE) Count(&BridgeCounters::name_conflicts);
    return ErrnoStatus(err, "bind mirror");
  }
  struct stat st {};
  if (::fstat(sock.get(), &st) != 0) return ErrnoStatus(errno, "fstat mirror");
  auto m = std::make_unique<Mirror>();
  m->in = in.ino;
  m->to = to;
  m->name = name;
  m->ino = st.st_ino;
  m->answer = answer;
  if (answer) m->expires = absl::Now() + opt_.answer_ttl;
  m->sock = std::move(sock);
  m->id = next_id_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = m->id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, m->sock.get(), &ev) != 0) return ErrnoStatus(errno, "epoll_ctl");
  own_.insert(m->ino);
  by_id_[m->id] = m.get();
  if (answer) ++owner->second.answers;
  Mirror* raw = m.get();
  mirrors_.emplace(Key{in.ino, name}, std::move(m));
  mirror_count.store(mirrors_.size(), std::memory_order_relaxed);
  Count(&BridgeCounters::mirrors_bound);
  return raw;
}

void Bridge::Impl::RemoveMirror(const Key& k) {
  auto it = mirrors_.find(k);
  if (it == mirrors_.end()) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second->sock.get(), nullptr);
  own_.erase(it->second->ino);
  by_id_.erase(it->second->id);
  if (it->second->answer) {
    if (auto p = pods_.find(it->second->to); p != pods_.end() && p->second.answers > 0) --p->second.answers;
  }
  mirrors_.erase(it);
  mirror_count.store(mirrors_.size(), std::memory_order_relaxed);
}

void Bridge::Impl::RemovePod(uint64_t ino) {
  std::vector<Key> gone;
  for (const auto& [k, m] : mirrors_) {
    if (m->in == ino || m->to == ino) gone.push_back(k);
  }
  for (const Key& k : gone) RemoveMirror(k);
  pods_.erase(ino);
  members.store(pods_.size(), std::memory_order_relaxed);
}

bool Bridge::Impl::TakeToken(Pod& p) {
  absl::Time now = absl::Now();
  const double rate = opt_.datagrams_per_second;
  if (p.refill == absl::InfinitePast()) {
    p.tokens = rate;
  } else {
    p.tokens = std::min(rate, p.tokens + absl::ToDoubleSeconds(now - p.refill) * rate);
  }
  p.refill = now;
  if (p.tokens < 1) return false;
  p.tokens -= 1;
  return true;
}

bool Bridge::Impl::Forward(Mirror* m) {
  for (int n = 0; n < kBurstPerWakeup; ++n) {
    char data[kMaxDatagram];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerDatagram)];
    sockaddr_un from{};
    iovec iov{data, sizeof(data)};
    msghdr msg{};
    msg.msg_name = &from;
    msg.msg_namelen = sizeof(from);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t got = ::recvmsg(m->sock.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) return true;  // EAGAIN: drained
    std::vector<UniqueFd> fds = TakeFds(msg);
    auto sender_pod = pods_.find(m->in);
    auto dest_pod = pods_.find(m->to);
    if (sender_pod == pods_.end() || dest_pod == pods_.end()) return true;
    Pod& sender = sender_pod->second;
    Pod& dest = dest_pod->second;
    auto refuse = [&](uint64_t BridgeCounters::*field, const char* why) {
      Count(field);
      absl::Time now = absl::Now();
      if (now - last_refusal_log_ > absl::Seconds(1)) {
        last_refusal_log_ = now;
        BridgeLog()->warn("event=datagram_refused from={} to={} name={} reason={}", sender.ref, dest.ref,
                    Printable(m->name), LogQuoted(why));
      }
    };
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
      refuse(&BridgeCounters::refused_malformed, "truncated datagram or descriptors");
      continue;
    }
    if (!TakeToken(sender)) {
      Count(&BridgeCounters::dropped_rate);
      continue;
    }
    if (fds.size() > 1) {
      refuse(&BridgeCounters::refused_descriptor, "more than one descriptor");
      continue;
    }
    bool replaced = false;
    if (!fds.empty()) {
      FdKind k = KindOf(fds[0].get());
      if (k == FdKind::kOther) {
        refuse(&BridgeCounters::refused_descriptor, "a descriptor that is neither memory nor a socket");
        continue;
      }
      if (k == FdKind::kSocket) {
        fds[0].Reset(::fcntl(placeholder_.get(), F_DUPFD_CLOEXEC, 0));
        replaced = true;
        if (!fds[0].valid()) continue;
      }
    }
    // Sent from a mirror of the sender's own NCCL name when it has one (the
    // answer comes back through it); answers and anything else from the
    // destination's unbound socket.
    int out = dest.sender.get();
    const size_t from_len = msg.msg_namelen > offsetof(sockaddr_un, sun_path)
                                ? msg.msg_namelen - offsetof(sockaddr_un, sun_path)
                                : 0;
    if (!m->answer && from_len > 0) {
      UnixName sender_name(from.sun_path, std::min(from_len, sizeof(from.sun_path)));
      if (IsNcclIpcName(sender_name)) {
        auto back = EnsureMirror(dest, sender_name, sender.ino, true);
        if (back.ok()) out = (*back)->sock.get();
      }
    }
    socklen_t to_len = 0;
    sockaddr_un to = AddressOf(m->name, &to_len);
    alignas(cmsghdr) char oc[CMSG_SPACE(sizeof(int))];
    iovec oiov{data, static_cast<size_t>(got)};
    msghdr o{};
    o.msg_name = &to;
    o.msg_namelen = to_len;
    o.msg_iov = &oiov;
    o.msg_iovlen = 1;
    if (!fds.empty()) AttachFd(o, oc, sizeof(oc), fds[0].get());
    if (::sendmsg(out, &o, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
      Count(&BridgeCounters::dropped_undeliverable);
      BridgeLog()->debug("event=undeliverable to={} name={} errno={}", dest.ref, Printable(m->name), errno);
      continue;
    }
    {
      absl::MutexLock l(&counters_mu_);
      ++c_.datagrams_forwarded;
      if (!fds.empty()) ++(replaced ? c_.descriptors_replaced : c_.descriptors_forwarded);
    }
    if (m->answer) {
      // Its one answer delivered: NCCL closes the asking socket next.
      RemoveMirror(Key{m->in, m->name});
      return false;
    }
  }
  return true;
}

void Bridge::Impl::Periodic() {
  absl::Time now = absl::Now();
  if (now < next_scan_) return;
  next_scan_ = now + opt_.rescan_interval;
  std::vector<Key> expired;
  for (const auto& [k, m] : mirrors_) {
    if (m->answer && m->expires < now) expired.push_back(k);
  }
  for (const Key& k : expired) RemoveMirror(k);
  for (auto& [ino, p] : pods_) {
    absl::Status s = Scan(p);
    if (!s.ok()) BridgeLog()->debug("event=scan_failed pod={} error={}", p.ref, LogQuoted(s.message()));
  }
}

void Bridge::Impl::Run() {
  epoll_event events[32];
  while (!stop_.load(std::memory_order_acquire)) {
    int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(opt_.rescan_interval));
    int n = ::epoll_wait(epoll_.get(), events, 32, std::max(timeout_ms, 1));
    for (int i = 0; i < n; ++i) {
      // A copy: struct epoll_event is packed on x86-64, so its u64 is misaligned and find() must not bind a
      // reference to it (UBSan under clang).
      const uint64_t tag = events[i].data.u64;
      if (tag == 0) {
        uint64_t v;
        (void)!::read(wake_.get(), &v, sizeof(v));
        continue;
      }
      // Looked up by tag: an earlier event of this round may have removed it.
      auto m = by_id_.find(tag);
      if (m != by_id_.end()) Forward(m->second);
    }
    std::deque<std::function<void()>> jobs;
    {
      absl::MutexLock l(&mu_);
      jobs.swap(jobs_);
    }
    for (auto& j : jobs) j();
    Periodic();
  }
  std::vector<uint64_t> all;
  for (const auto& [ino, p] : pods_) all.push_back(ino);
  for (uint64_t ino : all) RemovePod(ino);
  // Callers still waiting are answered.
  absl::MutexLock l(&mu_);
  for (auto& j : jobs_) j();
  jobs_.clear();
}

absl::Status Bridge::Impl::Join(Member m) {
  PODLINK_ASSIGN_OR_RETURN(uint64_t ino, NamespaceInode(m.netns.get()));
  if (host_ns_.count(ino) != 0) {
    return absl::FailedPreconditionError(
        "the pod shares the host's or podlinkd's network namespace (hostNetwork?): NCCL native mode needs a pod "
        "network namespace");
  }
  if (session_pod_.count(m.session) != 0) return absl::OkStatus();
  auto it = pods_.find(ino);
  if (it != pods_.end()) {
    if (it->second.group != m.group) {
      return absl::FailedPreconditionError(absl::StrCat("network namespace already joined by peer group '",
                                                        it->second.group, "'"));
    }
    it->second.sessions.insert(m.session);
    session_pod_[m.session] = ino;
    return Scan(it->second);
  }
  Pod p;
  p.ino = ino;
  p.group = m.group;
  p.ref = m.pod;
  PODLINK_ASSIGN_OR_RETURN(p.diag, sockets_.DiagSocket(m.netns.get()));
  PODLINK_ASSIGN_OR_RETURN(p.sender, sockets_.Socket(m.netns.get(), AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0));
  p.netns = std::move(m.netns);
  p.sessions.insert(m.session);
  Pod& in = pods_.emplace(ino, std::move(p)).first->second;
  members.store(pods_.size(), std::memory_order_relaxed);
  session_pod_[m.session] = ino;
  // The others' names into the newcomer, then the newcomer's into theirs.
  for (auto& [oino, other] : pods_) {
    if (oino != ino && other.group == in.group) MirrorInto(in, other);
  }
  BridgeLog()->info("event=join pod={} group={} netns={} members={}", in.ref, LogQuoted(in.group), ino, pods_.size());
  return Scan(in);
}

absl::Status Bridge::Impl::Sync(uint64_t session) {
  Pod* p = PodOf(session);
  if (p == nullptr) return absl::FailedPreconditionError("this session has not joined NCCL native mode");
  return Scan(*p);
}

void Bridge::Impl::Leave(uint64_t session) {
  auto it = session_pod_.find(session);
  if (it == session_pod_.end()) return;
  uint64_t ino = it->second;
  session_pod_.erase(it);
  auto p = pods_.find(ino);
  if (p == pods_.end()) return;
  p->second.sessions.erase(session);
  if (!p->second.sessions.empty()) return;
  BridgeLog()->info("event=leave pod={} group={} netns={}", p->second.ref, LogQuoted(p->second.group), ino);
  RemovePod(ino);
}

// ------------------------------------------------------------------ Bridge

absl::StatusOr<std::unique_ptr<Bridge>> Bridge::Start(BridgeOptions options) {
  if (options.max_names_per_pod == 0 || options.max_answers_per_pod == 0 || options.datagrams_per_second == 0) {
    return absl::InvalidArgumentError("NCCL IPC bridge: limits must be positive");
  }
  PODLINK_ASSIGN_OR_RETURN(NetnsSockets sockets, NetnsSockets::Create());
  PODLINK_ASSIGN_OR_RETURN(uint64_t home, NamespaceInode(sockets.home()));
  std::set<uint64_t> host_ns = {home};
  if (UniqueFd init(::open("/proc/1/ns/net", O_RDONLY | O_CLOEXEC)); init) {
    if (auto i = NamespaceInode(init.get()); i.ok()) host_ns.insert(*i);
  }
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoStatus(errno, "eventfd");
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep) return ErrnoStatus(errno, "epoll_create1");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  if (::epoll_ctl(ep.get(), EPOLL_CTL_ADD, wake.get(), &ev) != 0) return ErrnoStatus(errno, "epoll_ctl");
  PODLINK_ASSIGN_OR_RETURN(UniqueFd ph, Placeholder());
  auto impl = std::make_unique<Impl>(options, std::move(sockets), std::move(host_ns), std::move(wake), std::move(ep),
                                     std::move(ph));
  std::unique_ptr<Bridge> b(new Bridge(std::move(impl)));
  return b;
}

Bridge::Bridge(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  thread_ = std::thread([raw = impl_.get()] { raw->Run(); });
}

Bridge::~Bridge() {
  impl_->Stop();
  thread_.join();
}

absl::Status Bridge::Join(Member m) {
  auto shared = std::make_shared<Member>(std::move(m));
  return impl_->Call([this, shared] { return impl_->Join(std::move(*shared)); });
}

absl::Status Bridge::Sync(uint64_t session) { return impl_->RequestSync(session); }

absl::Status Bridge::RunOnBridgeThread(std::function<absl::Status()> fn) { return impl_->Call(std::move(fn)); }

void Bridge::Leave(uint64_t session) {
  (void)impl_->Call([this, session] {
    impl_->Leave(session);
    return absl::OkStatus();
  });
}

BridgeCounters Bridge::Counters() const { return impl_->counters(); }
size_t Bridge::members() const { return impl_->members.load(std::memory_order_relaxed); }
size_t Bridge::mirrors() const { return impl_->mirror_count.load(std::memory_order_relaxed); }

std::string Bridge::RenderMetrics() const {
  BridgeCounters c = Counters();
  std::string out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    absl::StrAppend(&out, "# HELP podlink_nccl_ipc_", name, " ", help, "\n# TYPE podlink_nccl_ipc_", name,
                    " counter\npodlink_nccl_ipc_", name, " ", v, "\n");
  };
  absl::StrAppend(&out, "# HELP podlink_nccl_ipc_members Pod network namespaces in NCCL native mode\n",
                  "# TYPE podlink_nccl_ipc_members gauge\npodlink_nccl_ipc_members ", members(), "\n",
                  "# HELP podlink_nccl_ipc_mirrors NCCL socket names mirrored into other pods now\n",
                  "# TYPE podlink_nccl_ipc_mirrors gauge\npodlink_nccl_ipc_mirrors ", mirrors(), "\n");
  counter("mirrors_bound_total", "NCCL socket mirrors made", c.mirrors_bound);
  counter("datagrams_forwarded_total", "NCCL IPC datagrams carried between pods", c.datagrams_forwarded);
  counter("descriptors_forwarded_total", "memory descriptors carried between pods", c.descriptors_forwarded);
  counter("descriptors_replaced_total", "socket descriptors replaced by an empty memfd", c.descriptors_replaced);
  counter("refused_descriptor_total", "datagrams dropped for a descriptor that is not memory",
          c.refused_descriptor);
  counter("refused_malformed_total", "datagrams dropped as truncated", c.refused_malformed);
  counter("dropped_rate_total", "datagrams dropped over a pod's rate", c.dropped_rate);
  counter("dropped_undeliverable_total", "datagrams whose socket was full or gone", c.dropped_undeliverable);
  counter("mirror_limit_total", "mirrors not made: a pod's limit", c.mirror_limit);
  counter("name_conflicts_total", "mirrors not made: the name was taken", c.name_conflicts);
  counter("syncs_scanned_total", "scans of a pod that SyncNcclIpc calls asked for", c.syncs_scanned);
  counter("syncs_coalesced_total", "SyncNcclIpc calls answered by a scan another call had queued", c.syncs_coalesced);
  counter("syncs_refused_total", "SyncNcclIpc calls refused: too many of one session waiting", c.syncs_refused);
  return out;
}

}  // namespace podlink::ncclipc
