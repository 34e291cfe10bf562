#include "daemon/mesh/tcp/tcp_link.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/links/random.h"

namespace podlink::mesh {
namespace {

constexpr uint32_t kMaxErrorText = 4096;
const ComponentLog Log("mesh");

}  // namespace

PeerLinks::PeerLinks(std::string node, uint64_t slice_bytes, uint32_t slices_in_flight,
                     absl::Duration answer_timeout, bool zero_copy)
    : node_(std::move(node)),
      instance_(RandomInstance()),
      slice_bytes_(std::clamp<uint64_t>(slice_bytes, 4096, kMaxFramePayload)),
      slices_in_flight_(std::max<uint32_t>(slices_in_flight, 1)),
      answer_timeout_(answer_timeout),
      zero_copy_(zero_copy),
      sched_(&mu_, SliceScheduler::Options{.max_attempts = kMaxAttempts},
             [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !stop_ && stats_.connections_up > 0; },
             [this] { cv_.SignalAll(); }, absl::StrCat("no data connection to node ", node_, " is up")) {}

PeerLinks::~PeerLinks() {
  std::vector<Conn*> all;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    for (auto& c : conns_) {
      ::shutdown(c->fd.get(), SHUT_RDWR);
      all.push_back(c.get());
    }
  }
  cv_.SignalAll();
  for (Conn* c : all) {
    if (c->tx.joinable()) c->tx.join();
    if (c->rx.joinable()) c->rx.join();
  }
  std::vector<Slice> left;
  {
    absl::MutexLock l(&mu_);
    for (auto& c : conns_) {
      for (auto& [tag, s] : c->unacked) left.push_back(std::move(s));
      c->unacked.clear();
    }
    std::vector<Slice> queued = sched_.TakeAll();
    left.insert(left.end(), std::make_move_iterator(queued.begin()), std::make_move_iterator(queued.end()));
  }
  for (const Slice& s : left) sched_.Settle(s, absl::UnavailableError("mesh link to node " + node_ + " closed"));
}

void PeerLinks::AddConnection(UniqueFd fd, std::string path) {
  std::vector<std::unique_ptr<Conn>> gone;
  {
    // Failed connections: their threads are done or about to be (Kill shut
    // the socket down); join them outside the lock they may still need.
    absl::MutexLock l(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->dead) {
        gone.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : gone) {
    if (c->tx.joinable()) c->tx.join();
    if (c->rx.joinable()) c->rx.join();
  }
  absl::MutexLock l(&mu_);
  auto c = std::make_unique<Conn>(&zc_counters_);
  c->fd = std::move(fd);
  c->path = std::move(path);
  if (zero_copy_ && !c->zc.Enable(c->fd.get())) {
    Log()->info("event=mesh_tcp_zero_copy_off node={} path={} reason=\"SO_ZEROCOPY refused: {}\"", node_, c->path,
                std::strerror(errno));
    c->zc_logged_off = true;
  }
  Conn* raw = c.get();
  conns_.push_back(std::move(c));
  ++stats_.connections_up;
  up_paths_.insert(raw->path);
  raw->tx = std::thread([this, raw] { Send(*raw); });
  raw->rx = std::thread([this, raw] { Receive(*raw); });
}

size_t PeerLinks::live() const {
  absl::MutexLock l(&mu_);
  return stats_.connections_up;
}

LinkStats PeerLinks::Stats() const {
  absl::MutexLock l(&mu_);
  LinkStats s = stats_;
  s.tcp_zero_copy_bytes = zc_counters_.bytes.load(std::memory_order_relaxed);
  s.tcp_zero_copy_completed = zc_counters_.completed.load(std::memory_order_relaxed);
  s.tcp_zero_copy_copied = zc_counters_.copied.load(std::memory_order_relaxed);
  s.tcp_zero_copy_fell_back = zc_counters_.fell_back.load(std::memory_order_relaxed);
  return s;
}

std::vector<std::tuple<std::string, bool, uint64_t>> PeerLinks::Connections() const {
  absl::MutexLock l(&mu_);
  std::vector<std::tuple<std::string, bool, uint64_t>> out;
  for (const auto& c : conns_) out.emplace_back(c->path, !c->dead, c->bytes_sent);
  return out;
}

absl::Status PeerLinks::Submit(LinkOp op) {
  auto t = std::make_shared<Transfer>();
  t->op = std::move(op);
  {
    absl::MutexLock l(&mu_);
    if (stop_ || stats_.connections_up == 0) {
      return absl::UnavailableError(absl::StrCat("no data connection to node ", node_, " is up"));
    }
    PODLINK_RETURN_IF_ERROR(sched_.Cut(std::move(t), slice_bytes_));
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

std::optional<Slice> PeerLinks::NextFor(const Conn& c) {
  return sched_.Next([&](const Slice& s) {
    return SliceScheduler::MayCarry(s, c.path, up_paths_) ? SliceScheduler::Verdict::kTake
                                                          : SliceScheduler::Verdict::kSkip;
  });
}

void PeerLinks::Send(Conn& c) {
  for (;;) {
    Slice s;
    FrameHeader h{};
    {
      absl::MutexLock l(&mu_);
      std::optional<Slice> next;
      while (!stop_ && !c.dead && (c.unacked.size() >= slices_in_flight_ || !(next = NextFor(c)).has_value())) {
        cv_.Wait(&mu_);
      }
      if (stop_ || c.dead) return;  // nothing was taken then
      s = *std::move(next);
      const LinkOp& op = s.op->op;
      const bool done = s.done_record;
      h.magic = kFrameMagic;
      h.type = static_cast<uint16_t>(done ? FrameType::kDone : op.type);
      h.tag = Tag(s);
      h.grant = op.grant;
      h.offset = done ? 0 : op.type == FrameType::kNotify ? op.offset : op.offset + s.offset;
      h.length = done ? 0 : static_cast<uint32_t>(s.length);
      SliceScheduler::Sent(s, absl::Now());
      c.unacked[h.tag] = s;
    }
    const LinkOp& op = s.op->op;
    const char* payload =
        op.type == FrameType::kWrite && !s.done_record ? op.local + s.offset : nullptr;
    const size_t len = payload != nullptr ? s.length : 0;
    const bool zero = op.local_is_export && c.zc.on();
    absl::Status st = zero ? c.zc.WriteFrame(c.fd.get(), h, payload, len) : WriteFrame(c.fd.get(), h, payload, len);
    if (!st.ok()) return Kill(c, st);
    if (zero && !c.zc.on()) ReapZeroCopy(c);
    absl::MutexLock l(&mu_);
    if (payload != nullptr) {
      c.bytes_sent += s.length;
      stats_.bytes_sent += s.length;
    }
    ++stats_.slices;
  }
}

void PeerLinks::Receive(Conn& c) {
  absl::Time checked = absl::Now();
  bool error_queue_was_empty = false;
  for (;;) {
    // Wait for the next answer, watching for requests the peer leaves
    // unanswered (alive but stuck: TCP's own timeouts never fire then).
    pollfd p{c.fd.get(), POLLIN, 0};
    int ready = ::poll(&p, 1, 500);
    const int poll_errno = errno;
    if (ready < 0 && poll_errno == EINTR) continue;
    if (ready == 0 || absl::Now() - checked >= absl::Milliseconds(500)) {
      checked = absl::Now();
      absl::Time oldest = absl::InfiniteFuture();
      {
        absl::MutexLock l(&mu_);
        if (c.dead || stop_) return;
        for (const auto& [tag, s] : c.unacked) oldest = std::min(oldest, s.sent);
      }
      if (absl::Now() - oldest > answer_timeout_) {
        return Kill(c, absl::DeadlineExceededError(absl::StrCat("node ", node_, " left a request unanswered for ",
                                                                absl::FormatDuration(answer_timeout_))));
      }
    }
    if (ready < 0) {
      return Kill(c, absl::UnavailableError(absl::StrCat("mesh link to node ", node_, ": poll: ", std::strerror(poll_errno))));
    }
    if (ready == 0) continue;
    if ((p.revents & POLLERR) != 0 && (p.revents & (POLLIN | POLLHUP)) == 0) {
      // Zero-copy completions on the error queue: take them and wait on,
      // never blocking in the read below (which would stop the watch above).
      // Nothing there (the sending thread just took them) twice in a row: a
      // socket error, which the read reports at once.
      if (ReapZeroCopy(c) > 0) {
        error_queue_was_empty = false;
        continue;
      }
      if (!error_queue_was_empty) {
        error_queue_was_empty = true;
        continue;
      }
    }
    error_queue_was_empty = false;
    FrameHeader h;
    if (absl::Status st = ReadFull(c.fd.get(), &h, sizeof(h)); !st.ok()) return Kill(c, st);
    auto type = static_cast<FrameType>(h.type);
    if (h.magic != kFrameMagic || h.flags != 0 || (type != FrameType::kAck && type != FrameType::kData)) {
      return Kill(c, absl::DataLossError(absl::StrCat("node ", node_, " sent a malformed frame (type ", h.type, ")")));
    }
    // Take the slice: from here this thread alone finishes it, or hands it
    // back through Kill (never both, never twice).
    Slice s;
    bool known = false;
    {
      absl::MutexLock l(&mu_);
      auto it = c.unacked.find(h.tag);
      if (it != c.unacked.end()) {
        s = std::move(it->second);
        c.unacked.erase(it);
        known = true;
      }
    }
    if (!known) return Kill(c, absl::DataLossError(absl::StrCat("node ", node_, " answered unknown request ", h.tag)));
    absl::Status result;
    if (type == FrameType::kData) {
      if (s.op->op.type != FrameType::kRead || s.done_record || h.length != s.length) {
        return Kill(c,
                    absl::DataLossError(absl::StrCat("node ", node_, " sent ", h.length, " bytes for a read of ",
                                                     s.length)),
                    &s);
      }
      if (absl::Status st = ReadFull(c.fd.get(), s.op->op.local + s.offset, s.length); !st.ok()) {
        return Kill(c, st, &s);
      }
    } else {
      if (h.length > kMaxErrorText) {
        return Kill(c, absl::DataLossError(absl::StrCat("node ", node_, " sent an oversized answer")), &s);
      }
      std::string text(h.length, '\0');
      if (absl::Status st = ReadFull(c.fd.get(), text.data(), text.size()); !st.ok()) return Kill(c, st, &s);
      if (h.status != 0) {
        auto code = static_cast<absl::StatusCode>(h.status);
        if (h.status < 0 || h.status > 16) code = absl::StatusCode::kUnknown;
        result = absl::Status(code, absl::StrCat("node ", node_, ": ", text));
      }
    }
    {
      absl::MutexLock l(&mu_);
      if (type == FrameType::kData) stats_.bytes_received += s.length;
    }
    cv_.SignalAll();
    sched_.Settle(s, result);
  }
}

int PeerLinks::ReapZeroCopy(Conn& c) {
  const int taken = c.zc.Reap(c.fd.get());
  if (!zero_copy_ || c.zc.on()) return taken;
  absl::MutexLock l(&mu_);
  if (c.zc_logged_off) return taken;
  c.zc_logged_off = true;
  Log()->info("event=mesh_tcp_zero_copy_off node={} path={} reason=\"the kernel copied the pages (loopback, veth or "
              "a device without scatter-gather)\"",
              node_, c.path);
  return taken;
}

void PeerLinks::Kill(Conn& c, const absl::Status& why, Slice* owned) {
  std::vector<Slice> failed;
  std::function<void(const std::string&)> on_down;
  std::string path;
  {
    absl::MutexLock l(&mu_);
    if (owned != nullptr) {
      c.unacked[uint64_t{0}] = std::move(*owned);  // tag 0 is never used: handled below with the rest
      owned = nullptr;
    }
    if (c.dead) {
      // Failed already (by the other thread): only the slice handed in is left.
      for (auto& [tag, s] : c.unacked) failed.push_back(std::move(s));
      c.unacked.clear();
    }
  }
  if (!failed.empty()) {
    for (const Slice& s : failed) {
      sched_.Settle(s, absl::UnavailableError(absl::StrCat("mesh connection to node ", node_, " failed: ", why.message())));
    }
    return;
  }
  {
    absl::MutexLock l(&mu_);
    if (c.dead) return;
    c.dead = true;
    // The path is up while another of its connections is.
    if (std::none_of(conns_.begin(), conns_.end(),
                     [&](const std::unique_ptr<Conn>& o) { return !o->dead && o->path == c.path; })) {
      up_paths_.erase(c.path);
    }
    ::shutdown(c.fd.get(), SHUT_RDWR);
    --stats_.connections_up;
    if (!stop_) ++stats_.connection_failures;
    // What this connection carried goes to the others, first in line, unless
    // it was sent too often already.
    size_t resent = 0;
    for (auto it = c.unacked.rbegin(); it != c.unacked.rend(); ++it) {
      Slice& s = it->second;
      if (sched_.Resend(s, /*mark_resent=*/true, /*nothing_left=*/stop_ || stats_.connections_up == 0)) {
        ++stats_.resent_slices;
        ++resent;
      } else {
        failed.push_back(std::move(s));
      }
    }
    c.unacked.clear();
    if (stats_.connections_up == 0) {
      std::vector<Slice> queued = sched_.TakeAll();
      failed.insert(failed.end(), std::make_move_iterator(queued.begin()), std::make_move_iterator(queued.end()));
    }
    if (!stop_) {
      on_down = on_down_;
      path = c.path;
      Log()->warn("event=mesh_connection_down node={} path={} connections_left={} resent_slices={} failed_slices={} "
                  "error={}",
                  node_, c.path, stats_.connections_up, resent, failed.size(), LogQuoted(why.message()));
    }
  }
  cv_.SignalAll();
  absl::Status st = absl::UnavailableError(absl::StrCat("mesh connection to node ", node_, " (", c.path,
                                                        ") failed: ", why.message()));
  for (const Slice& s : failed) sched_.Settle(s, st);
  if (on_down) on_down(path);
}

}  // namespace podlink::mesh
