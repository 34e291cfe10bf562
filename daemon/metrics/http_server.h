// A minimal HTTP/1.0 server for /metrics, /healthz and /readyz: GET only,
// one short-lived thread per connection (at most 16 at once), a 2-second
// read deadline so a silent client cannot hold a slot, Connection: close.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace podlink {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// "host:port" with an IPv4 host (empty: 0.0.0.0) and a port in 0..65535.
absl::StatusOr<sockaddr_in> ParseHttpAddress(const std::string& addr);

// GET `path` from the server at `addr` (0.0.0.0 means this host) over
// HTTP/1.0: OK when it answers 200, otherwise an error saying why (bad
// address, no answer, the status line). Each step bounded by 3 seconds.
// podlinkd --probe uses it for the DaemonSet's exec probes.
absl::Status ProbeHttp(const std::string& addr, const std::string& path);

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const std::string& path)>;
  // `addr` is "host:port" (port 0 picks one). Returns once listening.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& addr, Handler handler);
  ~HttpServer();
  int port() const { return port_; }

 private:
  HttpServer(UniqueFd listen, UniqueFd wake, int port, Handler handler);
  void Run();
  void Serve(int fd);

  UniqueFd listen_, wake_;
  const int port_;
  Handler handler_;
  std::thread thread_;
  std::atomic<int> active_{0};
};

}  // namespace podlink
