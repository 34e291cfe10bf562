#include "daemon/deviceplugin/device_plugin.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/broker/stream_reactor.h"

namespace podlink {
namespace {

const ComponentLog PluginLog("deviceplugin");

std::string DeviceId(int i) { return absl::StrCat("podlink-peer-", i); }

}  // namespace

// gRPC face: converts and calls the plugin. ListAndWatch streams stay open
// and receive the whole list again on every health change.
class DevicePluginService final : public v1beta1::DevicePlugin::CallbackService {
 public:
  explicit DevicePluginService(podlink::DevicePlugin* plugin) : plugin_(plugin) {}

  grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* ctx, const v1beta1::Empty*,
                                                   v1beta1::DevicePluginOptions* resp) override {
    resp->set_pre_start_required(false);
    resp->set_get_preferred_allocation_available(true);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* ListAndWatch(grpc::CallbackServerContext*,
                                                                        const v1beta1::Empty*) override {
    auto s = std::make_shared<QueuedWriteReactor<v1beta1::ListAndWatchResponse>>();
    s->Begin(s);
    s->Push(plugin_->DeviceList());
    absl::MutexLock l(&mu_);
    std::erase_if(streams_, [](const auto& x) { return x->finished(); });
    streams_.push_back(s);
    return s.get();
  }

  grpc::ServerUnaryReactor* GetPreferredAllocation(grpc::CallbackServerContext* ctx,
                                                   const v1beta1::PreferredAllocationRequest* req,
                                                   v1beta1::PreferredAllocationResponse* resp) override {
    *resp = plugin_->Preferred(*req);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* ctx, const v1beta1::AllocateRequest* req,
                                     v1beta1::AllocateResponse* resp) override {
    auto a = plugin_->Allocate(*req);
    if (a.ok()) *resp = *std::move(a);
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(a.status()));
    return r;
  }

  grpc::ServerUnaryReactor* PreStartContainer(grpc::CallbackServerContext* ctx, const v1beta1::PreStartContainerRequest*,
                                              v1beta1::PreStartContainerResponse*) override {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  void Broadcast() {
    v1beta1::ListAndWatchResponse list = plugin_->DeviceList();
    absl::MutexLock l(&mu_);
    for (auto& s : streams_) s->Push(list);
  }

  void CloseAll() {
    absl::MutexLock l(&mu_);
    for (auto& s : streams_) s->Close(plugin_->DeviceList());
    streams_.clear();
  }

 private:
  podlink::DevicePlugin* const plugin_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<QueuedWriteReactor<v1beta1::ListAndWatchResponse>>> streams_ ABSL_GUARDED_BY(mu_);
};

DevicePlugin::FileId DevicePlugin::IdOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return {};
  return {st.st_ino, static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

DevicePlugin::DevicePlugin(DevicePluginConfig config, HealthCheck health)
    : config_(std::move(config)), health_(std::move(health)) {}

absl::StatusOr<std::unique_ptr<DevicePlugin>> DevicePlugin::Start(DevicePluginConfig config, HealthCheck health) {
  if (config.devices <= 0 || config.devices > 100000) {
    return absl::InvalidArgumentError("device plugin: devices must be in 1..100000");
  }
  if (config.resource.find('/') == std::string::npos) {
    return absl::InvalidArgumentError("device plugin: resource must look like vendor-domain/type");
  }
  std::unique_ptr<DevicePlugin> p(new DevicePlugin(std::move(config), std::move(health)));
  p->service_ = std::make_unique<DevicePluginService>(p.get());
  std::string why;
  p->healthy_ = p->health_(&why);
  // Registration may fail while kubelet is down; the watch thread retries.
  p->watcher_ = std::thread([raw = p.get()] { raw->Watch(); });
  return p;
}

DevicePlugin::~DevicePlugin() {
  {
    absl::MutexLock l(&stop_mu_);
    stop_ = true;
    stop_cv_.SignalAll();
  }
  watcher_.join();
  // The kubelet hears that the devices are gone before the stream ends, so it
  // stops placing pods on them while podlinkd is away.
  healthy_ = false;
  service_->CloseAll();
  absl::MutexLock l(&mu_);
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  ::unlink(SocketPath().c_str());
}

absl::Status DevicePlugin::Serve() {
  absl::MutexLock l(&mu_);
  if (server_) {
    service_->CloseAll();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
  }
  ::unlink(SocketPath().c_str());
  grpc::ServerBuilder b;
  b.AddListeningPort("unix:" + SocketPath(), grpc::InsecureServerCredentials());
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
  if (!server_) return absl::UnavailableError(absl::StrCat("cannot serve ", SocketPath()));
  socket_id_ = IdOf(SocketPath());
  return absl::OkStatus();
}

absl::Status DevicePlugin::Register() {
  auto ch = grpc::CreateChannel("unix:" + config_.dir + "/kubelet.sock", grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + config_.register_timeout));
  v1beta1::RegisterRequest req;
  req.set_version("v1beta1");
  req.set_endpoint(config_.endpoint);
  req.set_resource_name(config_.resource);
  req.mutable_options()->set_get_preferred_allocation_available(true);
  v1beta1::Empty resp;
  return FromGrpcStatus(stub->Register(&ctx, req, &resp));
}

void DevicePlugin::Watch() {
  const std::string kubelet = config_.dir + "/kubelet.sock";
  for (;;) {
    // Our socket gone (kubelet restarted and cleaned the directory) or never served.
    if (!socket_id_.exists() || !(IdOf(SocketPath()) == socket_id_)) {
      if (absl::Status s = Serve(); !s.ok()) {
        PluginLog()->warn("event=serve_failed error={}", LogQuoted(s.message()));
      } else {
        registered_ = false;
      }
    }
    FileId k = IdOf(kubelet);
    bool new_kubelet = !(k == attempted_kubelet_);
    if (k.exists() && (!registered_ || !(k == kubelet_id_)) && (new_kubelet || absl::Now() >= next_attempt_)) {
      if (new_kubelet) backoff_ = config_.register_backoff;
      attempted_kubelet_ = k;
      absl::Status s = Register();
      absl::MutexLock l(&state_mu_);
      if (s.ok()) {
        registered_ = true;
        kubelet_id_ = k;
        backoff_ = config_.register_backoff;
        ++registrations_;
        state_.registered = true;
        state_.last_error.clear();
        PluginLog()->info("event=registered resource={} endpoint={}", config_.resource, config_.endpoint);
      } else {
        next_attempt_ = absl::Now() + backoff_;
        ++state_.failures;
        state_.registered = false;
        state_.last_error = std::string(s.message());
        PluginLog()->warn("event=register_failed resource={} error={} retry_in_s={:.0f}", config_.resource,
                    LogQuoted(s.message()), absl::ToDoubleSeconds(backoff_));
        backoff_ = std::min(backoff_ * 2, config_.register_backoff_max);
      }
    }
    if (!registered_) {
      absl::MutexLock l(&state_mu_);
      state_.registered = false;
      if (state_.last_error.empty()) {
        state_.last_error = k.exists() ? "registration pending" : kubelet + " does not exist (kubelet not running?)";
      }
    }
    std::string why;
    bool h = health_(&why);
    if (h != healthy_.exchange(h)) {
      PluginLog()->info("event=health healthy={} reason={}", h, LogQuoted(why));
      service_->Broadcast();
    }
    absl::MutexLock l(&stop_mu_);
    if (stop_) return;
    stop_cv_.WaitWithTimeout(&stop_mu_, config_.check_interval);
    if (stop_) return;
  }
}

DevicePlugin::RegistrationState DevicePlugin::registration() const {
  absl::MutexLock l(&state_mu_);
  return state_;
}

v1beta1::ListAndWatchResponse DevicePlugin::DeviceList() const {
  v1beta1::ListAndWatchResponse r;
  const char* h = healthy_.load() ? "Healthy" : "Unhealthy";
  for (int i = 0; i < config_.devices; ++i) {
    v1beta1::Device* d = r.add_devices();
    d->set_id(DeviceId(i));
    d->set_health(h);
  }
  return r;
}

absl::StatusOr<v1beta1::AllocateResponse> DevicePlugin::Allocate(const v1beta1::AllocateRequest& req) const {
  v1beta1::AllocateResponse resp;
  for (const auto& c : req.container_requests()) {
    if (c.devices_ids_size() == 0) return absl::InvalidArgumentError("Allocate: a container request without devices");
    for (const std::string& id : c.devices_ids()) {
      bool known = false;
      for (int i = 0; i < config_.devices && !known; ++i) known = id == DeviceId(i);
      if (!known) return absl::InvalidArgumentError(absl::StrCat("Allocate: unknown device id '", id, "'"));
    }
    v1beta1::ContainerAllocateResponse* out = resp.add_container_responses();
    v1beta1::Mount* sock = out->add_mounts();
    sock->set_host_path(config_.host_socket_dir);
    sock->set_container_path(config_.container_socket_dir);
    sock->set_read_only(false);
    v1beta1::Mount* lib = out->add_mounts();
    lib->set_host_path(config_.host_lib_dir);
    lib->set_container_path(config_.container_lib_dir);
    lib->set_read_only(true);
    auto& env = *out->mutable_envs();
    env["PODLINK_SOCKET_DIR"] = config_.container_socket_dir;
    // A path makes NCCL open the plugin as given, so LD_LIBRARY_PATH of the
    // image need not change; PODLINK_LIBRARY_DIR names the directory for
    // applications that link libpodlink.
    env["NCCL_NET_PLUGIN"] = config_.container_lib_dir + "/libnccl-net-podlink.so";
    env["PODLINK_LIBRARY_DIR"] = config_.container_lib_dir;
    // NCCL settings the plugin needs (why and what they bring: docs/nccl.md,
    // Settings): GPU-direct buffers although the plugin's NIC sits at the
    // GPU's parent bridge, and more channels per network peer for the relay
    // to pipeline point-to-point traffic. NCCL reads NCCL_NCHANNELS_PER_NET_PEER
    // when the communicator's config is made, before it loads the plugin, so
    // it must come from here; the plugin sets its other defaults itself at
    // init, and only for the relay (a pod in NCCL native mode keeps NCCL's).
    env["NCCL_NET_GDR_LEVEL"] = "SYS";
    env["NCCL_NET_GDR_READ"] = "1";
    env["NCCL_NCHANNELS_PER_NET_PEER"] = "16";
    for (const std::string& node : config_.device_nodes) {
      v1beta1::DeviceSpec* d = out->add_devices();
      d->set_host_path(node);
      d->set_container_path(node);
      d->set_permissions("rw");
    }
    if (!config_.device_nodes.empty()) env["PODLINK_DIRECT"] = "1";
  }
  return resp;
}

v1beta1::PreferredAllocationResponse DevicePlugin::Preferred(const v1beta1::PreferredAllocationRequest& req) const {
  // The devices are interchangeable: the required ones, then the first available.
  v1beta1::PreferredAllocationResponse resp;
  for (const auto& c : req.container_requests()) {
    auto* out = resp.add_container_responses();
    std::set<std::string> taken;
    for (const std::string& id : c.must_include_deviceids()) {
      if (out->deviceids_size() < c.allocation_size() && taken.insert(id).second) out->add_deviceids(id);
    }
    for (const std::string& id : c.available_deviceids()) {
      if (out->deviceids_size() >= c.allocation_size()) break;
      if (taken.insert(id).second) out->add_deviceids(id);
    }
  }
  return resp;
}

}  // namespace podlink
