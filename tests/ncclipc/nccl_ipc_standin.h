// A stand-in for NCCL's IPC socket protocol, written from its behaviour in
// NCCL 2.19-2.29 (src/misc/ipcsocket.cc and the proxy's UDS service): abstract
// datagram sockets named "\0tmp/nccl-socket-<rank>-<hex>" over the whole
// 108-byte sun_path, a request header naming the asker's (rank, opId), the
// answer's descriptor sent with SCM_RIGHTS to "<rank>-<opId>". Used by the
// bridge test's peers and the NCCL plugin's native-mode test.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace nccl_standin {

// NCCL's request header (proxy.h, ncclIpcHdr), as far as the stand-in needs it.
struct IpcHdr {
  int type;
  int rank;
  int req_size;
  int resp_size;
  void* op_id;
  uint64_t data[16];
};

// A socket bound as NCCL binds (-errno on failure).
inline int Bind(int rank, uint64_t hash) {
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "/tmp/nccl-socket-%d-%lx", rank, static_cast<unsigned long>(hash));
  a.sun_path[0] = '\0';
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

inline int SendTo(int sock, int rank, uint64_t hash, const void* data, size_t len, int fd) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "/tmp/nccl-socket-%d-%lx", rank, static_cast<unsigned long>(hash));
  a.sun_path[0] = '\0';
  iovec iov{const_cast<void*>(data), len};
  msghdr m{};
  m.msg_name = &a;
  m.msg_namelen = sizeof(a);
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char c[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    m.msg_control = c;
    m.msg_controllen = sizeof(c);
    cmsghdr* h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(h), &fd, sizeof(int));
  }
  return ::sendmsg(sock, &m, MSG_DONTWAIT) < 0 ? errno : 0;
}

// Receives one datagram (with at most one descriptor) within `ms`.
inline ssize_t Recv(int sock, void* buf, size_t len, int* fd, int ms) {
  pollfd p{sock, POLLIN, 0};
  if (::poll(&p, 1, ms) != 1) return -ETIMEDOUT;
  iovec iov{buf, len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char c[CMSG_SPACE(sizeof(int))];
  m.msg_control = c;
  m.msg_controllen = sizeof(c);
  ssize_t n = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  *fd = -1;
  if (n >= 0) {
    cmsghdr* h = CMSG_FIRSTHDR(&m);
    if (h != nullptr && h->cmsg_type == SCM_RIGHTS) std::memcpy(fd, CMSG_DATA(h), sizeof(int));
  }
  return n < 0 ? -errno : n;
}

inline const char* KindOf(int fd) {
  if (fd < 0) return "none";
  struct stat st {};
  ::fstat(fd, &st);
  if (S_ISSOCK(st.st_mode)) return "socket";
  if (S_ISREG(st.st_mode) && st.st_size == 0 && (::fcntl(fd, F_GET_SEALS) & F_SEAL_WRITE) != 0) return "placeholder";
  if (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)) return "memory";
  return "other";
}

// What a proxy does with one request that arrived on `sock`: answers the
// asker with a memfd holding `text`. Returns the kind of descriptor the
// request carried ("" when nothing arrived within `ms`); *rank gets the
// asker's rank.
inline std::string ServeOne(int sock, int my_rank, const std::string& text, int ms, int* rank = nullptr) {
  IpcHdr h{};
  int fd = -1;
  ssize_t n = Recv(sock, &h, sizeof(h), &fd, ms);
  if (n < 0) return "";
  std::string kind = KindOf(fd);
  if (fd >= 0) ::close(fd);
  if (rank != nullptr) *rank = h.rank;
  uint64_t op = reinterpret_cast<uint64_t>(h.op_id);
  int mem = ::memfd_create("answer", MFD_CLOEXEC);
  (void)!::write(mem, text.data(), text.size());
  int out = Bind(my_rank, op ^ 1);
  char dummy = 0;
  if (out >= 0) SendTo(out, h.rank, op, &dummy, 1, mem), ::close(out);
  ::close(mem);
  return kind;
}

// What a rank does to get a peer's descriptor: binds "<rank>-<opId>", sends
// the request (with `send_fd`: "socket" its own socket as NCCL does, "pipe",
// "none") and waits up to 5 s. "answer TEXT" or "error ERRNO".
inline std::string Request(int rank, int peer_rank, uint64_t peer_hash, const std::string& send_fd = "socket") {
  uint64_t op = 0;
  (void)!::getrandom(&op, sizeof(op), 0);
  op &= ~uint64_t{1};
  int sock = Bind(rank, op);
  if (sock < 0) return "error bind " + std::to_string(-sock);
  int fds[2] = {-1, -1};
  int fd = sock;
  if (send_fd == "pipe") {
    (void)!::pipe2(fds, O_CLOEXEC);
    fd = fds[0];
  } else if (send_fd == "none") {
    fd = -1;
  }
  IpcHdr h{};
  h.type = 1;
  h.rank = rank;
  h.op_id = reinterpret_cast<void*>(op);
  std::string out;
  int err = SendTo(sock, peer_rank, peer_hash, &h, sizeof(h), fd);
  if (err != 0) {
    out = "error " + std::to_string(err);
  } else {
    char buf[8];
    int got = -1;
    ssize_t n = Recv(sock, buf, sizeof(buf), &got, 5000);
    if (n < 0) {
      out = "error " + std::to_string(-n);
    } else if (got < 0) {
      out = "error nofd";
    } else {
      char text[64] = {};
      ssize_t t = ::pread(got, text, sizeof(text) - 1, 0);
      out = std::string("answer ") + (t > 0 ? text : "");
      ::close(got);
    }
  }
  ::close(sock);
  if (fds[0] >= 0) ::close(fds[0]), ::close(fds[1]);
  return out;
}

}  // namespace nccl_standin
