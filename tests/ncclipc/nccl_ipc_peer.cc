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

#include "tests/ncclipc/nccl_ipc_standin.h"

using namespace nccl_standin;

namespace {

void Ready() {
  std::printf("ready %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
}

int Proxy(int rank, uint64_t hash) {
  int sock = Bind(rank, hash);
  if (sock < 0) return 3;
  Ready();
  const std::string text = "podlink-" + std::to_string(hash);
  pollfd p[2] = {{sock, POLLIN, 0}, {0, POLLIN, 0}};
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
      int asker = -1;
      std::string kind = ServeOne(sock, rank, text, 0, &asker);
      if (kind.empty()) continue;
      std::printf("request rank=%d fd=%s\n", asker, kind.c_str());
      std::fflush(stdout);
    }
  }
}

int Client(int rank, int peer_rank, uint64_t peer_hash) {
  Ready();
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.rfind("go", 0) == 0) {
      std::printf("%s\n", Request(rank, peer_rank, peer_hash, line.size() > 3 ? line.substr(3) : "socket").c_str());
      std::fflush(stdout);
    } else if (line == "big" || line == "twofds") {
      // Hostile datagrams to the peer's proxy name: 5000 bytes (over the
      // bridge's 4 KiB), or a header with two descriptors.
      int sock = Bind(rank, 0xbad0);
      std::string data(line == "big" ? 5000 : sizeof(IpcHdr), 'x');
      int err = 0;
      if (line == "big") {
        err = SendTo(sock, peer_rank, peer_hash, data.data(), data.size(), -1);
      } else {
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::snprintf(a.sun_path, sizeof(a.sun_path), "/tmp/nccl-socket-%d-%lx", peer_rank,
                      static_cast<unsigned long>(peer_hash));
        a.sun_path[0] = '\0';
        int fds[2] = {::memfd_create("a", MFD_CLOEXEC), ::memfd_create("b", MFD_CLOEXEC)};
        iovec iov{data.data(), data.size()};
        alignas(cmsghdr) char c[CMSG_SPACE(2 * sizeof(int))] = {};
        msghdr m{};
        m.msg_name = &a;
        m.msg_namelen = sizeof(a);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = c;
        m.msg_controllen = sizeof(c);
        cmsghdr* h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET;
        h->cmsg_type = SCM_RIGHTS;
        h->cmsg_len = CMSG_LEN(2 * sizeof(int));
        std::memcpy(CMSG_DATA(h), fds, sizeof(fds));
        err = ::sendmsg(sock, &m, 0) < 0 ? errno : 0;
        ::close(fds[0]), ::close(fds[1]);
      }
      ::close(sock);
      std::printf("sent %d\n", err);
      std::fflush(stdout);
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
  for (int i = 0; i < count; ++i) {
    socks.push_back(Bind(rank, 0x1000 + i));
    if (socks.back() < 0) return 3;
  }
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
