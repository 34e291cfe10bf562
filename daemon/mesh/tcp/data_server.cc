// The TCP transport's data server (data_server.h).
#include "daemon/mesh/tcp/data_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/tcp/sockets.h"

namespace podlink::mesh {
namespace {
const ComponentLog DataLog("mesh");
}  // namespace

TcpDataServer::TcpDataServer(Options options, DataAdmission& admission, LateCopies& late, Owner owner)
    : options_(options), admission_(admission), late_copies_(late), owner_(std::move(owner)) {}

TcpDataServer::~TcpDataServer() { Stop(); }

absl::Status TcpDataServer::Listen(uint32_t port) {
  // Plain TCP, every connection authenticated by its first frame.
  listen_fd_ = UniqueFd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_fd_.valid()) return ErrnoStatus(errno, "mesh data socket");
  int one = 1, zero = 0;
  ::setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ::setsockopt(listen_fd_.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_port = htons(static_cast<uint16_t>(port));
  sa.sin6_addr = in6addr_any;
  if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind mesh data port ", port));
  }
  if (::listen(listen_fd_.get(), 128) != 0) return ErrnoStatus(errno, "listen on the mesh data port");
  socklen_t slen = sizeof(sa);
  ::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&sa), &slen);
  port_ = ntohs(sa.sin6_port);
  return absl::OkStatus();
}

void TcpDataServer::Start() {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void TcpDataServer::Stop() {
  stopping_.store(true, std::memory_order_release);
  if (listen_fd_.valid()) ::shutdown(listen_fd_.get(), SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
}

TcpDataServer::Counts TcpDataServer::counts() const {
  return Counts{.refused_frames = refused_frames_.load(std::memory_order_relaxed),
                .idle_closed = idle_closed_.load(std::memory_order_relaxed),
                .late_slices_dropped = late_slices_dropped_.load(std::memory_order_relaxed),
                .duplicate_notifies = duplicate_notifies_.load(std::memory_order_relaxed)};
}

void TcpDataServer::AcceptLoop() {
  for (;;) {
    sockaddr_storage from{};
    socklen_t from_len = sizeof(from);
    int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_.load(std::memory_order_acquire)) return;
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      DataLog()->error("event=mesh_accept_failed error={}", LogQuoted(std::strerror(errno)));
      return;
    }
    auto conn = std::make_shared<UniqueFd>(fd);
    std::optional<DataAdmission::Pending> pending =
        stopping_.load(std::memory_order_acquire) ? std::nullopt : admission_.Admit(fd, SourceAddress(from));
    if (!pending.has_value()) continue;  // closed: over the bound
    std::thread([this, conn, p = *std::move(pending)] {
      ServeConnection(conn->get(), p);
      admission_.Closed(conn->get(), [&] { conn->Reset(); });
    }).detach();
  }
}

void TcpDataServer::ServeConnection(int fd, const DataAdmission::Pending& pending) {
  // Nothing but AUTH, whole, within 2 s; a stranger gets no answer at all.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  FrameHeader h;
  std::string cookie(kCookieBytes, '\0');
  bool ok = ReadFullBefore(fd, &h, sizeof(h), deadline).ok() && h.magic == kFrameMagic &&
            h.type == static_cast<uint16_t>(FrameType::kAuth) && h.length == kCookieBytes &&
            ReadFullBefore(fd, cookie.data(), cookie.size(), deadline).ok();
  const uint64_t link_instance = h.grant;
  absl::StatusOr<std::string> authenticated = admission_.Authenticate(pending, ok ? &cookie : nullptr);
  if (!authenticated.ok()) return;
  const std::string node = *std::move(authenticated);
  TuneDataSocket(fd, options_.io_timeout);
  // A write that makes no progress for the io_timeout cuts the peer: one
  // that stopped reading holds this thread no longer than that.
  const timeval send_timeout = absl::ToTimeval(options_.io_timeout);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  DataLog()->info("event=mesh_data_connection peer={}", node);
  ServeFrames(fd, node, link_instance);
  // Seen before its connection stops counting, so the idle sweep (which
  // looks at both) never finds it neither connected nor seen.
  owner_.ended(node);
  admission_.Disconnected(node);
}

void TcpDataServer::ServeFrames(int fd, const std::string& node, uint64_t link_instance) {
  auto writer = std::make_shared<ConnWriter>(fd);
  // Completions of forwarded requests write nothing after this returns.
  struct CloseOnExit {
    ConnWriter* w;
    ~CloseOnExit() { w->Close(); }
  } close_on_exit{writer.get()};
  FrameHeader h;
  auto refuse = [&](const char* why) {
    ++refused_frames_;
    DataLog()->warn("event=mesh_protocol_error peer={} reason=\"{}\" type={}", node, why, h.type);
  };
  for (;;) {
    if (!writer->Flush().ok()) return;
    // Idle connections go: a peer cannot keep slots it does not use.
    // Answers of forwarded requests wake this thread to write them.
    pollfd pfd[2] = {{fd, POLLIN, 0}, {writer->wake_fd(), POLLIN, 0}};
    int ready;
    do {
      ready = ::poll(pfd, 2, static_cast<int>(absl::ToInt64Milliseconds(options_.idle_timeout)));
    } while (ready < 0 && errno == EINTR);
    if (ready > 0 && (pfd[1].revents & POLLIN) != 0) writer->Drain();
    if (ready > 0 && (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;  // answers to write
    if (ready == 0) {
      ++idle_closed_;
      DataLog()->info("event=mesh_data_idle peer={} idle_seconds={}", node,
                      absl::ToInt64Seconds(options_.idle_timeout));
      return;
    }
    if (!ReadFull(fd, &h, sizeof(h)).ok()) return;
    if (h.magic != kFrameMagic || h.flags != 0) return refuse("bad magic or flags");
    auto type = static_cast<FrameType>(h.type);
    if ((type == FrameType::kWrite || type == FrameType::kRead) && h.length > kMaxFramePayload) {
      return refuse("length over the frame cap");
    }
    if ((type == FrameType::kNotify || type == FrameType::kDone) && h.length != 0) {
      return refuse("notify or done with payload");
    }
    if (type != FrameType::kWrite && type != FrameType::kRead && type != FrameType::kNotify &&
        type != FrameType::kDone) {
      return refuse("unexpected frame type");
    }
    const LateCopies::Key key{node, link_instance, TransferOfTag(h.tag)};
    if (type == FrameType::kDone) {
      late_copies_.Finish(key);
      // Writes of this transfer already past the check finish first.
      if (!late_copies_.AwaitWrites(key, 2 * options_.io_timeout)) return refuse("DONE while writes still hang");
      if (!writer->Ack(h.tag, absl::OkStatus()).ok()) return;
      continue;
    }
    // A write of an unfinished transfer is registered before its bytes land,
    // so a DONE for the transfer waits for it (BeginWrite and Finished are
    // one decision under the lock).
    const bool late = type == FrameType::kWrite ? !late_copies_.BeginWrite(key)
                                                : type == FrameType::kNotify && late_copies_.Finished(key);
    if (late) {
      // A late copy (its connection failed after the slice went out again)
      // of a finished transfer, or a notification already delivered.
      ++(type == FrameType::kWrite ? late_slices_dropped_ : duplicate_notifies_);
      absl::Status io = type == FrameType::kWrite ? Discard(fd, h.length) : absl::OkStatus();
      if (io.ok()) io = writer->Ack(h.tag, absl::OkStatus());
      if (!io.ok()) return;
      continue;
    }
    if (!owner_.serve(writer, fd, h, node, link_instance).ok()) return;
  }
}

}  // namespace podlink::mesh
