#include "daemon/metrics/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_util.h"

namespace podlink {
namespace {

constexpr int kMaxActive = 16;
constexpr int kReadDeadlineMs = 2000;
constexpr size_t kMaxRequest = 8192;

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<sockaddr_in> ParseHttpAddress(const std::string& addr) {
  std::vector<std::string> hp = absl::StrSplit(addr, absl::MaxSplits(':', 1));
  int port = 0;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &port) || port < 0 || port > 65535 ||
      ::inet_pton(AF_INET, hp[0].empty() ? "0.0.0.0" : hp[0].c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", addr, "' is not IPv4-host:port"));
  }
  sa.sin_port = htons(static_cast<uint16_t>(port));
  return sa;
}

absl::Status ProbeHttp(const std::string& addr, const std::string& path) {
  PODLINK_ASSIGN_OR_RETURN(sockaddr_in sa, ParseHttpAddress(addr));
  if (sa.sin_port == 0) return absl::InvalidArgumentError(absl::StrCat("port 0 of '", addr, "' cannot be probed"));
  if (sa.sin_addr.s_addr == htonl(INADDR_ANY)) sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus(errno, "socket");
  timeval tv{3, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n");
  char buf[256] = {};
  ssize_t n = -1;
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      ::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    n = ::recv(fd.get(), buf, sizeof(buf) - 1, 0);
  }
  if (n <= 0) {
    return absl::UnavailableError(
        absl::StrCat("no answer from ", addr, ": ", n == 0 ? "connection closed" : std::strerror(errno)));
  }
  std::string status(buf, std::strcspn(buf, "\r\n"));
  if (absl::StartsWith(status, "HTTP/1.") && status.size() >= 12 && status.substr(9, 3) == "200") {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(path, " answered \"", status, "\""));
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& addr, Handler handler) {
  PODLINK_ASSIGN_OR_RETURN(sockaddr_in sa, ParseHttpAddress(addr));
  UniqueFd ls(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!ls) return ErrnoStatus(errno, "socket");
  int one = 1;
  ::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(ls.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("bind metrics address ", addr));
  }
  if (::listen(ls.get(), 64) != 0) return ErrnoStatus(errno, "listen");
  socklen_t len = sizeof(sa);
  ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  std::unique_ptr<HttpServer> s(new HttpServer(std::move(ls), std::move(wake), ntohs(sa.sin_port), std::move(handler)));
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

HttpServer::HttpServer(UniqueFd listen, UniqueFd wake, int port, Handler handler)
    : listen_(std::move(listen)), wake_(std::move(wake)), port_(port), handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  thread_.join();
  // Connection threads are detached; each ends within the read deadline.
  for (int i = 0; i < 300 && active_.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void HttpServer::Run() {
  for (;;) {
    pollfd p[2] = {{listen_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents) return;
    if (!(p[0].revents & POLLIN)) continue;
    int c = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    if (active_.load() >= kMaxActive) {
      WriteAll(c, "HTTP/1.0 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
      ::close(c);
      continue;
    }
    ++active_;
    std::thread([this, c] {
      Serve(c);
      ::close(c);
      --active_;
    }).detach();
  }
}

void HttpServer::Serve(int fd) {
  std::string req;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReadDeadlineMs);
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0) return;  // silent or slow client: drop it
    char buf[1024];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
    if (req.size() > kMaxRequest) break;
  }
  HttpResponse resp;
  std::vector<std::string> first = absl::StrSplit(req.substr(0, req.find('\n')), ' ', absl::SkipEmpty());
  if (req.size() > kMaxRequest || first.size() < 2) {
    resp = {400, "text/plain; charset=utf-8", "malformed request\n"};
  } else if (first[0] != "GET") {
    resp = {405, "text/plain; charset=utf-8", "only GET\n"};
  } else {
    std::string path = first[1].substr(0, first[1].find('?'));
    resp = handler_(path);
  }
  WriteAll(fd, absl::StrCat("HTTP/1.0 ", resp.status, " ", Reason(resp.status), "\r\nContent-Type: ",
                            resp.content_type, "\r\nContent-Length: ", resp.body.size(),
                            "\r\nConnection: close\r\n\r\n", resp.body));
}

}  // namespace podlink
