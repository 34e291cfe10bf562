// The kubelet device plugin for `podlink.io/peer`: many shareable virtual
// devices whose allocation mounts podlinkd's socket directory and the client
// library into a container and sets its environment. Serves its socket in the
// kubelet's device-plugin directory, registers with kubelet.sock, streams
// ListAndWatch with health that can go bad and recover, and serves and
// registers again when a restarting kubelet removes its socket or recreates
// kubelet.sock. It only translates; the health check and the allocation
// contents come from outside.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"

namespace podlink {

struct DevicePluginConfig {
  std::string dir = "/var/lib/kubelet/device-plugins";
  std::string resource = "podlink.io/peer";
  std::string endpoint = "podlink.sock";  // file name inside `dir`
  int devices = 64;                       // how many containers on the node may hold one at once
  std::string host_socket_dir = "/run/podlink";
  std::string container_socket_dir = "/run/podlink";
  std::string host_lib_dir = "/var/lib/podlink/lib";
  std::string container_lib_dir = "/usr/local/podlink/lib";
  absl::Duration check_interval = absl::Seconds(1);
  // A refused or failed registration is retried after this, doubling up to
  // the cap; a kubelet that comes back (new kubelet.sock) is tried at once.
  absl::Duration register_backoff = absl::Seconds(1);
  absl::Duration register_backoff_max = absl::Seconds(60);
  // The kubelet dials the plugin's socket back (10 s) before it answers
  // Register, so Register waits longer than that.
  absl::Duration register_timeout = absl::Seconds(15);
  // Device nodes added to every allocation (direct mode: every GPU's
  // /dev/nvidiaN, so the container can map peers' memory itself).
  std::vector<std::string> device_nodes;
};

class DevicePluginService;

class DevicePlugin {
 public:
  // true when healthy; otherwise `why` says what is wrong.
  using HealthCheck = std::function<bool(std::string* why)>;

  static absl::StatusOr<std::unique_ptr<DevicePlugin>> Start(DevicePluginConfig config, HealthCheck health);
  ~DevicePlugin();

  int registrations() const { return registrations_.load(); }
  bool healthy() const { return healthy_.load(); }
  const std::string& resource() const { return config_.resource; }

  // Whether the kubelet accepted the last registration; if not, why, and
  // how many attempts failed in all.
  struct RegistrationState {
    bool registered = false;
    std::string last_error;
    uint64_t failures = 0;
  };
  RegistrationState registration() const ABSL_LOCKS_EXCLUDED(state_mu_);

  // Translations, public for the service and for tests.
  v1beta1::ListAndWatchResponse DeviceList() const;
  absl::StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& req) const;
  v1beta1::PreferredAllocationResponse Preferred(const v1beta1::PreferredAllocationRequest& req) const;

 private:
  explicit DevicePlugin(DevicePluginConfig config, HealthCheck health);
  absl::Status Serve() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Register();
  void Watch();
  std::string SocketPath() const { return config_.dir + "/" + config_.endpoint; }

  const DevicePluginConfig config_;
  const HealthCheck health_;
  std::unique_ptr<DevicePluginService> service_;
  absl::Mutex mu_;  // guards the server
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(mu_);
  // A socket file's identity: inode and change time (an inode number alone
  // can come back when a file is removed and created again).
  struct FileId {
    ino_t ino = 0;
    int64_t ctime_ns = 0;
    bool operator==(const FileId&) const = default;
    bool exists() const { return ino != 0; }
  };
  static FileId IdOf(const std::string& path);
  FileId socket_id_;   // our socket as served (watch thread only)
  FileId kubelet_id_;  // kubelet.sock when we last registered (watch thread only)
  bool registered_ = false;  // watch thread only
  FileId attempted_kubelet_;      // kubelet.sock at the last attempt (watch thread only)
  absl::Time next_attempt_ = absl::InfinitePast();  // watch thread only
  absl::Duration backoff_;                          // watch thread only
  mutable absl::Mutex state_mu_;  // what registration() reports
  RegistrationState state_ ABSL_GUARDED_BY(state_mu_);
  std::atomic<int> registrations_{0};
  std::atomic<bool> healthy_{false};
  std::atomic<bool> stop_{false};
  absl::Mutex stop_mu_;
  absl::CondVar stop_cv_;
  std::thread watcher_;
};

}  // namespace podlink
