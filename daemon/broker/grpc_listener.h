// Accepts connections to podlinkd's gRPC socket itself and hands each one to
// the gRPC server (AddInsecureChannelFromFd), because gRPC 1.51 has no limit
// on incoming connections: a client could hold thousands of idle ones, each
// an fd and buffers in podlinkd. Here each connection is identified by the
// kernel (as descriptor-channel sessions are) and counted per identity key
// (pod, or uid+cgroup outside pods) and in all; over either limit it is
// closed at once. A connection stays counted until the client closes it or
// gRPC shuts it down: the listener keeps a duplicate of each accepted socket
// in an epoll set and waits for its hang-up.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "daemon/identity/cgroup_parser.h"

namespace grpc {
class Server;
}

namespace podlink {

struct GrpcListenerOptions {
  size_t max_connections = 2048;       // in all
  size_t max_connections_per_pod = 64;  // per identity key
  CgroupLayout cgroup_layout;
};

class GrpcListener {
 public:
  // Binds `path` (mode 0666) and starts accepting for `server`, which must
  // have been built and started without listening ports and must outlive
  // the listener.
  static absl::StatusOr<std::unique_ptr<GrpcListener>> Start(grpc::Server* server, const std::string& path,
                                                             const GrpcListenerOptions& options);
  ~GrpcListener();  // Stop()
  // Stops accepting (connections already handed to gRPC stay with it).
  void Stop();

  size_t connections() const { return open_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  // Prometheus text for the two numbers above.
  std::string RenderMetrics() const;

 private:
  struct Conn {
    UniqueFd watch;   // duplicate of the socket gRPC owns: hangs up with it
    std::string key;  // identity key it is counted under
  };
  GrpcListener(grpc::Server* server, UniqueFd listen, UniqueFd epoll, UniqueFd wake, std::string path,
               GrpcListenerOptions options);
  void Run();
  void Accept();
  void Closed(uint64_t id);

  grpc::Server* const server_;
  UniqueFd listen_, epoll_, wake_;
  const std::string path_;
  const GrpcListenerOptions options_;
  std::thread thread_;
  // Owned by the listener thread.
  absl::flat_hash_map<uint64_t, Conn> conns_;
  absl::flat_hash_map<std::string, size_t> per_key_;
  uint64_t next_id_ = 2;  // 0 and 1 are the listening socket and the wake-up eventfd
  int64_t last_refusal_log_ = 0;
  std::atomic<size_t> open_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace podlink
