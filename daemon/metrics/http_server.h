// A minimal HTTP/1.0 server for /metrics, /healthz and /readyz: GET only,
// one short-lived thread per connection (at most 16 at once), a 2-second
// read deadline so a silent client cannot hold a slot, Connection: close.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace podlink {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

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
