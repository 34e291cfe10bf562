// Serves the descriptor channel: accepts clients on a SOCK_SEQPACKET Unix
// socket, opens a broker session per connection, receives OFFERs and closes
// sessions on hang-up or protocol violations. One epoll thread; a busy
// client gets a bounded number of messages per wake-up so none starves.
//
// A new client whose pod the pod source knows (or refuses) at once is opened
// on the epoll thread. One it must ask the container runtime about waits for
// one of a few opener threads, so a slow or stopped runtime never delays the
// descriptor traffic of other sessions or the clients of known pods. One pod
// occupies at most one opener at a time; clients waiting for an opener are
// bounded in all and per pod, and beyond that refused with RESOURCE_EXHAUSTED.
#pragma once

#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
  FdServer(Broker* broker, UniqueFd listen, UniqueFd epoll, UniqueFd wake, UniqueFd opened_wake, std::string path);
  struct Waiting {
    UniqueFd sock;
    PeerIdentity peer;
  };
  void Run();
  void Accept();
  void Drain(uint64_t session_id);
  void Register(absl::StatusOr<std::shared_ptr<Session>> s);  // epoll thread
  void RegisterOpened();                                      // epoll thread
  void Opener();

  Broker* const broker_;
  UniqueFd listen_;
  UniqueFd epoll_;
  UniqueFd wake_;
  UniqueFd opened_wake_;  // an opener finished a session
  const std::string path_;
  std::thread thread_;
  std::vector<std::thread> openers_;
  // Owned by the epoll thread only.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions_;

  absl::Mutex open_mu_;
  absl::CondVar open_cv_;
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(open_mu_);
  std::map<std::string, size_t> waiting_per_pod_ ABSL_GUARDED_BY(open_mu_);
  std::set<std::string> resolving_ ABSL_GUARDED_BY(open_mu_);  // pods an opener is resolving
  std::vector<std::shared_ptr<Session>> opened_ ABSL_GUARDED_BY(open_mu_);
  bool stopping_ ABSL_GUARDED_BY(open_mu_) = false;
};

}  // namespace podlink
