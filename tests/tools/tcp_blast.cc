// Raw TCP throughput, the baseline the mesh's links are measured against
// (tests/mesh/bench.sh): what the same cable carries with no podlink at all.
//
//   tcp_blast serve <port> <connections>        prints one JSON line when they all closed
//   tcp_blast send <ipv4> <port> <bytes> <connections>
//
// The sender splits `bytes` over the connections and writes from one buffer;
// the receiver reads and discards. Both report bytes, seconds and Gbit/s.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

int Usage() {
  std::fprintf(stderr, "usage: tcp_blast serve <port> <connections> | send <ipv4> <port> <bytes> <connections>\n");
  return 2;
}

void Report(const char* role, unsigned long long bytes, double seconds) {
  std::printf("{\"role\": \"%s\", \"bytes\": %llu, \"seconds\": %.6f, \"gbit_per_s\": %.6f}\n", role, bytes, seconds,
              seconds > 0 ? bytes * 8 / seconds / 1e9 : 0.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  std::string mode = argv[1];
  if (mode == "serve" && argc == 4) {
    int port = std::atoi(argv[2]), conns = std::atoi(argv[3]);
    int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(ls, 64) != 0) {
      std::perror("tcp_blast: listen");
      return 1;
    }
    std::vector<std::thread> readers;
    std::vector<unsigned long long> got(conns, 0);
    std::chrono::steady_clock::time_point first{};
    for (int i = 0; i < conns; ++i) {
      int fd = ::accept(ls, nullptr, nullptr);
      if (fd < 0) return 1;
      if (i == 0) first = std::chrono::steady_clock::now();
      readers.emplace_back([fd, &got, i] {
        std::vector<char> buf(1 << 20);
        for (;;) {
          ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
          if (n <= 0) break;
          got[i] += static_cast<unsigned long long>(n);
        }
        ::close(fd);
      });
    }
    for (auto& t : readers) t.join();
    unsigned long long total = 0;
    for (auto g : got) total += g;
    Report("receiver", total, std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count());
    return 0;
  }
  if (mode == "send" && argc == 6) {
    unsigned long long bytes = std::strtoull(argv[4], nullptr, 10);
    int port = std::atoi(argv[3]), conns = std::atoi(argv[5]);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    if (::inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1 || conns < 1) return Usage();
    std::vector<int> fds;
    for (int i = 0; i < conns; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
        std::perror("tcp_blast: connect");
        return 1;
      }
      fds.push_back(fd);
    }
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> writers;
    for (int i = 0; i < conns; ++i) {
      unsigned long long share = bytes / conns + (i == 0 ? bytes % conns : 0);
      writers.emplace_back([fd = fds[i], share] {
        std::vector<char> buf(1 << 20, 'x');
        unsigned long long left = share;
        while (left > 0) {
          ssize_t n = ::send(fd, buf.data(), std::min<unsigned long long>(left, buf.size()), MSG_NOSIGNAL);
          if (n <= 0) break;
          left -= static_cast<unsigned long long>(n);
        }
        ::shutdown(fd, SHUT_WR);
        char c;
        while (::recv(fd, &c, 1, 0) > 0) {
        }
        ::close(fd);
      });
    }
    for (auto& t : writers) t.join();
    Report("sender", bytes, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return 0;
  }
  return Usage();
}
