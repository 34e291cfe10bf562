// podlinkd: wires the parts together and serves until SIGINT/SIGTERM.
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/broker/broker.h"
#include "daemon/broker/fd_server.h"
#include "daemon/broker/grpc_listener.h"
#include "daemon/broker/grpc_service.h"
#include "daemon/daemon_config.h"
#include "daemon/gpu/cuda_backend.h"
#include "daemon/gpu/gpu_inventory.h"
#include "daemon/gpu/host_backend.h"
#include "daemon/gpu/process_memory.h"
#include "daemon/identity/cri_source.h"
#include "daemon/identity/kube_pods.h"
#include "daemon/identity/standalone_source.h"
#include "daemon/deviceplugin/device_plugin.h"
#include "daemon/metrics/http_server.h"
#include "daemon/metrics/metrics.h"
#include "daemon/metrics/metrics_page.h"
#include "daemon/metrics/process_metrics.h"
#include "daemon/mesh/mesh_engine.h"
#include "daemon/mesh/trust/openssl_exit.h"
#include "daemon/relay/relay_engine.h"
#include "absl/cleanup/cleanup.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "common/cli.h"
#include "common/log.h"

ABSL_FLAG(std::string, socket_dir, "",
          "directory for podlink.sock (gRPC) and podlink.fd.sock (descriptors); empty: $PODLINK_SOCKET_DIR, "
          "else /run/podlink");
ABSL_FLAG(std::string, config, "", "JSON config file: limits, identity, standalone pod rules (docs/usage.md)");
ABSL_FLAG(bool, no_gpu, false, "do not load the CUDA driver; serve host memory only");
ABSL_FLAG(std::string, pod_source, "standalone",
          "standalone (pod names and annotations from the config file) or cri (from the container runtime)");
ABSL_FLAG(std::string, cri_socket, "", "CRI socket; empty: containerd's if present, else CRI-O's");
ABSL_FLAG(std::string, remote_pods, "auto",
          "how the owner of a region believes the pod another node's daemon imports for: apiserver (only as the "
          "Kubernetes API server confirms it: UID, node, podlink.io/ annotations; needs get/list/watch on pods), "
          "forwarded (as that daemon states it: only where no API server exists), or auto (apiserver when "
          "podlinkd runs in a cluster: KUBERNETES_SERVICE_HOST is set or --kube-api-server given; forwarded, "
          "with a warning, otherwise); used with the mesh only");
ABSL_FLAG(std::string, kube_api_server, "",
          "with --remote-pods apiserver: https://host:port of the API server; empty: in-cluster "
          "(KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)");
ABSL_FLAG(std::string, kube_token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token",
          "with --remote-pods apiserver: the bearer token, read again for every request");
ABSL_FLAG(std::string, kube_ca_file, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
          "with --remote-pods apiserver: the CA that signs the API server's certificate");
ABSL_FLAG(std::string, metrics_addr, "127.0.0.1:9477",
          "host:port for /metrics, /healthz, /readyz; empty disables; port 0 picks a free port");
ABSL_FLAG(std::string, device_plugin_dir, "",
          "serve the kubelet device plugin for podlink.io/peer in this directory (normally "
          "/var/lib/kubelet/device-plugins); empty: off");
ABSL_FLAG(uint32_t, device_plugin_devices, 64, "shareable podlink.io/peer devices advertised to the kubelet");
ABSL_FLAG(std::string, host_lib_dir, "/var/lib/podlink/lib",
          "host directory holding libpodlink and the NCCL plugin, mounted into allocated containers");
ABSL_FLAG(uint32_t, relay_workers, 0, "relay threads; 0: one per GPU (at most 8), 1 without GPUs");
ABSL_FLAG(uint32_t, relay_streams, 4, "copy streams per GPU per relay thread (1 to 64)");
ABSL_FLAG(uint32_t, relay_merge_mib, 64,
          "largest GPU copy the relay makes by merging a client's contiguous requests, MiB (0 to 1024; 0: no "
          "merging, every request is a copy of its own)");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off");
ABSL_FLAG(std::string, probe, "",
          "do not start: GET this path (/readyz or /healthz) from --metrics-addr and exit 0 if it answers 200 "
          "(exec probes when metrics listen on loopback only)");
ABSL_FLAG(bool, print_defaults, false, "print every option's default and the config's default limits as JSON");

namespace {

constexpr char kUsage[] = R"(usage: podlinkd [options]

Brokers GPU (and host) memory between isolated pods on this node: gRPC and
descriptor sockets in --socket-dir, identity from the kernel, policy by pod
annotation (docs/usage.md, docs/security.md).
)";

// Every option's value, checked once after parsing.
struct Args {
  std::string socket_dir, config, log_level, metrics_addr, device_plugin_dir, pod_source, cri_socket,
      host_lib_dir, probe, remote_pods, kube_api_server, kube_token_file, kube_ca_file;
  bool no_gpu = false;
  uint32_t device_plugin_devices = 0, relay_workers = 0, relay_streams = 0, relay_merge_mib = 0;
};

// Reads the flags into `a`; false with the reason when a value is out of range.
bool ReadFlags(Args& a, std::string* why) {
  a.socket_dir = absl::GetFlag(FLAGS_socket_dir);
  if (a.socket_dir.empty()) {
    const char* env = std::getenv("PODLINK_SOCKET_DIR");
    a.socket_dir = env != nullptr && *env != '\0' ? env : "/run/podlink";
  }
  a.config = absl::GetFlag(FLAGS_config);
  a.no_gpu = absl::GetFlag(FLAGS_no_gpu);
  a.log_level = absl::GetFlag(FLAGS_log_level);
  a.metrics_addr = absl::GetFlag(FLAGS_metrics_addr);
  a.device_plugin_dir = absl::GetFlag(FLAGS_device_plugin_dir);
  a.pod_source = absl::GetFlag(FLAGS_pod_source);
  a.cri_socket = absl::GetFlag(FLAGS_cri_socket);
  a.device_plugin_devices = absl::GetFlag(FLAGS_device_plugin_devices);
  a.host_lib_dir = absl::GetFlag(FLAGS_host_lib_dir);
  a.relay_workers = absl::GetFlag(FLAGS_relay_workers);
  a.relay_streams = absl::GetFlag(FLAGS_relay_streams);
  a.relay_merge_mib = absl::GetFlag(FLAGS_relay_merge_mib);
  a.probe = absl::GetFlag(FLAGS_probe);
  a.remote_pods = absl::GetFlag(FLAGS_remote_pods);
  a.kube_api_server = absl::GetFlag(FLAGS_kube_api_server);
  a.kube_token_file = absl::GetFlag(FLAGS_kube_token_file);
  a.kube_ca_file = absl::GetFlag(FLAGS_kube_ca_file);
  const std::vector<std::string> levels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (std::find(levels.begin(), levels.end(), a.log_level) == levels.end()) {
    *why = "--log-level must be one of trace, debug, info, warn, error, critical, off (got '" + a.log_level + "')";
  } else if (a.pod_source != "standalone" && a.pod_source != "cri") {
    *why = "--pod-source must be standalone or cri (got '" + a.pod_source + "')";
  } else if (a.remote_pods != "forwarded" && a.remote_pods != "apiserver" && a.remote_pods != "auto") {
    *why = "--remote-pods must be apiserver, forwarded or auto (got '" + a.remote_pods + "')";
  } else if (a.relay_workers > 64) {
    *why = "--relay-workers must be 0 (one per GPU) to 64";
  } else if (a.relay_streams == 0 || a.relay_streams > 64) {
    *why = "--relay-streams must be 1 to 64";
  } else if (a.relay_merge_mib > 1024) {
    *why = "--relay-merge-mib must be 0 to 1024";
  } else if (a.device_plugin_devices == 0 || a.device_plugin_devices > 100000) {
    *why = "--device-plugin-devices must be 1 to 100000";
  } else if (a.socket_dir.empty() || a.socket_dir[0] != '/') {
    *why = "--socket-dir must be an absolute path (got '" + a.socket_dir + "')";
  } else {
    return true;
  }
  return false;
}

// --print-defaults: every option's default and the config's default limits,
// as JSON (the Helm chart's values are checked against it).
void PrintDefaults(const podlink::cli::Program& program) {
  podlink::DaemonConfig c;
  nlohmann::json j = nlohmann::json::object();
  for (absl::CommandLineFlag* flag : podlink::cli::OwnFlags(program)) {
    std::string name(flag->Name());
    if (name == "probe" || name == "print_defaults") continue;
    std::string def = flag->DefaultValue();
    if (flag->IsOfType<bool>()) {
      j[name] = def == "true";
    } else if (flag->IsOfType<uint32_t>()) {
      j[name] = std::stoul(def);
    } else {
      j[name] = def;
    }
  }
  j["socket_dir"] = "/run/podlink";  // the flag's empty default means $PODLINK_SOCKET_DIR, else this
  j["limits"] = {{"max_sessions", c.broker.max_sessions},
                 {"max_sessions_per_pod", c.broker.max_sessions_per_pod},
                 {"max_exports_per_session", c.broker.registry.max_exports_per_session},
                 {"max_exports_per_pod", c.broker.registry.max_exports_per_pod},
                 {"max_exports_total", c.broker.registry.max_exports_total},
                 {"max_pending_offers", c.broker.max_pending_offers},
                 {"max_pending_offers_per_pod", c.broker.max_pending_offers_per_pod},
                 {"max_pending_offers_total", c.broker.max_pending_offers_total},
                 {"max_export_chunks", c.broker.max_export_chunks},
                 {"offer_ttl_seconds", absl::ToInt64Seconds(c.broker.offer_ttl)},
                 {"max_grpc_connections", c.grpc.max_connections},
                 {"max_grpc_connections_per_pod", c.grpc.max_connections_per_pod}};
  const podlink::mesh::MeshOptions mesh;
  j["mesh"] = {{"enabled", mesh.enabled},
               {"listen", mesh.listen},
               {"data_port", mesh.data_port},
               {"cert_dir", mesh.cert_dir},
               {"fallback", mesh.fallback},
               {"connections_per_path", mesh.connections_per_path},
               {"transport", mesh.transport}};
  std::cout << j.dump(2) << "\n";
}

// The node this daemon serves: $NODE_NAME (the DaemonSet sets it from
// spec.nodeName), else the host name (outside Kubernetes).
std::string NodeName() {
  const char* env = std::getenv("NODE_NAME");
  if (env != nullptr && *env != '\0') return env;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

// True when something accepts connections on `path` (another daemon).
bool SocketLive(const std::string& path, int type) {
  int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything touches OpenSSL: gRPC's TLS threads may still be in it
  // while main() returns (openssl_exit.h).
  if (!podlink::mesh::KeepOpenSslUntilExit()) {
    std::cerr << "podlinkd: OpenSSL could not be initialised\n";
    return 1;
  }
  const podlink::cli::Program program{"podlinkd", PODLINK_VERSION, kUsage, __FILE__};
  std::vector<std::string> positional = podlink::cli::Parse(argc, argv, program);
  if (!positional.empty()) {
    std::cerr << "podlinkd: unexpected argument '" << positional[0] << "' (--help lists the options)\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_print_defaults)) {
    PrintDefaults(program);
    return 0;
  }
  Args args;
  if (std::string why; !ReadFlags(args, &why)) {
    std::cerr << "podlinkd: " << why << "\n";
    return 2;
  }
  if (!args.probe.empty()) {
    absl::Status st = podlink::ProbeHttp(args.metrics_addr, args.probe);
    if (!st.ok()) std::cerr << "podlinkd --probe: " << st.message() << "\n";
    return st.ok() ? 0 : 1;
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  for (const char* name : {"podlinkd", "broker", "fdchan", "grpc", "gpu", "relay", "mesh", "deviceplugin", "identity"}) {
    spdlog::register_logger(std::make_shared<spdlog::logger>(name, sink));
  }
  spdlog::set_level(spdlog::level::from_str(args.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %n %v");
  auto log = spdlog::get("podlinkd");

  podlink::DaemonConfig cfg;
  if (!args.config.empty()) {
    auto loaded = podlink::LoadDaemonConfig(args.config);
    if (!loaded.ok()) {
      log->critical("event=bad_config error={}", podlink::LogQuoted(loaded.status().message()));
      return 2;
    }
    cfg = *std::move(loaded);
  }

  // Every session costs descriptors (its channel, a pidfd, one per export
  // and ring): serve up to the hard limit, not the often tiny soft one.
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      log->warn("event=rlimit_nofile_failed error={}", podlink::LogQuoted(std::strerror(errno)));
    }
  }
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    log->info("event=rlimit_nofile limit={}", static_cast<uint64_t>(nofile.rlim_cur));
  }

  // Signals are taken synchronously by the main thread below.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (::mkdir(args.socket_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    log->critical("event=socket_dir_failed dir={} error={}", args.socket_dir, podlink::LogQuoted(std::strerror(errno)));
    return 1;
  }
  const std::string grpc_path = args.socket_dir + "/podlink.sock";
  const std::string fd_path = args.socket_dir + "/podlink.fd.sock";
  if (SocketLive(fd_path, SOCK_SEQPACKET) || SocketLive(grpc_path, SOCK_STREAM)) {
    log->critical("event=already_running dir={} msg=\"another podlinkd serves this socket directory\"",
                  args.socket_dir);
    return 1;
  }
  ::unlink(grpc_path.c_str());
  ::unlink(fd_path.c_str());

  podlink::GpuInventory inv;
  if (args.no_gpu) {
    inv.cuda_status = "disabled with --no-gpu";
  } else {
    inv = podlink::DiscoverGpus();
  }
  if (inv.cuda_available) {
    for (const auto& g : inv.gpus) {
      log->info("event=gpu ordinal={} uuid={} bus={} node={} posix_fd={} fabric={} (attribute {}) dmabuf={} "
                "gpudirect_rdma_vmm={}",
                g.ordinal, g.uuid, g.pci_bus_id, g.device_node, g.posix_fd_supported, g.fabric_supported,
                g.fabric_attribute, g.dmabuf_supported, g.gpudirect_rdma_vmm);
    }
  } else {
    log->info("event=no_cuda reason={} msg=\"serving host memory only\"", podlink::LogQuoted(inv.cuda_status));
  }

  std::vector<std::unique_ptr<podlink::MemoryBackend>> backends;
  const uint64_t ram =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // Host exports are page-locked for the relay when a GPU is there to copy them.
  std::shared_ptr<podlink::HostPinner> pinner;
  if (inv.cuda_available && !inv.gpus.empty()) {
    auto p = podlink::CudaHostPinner::Create(inv.gpus.front().ordinal);
    if (p.ok()) {
      // At most an eighth of the node's memory page-locked for clients.
      pinner = std::make_shared<podlink::BudgetedPinner>(*p, ram / 8);
      log->info("event=host_pinning limit_bytes={}", ram / 8);
    } else {
      log->warn("event=host_pin_unavailable error={} msg=\"relay copies of host memory use pageable memory\"",
                podlink::LogQuoted(p.status().ToString()));
    }
  }
  // Relay mappings of host exports: at most twice the node's memory of
  // address space (exports are populated when exported, so legitimate ones
  // add up to less than the node's memory).
  backends.push_back(
      std::make_unique<podlink::HostMemfdBackend>(pinner, std::make_shared<podlink::MappingBudget>(2 * ram)));
  // Host memory registered as it is (malloc, numpy): the relay copies it
  // through the exporter's /proc/<pid>/mem (daemon/gpu/process_memory.h).
  backends.push_back(std::make_unique<podlink::ProcessMemoryBackend>());
  std::unique_ptr<podlink::CudaBackend> cuda;
  podlink::GpuInventory inv_for_backend(inv);  // declared before the broker: outlives its backends
  if (inv.cuda_available) backends.push_back(std::make_unique<podlink::CudaBackend>(&inv_for_backend));

  std::unique_ptr<podlink::PodSource> pods = std::make_unique<podlink::StandalonePodSource>(cfg.pods);
  if (args.pod_source == "cri") {
    std::string sock = args.cri_socket.empty() ? podlink::CriPodSource::DefaultSocket() : args.cri_socket;
    log->info("event=pod_source source=cri socket={}", sock);
    pods = std::make_unique<podlink::CriPodSource>(sock, std::move(pods));
  }
  cfg.broker.relay.workers = args.relay_workers;
  cfg.broker.relay.streams_per_gpu = args.relay_streams;
  cfg.broker.relay.merge_bytes = uint64_t{args.relay_merge_mib} << 20;
  cfg.broker.node_name = cfg.node_name.empty() ? NodeName() : cfg.node_name;
  // Pods of other nodes (mesh only): as the API server states them, or as
  // their daemons forward them. Declared before the broker, which asks it.
  std::unique_ptr<podlink::PodDirectory> remote_pods;
  std::string remote_mode = args.remote_pods;
  if (remote_mode == "auto") {
    // In a cluster the API server is at hand: believing other nodes' word
    // for their pods is only for meshes without one.
    const char* in_cluster = std::getenv("KUBERNETES_SERVICE_HOST");
    remote_mode = (in_cluster != nullptr && *in_cluster != '\0') || !args.kube_api_server.empty() ? "apiserver"
                                                                                                : "forwarded";
    if (cfg.broker.mesh.enabled) log->info("event=remote_pods_auto mode={}", remote_mode);
  }
  if (cfg.broker.mesh.enabled && remote_mode == "apiserver") {
    absl::StatusOr<podlink::KubeApiConfig> api = args.kube_api_server.empty()
                                                     ? podlink::InClusterConfig()
                                                     : podlink::ParseApiServerUrl(args.kube_api_server);
    if (!api.ok()) {
      log->critical("event=bad_config error={}", podlink::LogQuoted("--remote-pods apiserver: " + api.status().ToString()));
      return 1;
    }
    podlink::PodDirectoryOptions po;
    po.api = *api;
    po.api.token_file = args.kube_token_file;
    po.api.ca_file = args.kube_ca_file;
    remote_pods = std::make_unique<podlink::PodDirectory>(po);
    remote_pods->Start();
  } else if (cfg.broker.mesh.enabled) {
    log->warn("event=remote_pods mode=forwarded msg=\"pods of other nodes are believed as their daemons state "
              "them (no API server: KUBERNETES_SERVICE_HOST is unset); --remote-pods apiserver confirms them with "
              "the Kubernetes API server\"");
  }
  // The daemon's parts, wired here: the broker (sessions, policy), the relay
  // (sessions' rings, resolving exports through the broker) and the mesh
  // (other nodes, asking the broker for policy). Each outlives what calls
  // into it: the guard below closes every session while both engines still
  // serve, then the mesh goes (its completions land in the relay), then the
  // relay, then the broker.
  podlink::Broker broker(cfg.broker, std::move(pods), inv, std::move(backends));
  broker.ConfirmRemotePodsWith(remote_pods.get());
  auto relay = std::make_unique<podlink::RelayEngine>(broker.RelayResolver(), broker.inventory(), cfg.broker.relay);
  broker.Attach(relay.get(), nullptr);  // before the mesh serves: it calls into the broker at once
  std::unique_ptr<podlink::mesh::MeshEngine> mesh;
  if (cfg.broker.mesh.enabled) {
    auto started = podlink::mesh::MeshEngine::Start(cfg.broker.mesh, cfg.broker.node_name, &broker);
    if (!started.ok()) {
      log->critical("event=mesh_start_failed error={}", podlink::LogQuoted(started.status().message()));
      return 1;
    }
    mesh = *std::move(started);
    relay->set_mesh(mesh.get());
  }
  broker.Attach(relay.get(), mesh.get());
  absl::Cleanup close_sessions = [&] {
    broker.CloseAllSessions("daemon stopping");
    relay->set_mesh(nullptr);
    broker.Attach(nullptr, nullptr);  // the engines go before the broker
  };

  auto fds = podlink::FdServer::Start(&broker, fd_path);
  if (!fds.ok()) {
    log->critical("event=fd_listen_failed path={} error={}", fd_path, podlink::LogQuoted(fds.status().message()));
    return 1;
  }

  podlink::BrokerService service(&broker);
  grpc::ServerBuilder builder;  // no listening port: GrpcListener accepts (and bounds) connections
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 * 1024);  // requests are small; bigger ones are refused
  grpc::ResourceQuota quota("podlinkd");
  quota.SetMaxThreads(64);
  builder.SetResourceQuota(quota);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    log->critical("event=grpc_start_failed");
    return 1;
  }
  auto listener = podlink::GrpcListener::Start(server.get(), grpc_path, cfg.grpc);
  if (!listener.ok()) {
    log->critical("event=grpc_listen_failed path={} error={}", grpc_path, podlink::LogQuoted(listener.status().message()));
    return 1;
  }

  // Declared before the metrics server, which reports them.
  std::unique_ptr<podlink::DevicePlugin> plugin, direct_plugin;
  auto plugin_metrics = [&plugin, &direct_plugin] {
    std::map<std::string, double> registered, failures;
    for (const auto* p : {plugin.get(), direct_plugin.get()}) {
      if (p == nullptr) continue;
      podlink::DevicePlugin::RegistrationState st = p->registration();
      registered[p->resource()] = st.registered ? 1 : 0;
      failures[p->resource()] = static_cast<double>(st.failures);
    }
    std::string out;
    if (registered.empty()) return out;
    podlink::RenderFamily(&out, "podlink_device_plugin_registered", "gauge",
                          "1 while the kubelet has accepted the device plugin's registration", registered, "resource");
    podlink::RenderFamily(&out, "podlink_device_plugin_register_failures_total", "counter",
                          "device plugin registrations refused or failed", failures, "resource");
    return out;
  };
  // /readyz answers 200 while podlinkd serves pods and can identify new ones
  // (with --pod-source cri: while the container runtime answers); the body
  // also names a device plugin the kubelet has not accepted (pods already
  // running keep working; new ones cannot be allocated podlink.io resources).
  auto readiness = [&broker, &plugin, &direct_plugin, &remote_pods] {
    if (!broker.ready()) return podlink::HttpResponse{503, "text/plain; charset=utf-8", "not ready\n"};
    if (absl::Status pods = broker.PodSourceReady(); !pods.ok()) {
      return podlink::HttpResponse{503, "text/plain; charset=utf-8",
                                   "not ready: " + std::string(pods.message()) + "\n"};
    }
    std::string body = "ready\n";
    if (remote_pods != nullptr) {
      if (absl::Status st = remote_pods->Ready(); !st.ok()) {
        body += "pods of other nodes are refused until the API server confirms them: " + std::string(st.message()) +
                "\n";
      }
    }
    for (const auto* p : {plugin.get(), direct_plugin.get()}) {
      if (p == nullptr) continue;
      podlink::DevicePlugin::RegistrationState st = p->registration();
      if (!st.registered) {
        body += "device plugin " + p->resource() + " not registered with the kubelet: " + st.last_error + "\n";
      }
    }
    return podlink::HttpResponse{200, "text/plain; charset=utf-8", body};
  };
  // /metrics: each part renders its own families; the page joins them.
  podlink::MetricsPage page;
  page.Add([] {
    std::string out;
    podlink::RenderFamily(&out, "podlink_up", "gauge", "1 while podlinkd serves", {{"", 1}});
    podlink::RenderFamily(&out, "podlink_build_info", "gauge", "podlinkd's version (the value is 1)",
                          {{PODLINK_VERSION, 1}}, "version");
    return out + podlink::RenderProcessMetrics();
  });
  page.Add([&broker] { return broker.RenderMetrics(); });
  page.Add([&relay] { return relay->RenderMetrics(); });
  if (mesh != nullptr) page.Add([&mesh] { return mesh->RenderMetrics(); });
  page.Add([&listener] { return (*listener)->RenderMetrics(); });
  page.Add(plugin_metrics);
  if (remote_pods != nullptr) page.Add([&remote_pods] { return remote_pods->RenderMetrics(); });
  std::unique_ptr<podlink::HttpServer> http;
  std::string metrics = "off";
  if (!args.metrics_addr.empty()) {
    auto h = podlink::HttpServer::Start(args.metrics_addr, [&](const std::string& path) {
      if (path == "/metrics") {
        return podlink::HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                                     page.Render()};
      }
      if (path == "/healthz") return podlink::HttpResponse{200, "text/plain; charset=utf-8", "ok\n"};
      if (path == "/readyz") return readiness();
      return podlink::HttpResponse{404, "text/plain; charset=utf-8", "try /metrics, /healthz or /readyz\n"};
    });
    if (!h.ok()) {
      log->critical("event=metrics_listen_failed addr={} error={}", args.metrics_addr, podlink::LogQuoted(h.status().message()));
      return 1;
    }
    http = *std::move(h);
    metrics = args.metrics_addr.substr(0, args.metrics_addr.rfind(':') + 1) + std::to_string(http->port());
  }
  broker.set_ready(true);

  if (!args.device_plugin_dir.empty()) {
    podlink::DevicePluginConfig dp;
    dp.dir = args.device_plugin_dir;
    dp.host_socket_dir = args.socket_dir;
    dp.host_lib_dir = args.host_lib_dir;
    dp.devices = static_cast<int>(args.device_plugin_devices);
    // Healthy while the daemon serves and every GPU it found still has its device node.
    auto health = [&broker, &inv](std::string* why) {
      if (!broker.ready()) {
        *why = "podlinkd not ready";
        return false;
      }
      for (const auto& g : inv.gpus) {
        if (!g.device_node.empty() && ::access(g.device_node.c_str(), F_OK) != 0) {
          *why = g.device_node + " is gone";
          return false;
        }
      }
      why->clear();
      return true;
    };
    auto p = podlink::DevicePlugin::Start(dp, health);
    if (!p.ok()) {
      log->critical("event=device_plugin_failed error={}", podlink::LogQuoted(p.status().message()));
      return 1;
    }
    plugin = *std::move(p);
    // Direct mode is a second resource: Allocate is not told which pod it
    // serves, so pods opt in by requesting podlink.io/peer-direct, whose
    // allocation also adds every GPU's device node.
    if (!inv.gpus.empty()) {
      podlink::DevicePluginConfig direct = dp;
      direct.resource = "podlink.io/peer-direct";
      direct.endpoint = "podlink-direct.sock";
      for (const auto& g : inv.gpus) {
        if (!g.device_node.empty()) direct.device_nodes.push_back(g.device_node);
      }
      auto d = podlink::DevicePlugin::Start(direct, health);
      if (!d.ok()) {
        log->critical("event=device_plugin_failed resource=podlink.io/peer-direct error={}", podlink::LogQuoted(d.status().message()));
        return 1;
      }
      direct_plugin = *std::move(d);
    }
  }
  log->info("event=ready version={} node={} node_name={} grpc={} fd={} metrics={} handle_types={} relay_workers={}",
            PODLINK_VERSION, broker.node_id(), podlink::LogQuoted(cfg.broker.node_name), grpc_path, fd_path, metrics,
            broker.GetNodeInfo().handle_types_size(), relay->Counters().workers);

  int sig = 0;
  sigwait(&sigs, &sig);
  log->info("event=stopping signal={}", sig);
  broker.set_ready(false);
  http.reset();  // its handlers read the device plugins
  plugin.reset();
  direct_plugin.reset();
  (*listener)->Stop();
  // The mesh first: opens of other nodes still waiting are answered while
  // the RPC server can finish their calls.
  // The pod directory first: a mesh call waiting on a lookup by name ends now.
  if (remote_pods != nullptr) remote_pods->Stop();
  if (mesh != nullptr) mesh->Stop();
  (*fds)->Stop();  // closes every session; Watch streams end with SESSION_CLOSED
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  log->info("event=stopped");
  return 0;
}
