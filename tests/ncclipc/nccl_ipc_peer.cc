// A stand-in for NCCL's IPC socket protocol (written from its behaviour in
// NCCL 2.19-2.29, src/misc/ipcsocket.cc and the proxy's UDS service), run in
// a network namespace of its own like a pod. Lines on stdout tell the test
// what happened; lines on stdin drive it.
//
//   nccl_ipc_peer proxy RANK HASH
//     binds "\0tmp/nccl-socket-RANK-HASH" (the whole 108-byte sun_path, as
//     NCCL does), prints "ready PID", then answers each request: the header's
//     (rank, opId) name gets, from a socket bound to RANK-(opId^1), a memfd
//     holding "podlink-HASH"; prints "request rank=R fd=KIND" (KIND: none,
//     socket, placeholder, memory). "close" on stdin closes the socket and
//     prints "closed"; EOF ends it.
//   nccl_ipc_peer client RANK PEER_RANK PEER_HASH
//     prints "ready PID"; each "go [FDKIND]" line on stdin (socket: its own
//     socket, as NCCL sends; pipe; none) binds "\0tmp/nccl-socket-RANK-<opId>",
//     sends the request and prints "answer TEXT" with the memfd's bytes, or
//     "error ERRNO" (5 s at most for the answer). "flood N" sends N requests
//     without waiting and prints "flooded SENT".
//   nccl_ipc_peer names RANK COUNT
//     binds COUNT NCCL names, prints "ready PID", waits for EOF.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

// NCCL's request header (proxy.h, ncclIpcHdr), as far as the stand-in needs it.
struct IpcHdr {
  int type;
  int rank;
  int req_size;
  int resp_size;
  void* op_id;
  uint64_t data[16];
};

int Bind(int rank, uint64_t hash) {
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "/tmp/nccl-socket-%d-%lx", rank, static_cast<unsigned long>(hash));
  a.sun_path[0] = '\0';
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::printf("error bind %d\n", errno);
    std::fflush(stdout);
    std::exit(3);
  }
  return fd;
}

int SendTo(int sock, int rank, uint64_t hash, const void* data, size_t len, int fd) {
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
ssize_t Recv(int sock, void* buf, size_t len, int* fd, int ms) {
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

const char* KindOf(int fd) {
  if (fd < 0) return "none";
  struct stat st {};
  ::fstat(fd, &st);
  if (S_ISSOCK(st.st_mode)) return "socket";
  if (S_ISREG(st.st_mode) && st.st_size == 0 && (::fcntl(fd, F_GET_SEALS) & F_SEAL_WRITE) != 0) return "placeholder";
  if (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)) return "memory";
  return "other";
}

void Ready() {
  std::printf("ready %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
}

int Proxy(int rank, uint64_t hash) {
  int sock = Bind(rank, hash);
  Ready();
  pollfd p[2] = {{sock, POLLIN, 0}, {0, POLLIN, 0}};
  std::string line;
  for (;;) {
    if (::poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) {
      char buf[256];
      ssize_t n = ::read(0, buf, sizeof(buf));
      if (n <= 0) return 0;
      if (std::string(buf, n).rfind("close", 0) == 0 && sock >= 0) {
        ::close(sock);
        sock = -1;
        p[0].fd = -1;
        std::printf("closed\n");
        std::fflush(stdout);
      }
    }
    if (sock >= 0 && (p[0].revents & POLLIN) != 0) {
      IpcHdr h{};
      int fd = -1;
      ssize_t n = Recv(sock, &h, sizeof(h), &fd, 0);
      if (n < 0) continue;
      std::printf("request rank=%d fd=%s\n", h.rank, KindOf(fd));
      std::fflush(stdout);
      if (fd >= 0) ::close(fd);
      uint64_t op = reinterpret_cast<uint64_t>(h.op_id);
      int mem = ::memfd_create("answer", MFD_CLOEXEC);
      std::string text = "podlink-" + std::to_string(hash);
      (void)!::write(mem, text.data(), text.size());
      int out = Bind(rank, op ^ 1);
      char dummy = 0;
      SendTo(out, h.rank, op, &dummy, 1, mem);
      ::close(out);
      ::close(mem);
    }
  }
}

int Client(int rank, int peer_rank, uint64_t peer_hash) {
  Ready();
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.rfind("go", 0) == 0) {
      std::string kind = line.size() > 3 ? line.substr(3) : "socket";
      uint64_t op = 0;
      (void)!::getrandom(&op, sizeof(op), 0);
      op &= ~uint64_t{1};
      int sock = Bind(rank, op);
      int fds[2] = {-1, -1};
      int send_fd = sock;
      if (kind == "pipe") {
        (void)!::pipe2(fds, O_CLOEXEC);
        send_fd = fds[0];
      } else if (kind == "none") {
        send_fd = -1;
      }
      IpcHdr h{};
      h.type = 1;
      h.rank = rank;
      h.op_id = reinterpret_cast<void*>(op);
      int err = SendTo(sock, peer_rank, peer_hash, &h, sizeof(h), send_fd);
      if (err != 0) {
        std::printf("error %d\n", err);
      } else {
        char buf[8];
        int fd = -1;
        ssize_t n = Recv(sock, buf, sizeof(buf), &fd, 5000);
        if (n < 0) {
          std::printf("error %d\n", static_cast<int>(-n));
        } else if (fd < 0) {
          std::printf("error nofd\n");
        } else {
          char text[64] = {};
          ssize_t t = ::pread(fd, text, sizeof(text) - 1, 0);
          std::printf("answer %s\n", t > 0 ? text : "");
          ::close(fd);
        }
      }
      std::fflush(stdout);
      ::close(sock);
      if (fds[0] >= 0) ::close(fds[0]), ::close(fds[1]);
    } else if (line.rfind("flood ", 0) == 0) {
      long n = std::strtol(line.c_str() + 6, nullptr, 10), sent = 0;
      int sock = Bind(rank, 0xf100d);
      IpcHdr h{};
      h.rank = rank;
      h.op_id = reinterpret_cast<void*>(uint64_t{0xf100c});
      for (long i = 0; i < n; ++i) {
        if (SendTo(sock, peer_rank, peer_hash, &h, sizeof(h), sock) == 0) ++sent;
      }
      ::close(sock);
      std::printf("flooded %ld\n", sent);
      std::fflush(stdout);
    }
  }
  return 0;
}

int Names(int rank, int count) {
  std::vector<int> socks;
  for (int i = 0; i < count; ++i) socks.push_back(Bind(rank, 0x1000 + i));
  Ready();
  char buf[64];
  while (::read(0, buf, sizeof(buf)) > 0) {
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (::unshare(CLONE_NEWNET) != 0) {
    std::printf("error unshare %d\n", errno);
    return 2;
  }
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "proxy" && argc == 4) return Proxy(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 16));
  if (mode == "client" && argc == 5) {
    return Client(std::atoi(argv[2]), std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 16));
  }
  if (mode == "names" && argc == 4) return Names(std::atoi(argv[2]), std::atoi(argv[3]));
  std::fprintf(stderr, "usage: nccl_ipc_peer proxy RANK HASH | client RANK PEER_RANK PEER_HASH | names RANK COUNT\n");
  return 2;
}
