// Serves the descriptor channel: accepts clients on a SOCK_SEQPACKET Unix
// socket, opens a broker session per connection, receives OFFERs and closes
// sessions on hang-up or protocol violations. One epoll thread; a busy
// client gets a bounded number of messages per wake-up so none starves.
#pragma once

#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "daemon/broker/broker.h"

namespace podlink {

class FdServer {
 public:
  // Binds `path` (mode 0666: authorization is by kernel identity, not by
  // file permissions) and starts the thread.
  static absl::StatusOr<std::unique_ptr<FdServer>> Start(Broker* broker, const std::string& path);
  ~FdServer();  // stops the thread and closes every session

  void Stop();

 private:
  FdServer(Broker* broker, UniqueFd listen, UniqueFd epoll, UniqueFd wake, std::string path);
  void Run();
  void Accept();
  void Drain(uint64_t session_id);

  Broker* const broker_;
  UniqueFd listen_;
  UniqueFd epoll_;
  UniqueFd wake_;
  const std::string path_;
  std::thread thread_;
  // Owned by the epoll thread only.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions_;
};

}  // namespace podlink
