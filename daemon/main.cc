// podlinkd: wires the parts together and serves until SIGINT/SIGTERM.
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

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
#include "daemon/identity/cri_source.h"
#include "daemon/identity/standalone_source.h"
#include "daemon/deviceplugin/device_plugin.h"
#include "daemon/metrics/http_server.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/resource_quota.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "common/log.h"

namespace {

constexpr char kUsage[] = R"(usage: podlinkd [options]

Brokers GPU (and host) memory between isolated pods on this node.

  --socket-dir DIR   where podlink.sock (gRPC) and podlink.fd.sock (descriptors)
                     are created (default /run/podlink, env PODLINK_SOCKET_DIR)
  --config FILE      JSON config: limits and standalone pod rules (docs/usage.md)
  --no-gpu           do not load the CUDA driver; serve host memory only
  --pod-source S     standalone (config file; default) or cri (pod names and
                     annotations from the container runtime)
  --cri-socket PATH  CRI socket (default: containerd's if present, else CRI-O's)
  --metrics-addr A   host:port for /metrics, /healthz, /readyz (default 127.0.0.1:9477;
                     "" disables; port 0 picks a free port)
  --device-plugin-dir DIR
                     serve the kubelet device plugin for podlink.io/peer in DIR
                     (normally /var/lib/kubelet/device-plugins; default off)
  --device-plugin-devices N   shareable podlink.io/peer devices (default 64)
  --host-lib-dir DIR host directory holding libpodlink and the NCCL plugin, mounted
                     into allocated containers (default /var/lib/podlink/lib)
  --relay-workers N  relay threads; each serves a share of the sessions' rings
                     (default 0: one per GPU, at most 8; 1 without GPUs)
  --relay-streams N  copy streams per GPU per relay thread (default 4)
  --log-level LEVEL  trace|debug|info|warn|error (default info)
  --probe PATH       do not start: GET PATH (/readyz or /healthz) from the daemon's
                     metrics address (--metrics-addr) and exit 0 if it answers 200;
                     for exec probes when metrics listen on loopback only
  --print-defaults   print every option's default and the config's default limits
                     as JSON (the Helm chart's values are checked against it)
  --help
)";

struct Args {
  std::string socket_dir = "/run/podlink";
  std::string config;
  bool no_gpu = false;
  std::string log_level = "info";
  std::string metrics_addr = "127.0.0.1:9477";
  std::string device_plugin_dir;
  std::string pod_source = "standalone";
  std::string cri_socket;
  std::string device_plugin_devices = "64";
  std::string host_lib_dir = "/var/lib/podlink/lib";
  std::string relay_workers = "0";
  std::string relay_streams = "4";
  std::string probe;
};

bool ParseArgs(int argc, char** argv, Args& a) {
  if (const char* env = getenv("PODLINK_SOCKET_DIR")) a.socket_dir = env;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) {
        std::cerr << "podlinkd: " << k << " needs a value\n" << kUsage;
        return false;
      }
      out = argv[++i];
      return true;
    };
    if (k == "--socket-dir") {
      if (!value(a.socket_dir)) return false;
    } else if (k == "--config") {
      if (!value(a.config)) return false;
    } else if (k == "--log-level") {
      if (!value(a.log_level)) return false;
    } else if (k == "--pod-source") {
      if (!value(a.pod_source)) return false;
    } else if (k == "--cri-socket") {
      if (!value(a.cri_socket)) return false;
    } else if (k == "--device-plugin-dir") {
      if (!value(a.device_plugin_dir)) return false;
    } else if (k == "--device-plugin-devices") {
      if (!value(a.device_plugin_devices)) return false;
    } else if (k == "--host-lib-dir") {
      if (!value(a.host_lib_dir)) return false;
    } else if (k == "--relay-workers") {
      if (!value(a.relay_workers)) return false;
    } else if (k == "--relay-streams") {
      if (!value(a.relay_streams)) return false;
    } else if (k == "--metrics-addr") {
      if (!value(a.metrics_addr)) return false;
    } else if (k == "--probe") {
      if (!value(a.probe)) return false;
    } else if (k == "--print-defaults") {
      Args d;
      podlink::DaemonConfig c;
      nlohmann::json j = {
          {"socket_dir", d.socket_dir},
          {"no_gpu", d.no_gpu},
          {"log_level", d.log_level},
          {"metrics_addr", d.metrics_addr},
          {"device_plugin_dir", d.device_plugin_dir},
          {"pod_source", d.pod_source},
          {"cri_socket", d.cri_socket},
          {"device_plugin_devices", std::stoi(d.device_plugin_devices)},
          {"host_lib_dir", d.host_lib_dir},
          {"relay_workers", std::stoi(d.relay_workers)},
          {"relay_streams", std::stoi(d.relay_streams)},
          {"limits",
           {{"max_sessions", c.broker.max_sessions},
            {"max_exports_per_session", c.broker.registry.max_exports_per_session},
            {"max_exports_total", c.broker.registry.max_exports_total},
            {"max_pending_offers", c.broker.max_pending_offers}}}};
      std::cout << j.dump(2) << "\n";
      exit(0);
    } else if (k == "--no-gpu") {
      a.no_gpu = true;
    } else if (k == "--help" || k == "-h") {
      std::cout << kUsage;
      exit(0);
    } else {
      std::cerr << "podlinkd: unknown option " << k << "\n" << kUsage;
      return false;
    }
  }
  return true;
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
  Args args;
  if (!ParseArgs(argc, argv, args)) return 2;
  if (!args.probe.empty()) {
    absl::Status st = podlink::ProbeHttp(args.metrics_addr, args.probe);
    if (!st.ok()) std::cerr << "podlinkd --probe: " << st.message() << "\n";
    return st.ok() ? 0 : 1;
  }
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  for (const char* name : {"podlinkd", "broker", "fdchan", "grpc", "gpu", "relay", "deviceplugin"}) {
    spdlog::register_logger(std::make_shared<spdlog::logger>(name, sink));
  }
  spdlog::set_level(spdlog::level::from_str(args.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %n %v");
  auto log = spdlog::get("podlinkd");

  podlink::DaemonConfig cfg;
  if (!args.config.empty()) {
    auto loaded = podlink::LoadDaemonConfig(args.config);
    if (!loaded.ok()) {
      log->critical("event=bad_config error=\"{}\"", loaded.status().message());
      return 2;
    }
    cfg = *std::move(loaded);
  }

  // Every session costs descriptors (its channel, a pidfd, one per export
  // and ring): serve up to the hard limit, not the often tiny soft one.
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      log->warn("event=rlimit_nofile_failed error=\"{}\"", std::strerror(errno));
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
    log->critical("event=socket_dir_failed dir={} error=\"{}\"", args.socket_dir, std::strerror(errno));
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
      log->info("event=gpu ordinal={} uuid={} bus={} node={} posix_fd={} fabric={} (attribute {})", g.ordinal,
                g.uuid, g.pci_bus_id, g.device_node, g.posix_fd_supported, g.fabric_supported,
                g.fabric_attribute);
    }
  } else {
    log->info("event=no_cuda reason=\"{}\" msg=\"serving host memory only\"", inv.cuda_status);
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
      log->warn("event=host_pin_unavailable error=\"{}\" msg=\"relay copies of host memory use pageable memory\"",
                p.status().ToString());
    }
  }
  // Relay mappings of host exports: at most twice the node's memory of
  // address space (exports are populated when exported, so legitimate ones
  // add up to less than the node's memory).
  backends.push_back(
      std::make_unique<podlink::HostMemfdBackend>(pinner, std::make_shared<podlink::MappingBudget>(2 * ram)));
  std::unique_ptr<podlink::CudaBackend> cuda;
  podlink::GpuInventory inv_for_backend(inv);  // declared before the broker: outlives its backends
  if (inv.cuda_available) backends.push_back(std::make_unique<podlink::CudaBackend>(&inv_for_backend));

  std::unique_ptr<podlink::PodSource> pods = std::make_unique<podlink::StandalonePodSource>(cfg.pods);
  if (args.pod_source == "cri") {
    std::string sock = args.cri_socket.empty() ? podlink::CriPodSource::DefaultSocket() : args.cri_socket;
    log->info("event=pod_source source=cri socket={}", sock);
    pods = std::make_unique<podlink::CriPodSource>(sock, std::move(pods));
  } else if (args.pod_source != "standalone") {
    log->critical("event=bad_flag flag=--pod-source value={} msg=\"use standalone or cri\"", args.pod_source);
    return 2;
  }
  if (!absl::SimpleAtoi(args.relay_workers, &cfg.broker.relay.workers) || cfg.broker.relay.workers > 64) {
    log->critical("event=bad_flag flag=--relay-workers value={} msg=\"use 0 (one per GPU) to 64\"",
                  args.relay_workers);
    return 2;
  }
  if (!absl::SimpleAtoi(args.relay_streams, &cfg.broker.relay.streams_per_gpu) ||
      cfg.broker.relay.streams_per_gpu == 0 || cfg.broker.relay.streams_per_gpu > 64) {
    log->critical("event=bad_flag flag=--relay-streams value={} msg=\"use 1 to 64\"", args.relay_streams);
    return 2;
  }
  podlink::Broker broker(cfg.broker, std::move(pods), inv, std::move(backends));

  auto fds = podlink::FdServer::Start(&broker, fd_path);
  if (!fds.ok()) {
    log->critical("event=fd_listen_failed path={} error=\"{}\"", fd_path, fds.status().message());
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
    log->critical("event=grpc_listen_failed path={} error=\"{}\"", grpc_path, listener.status().message());
    return 1;
  }

  std::unique_ptr<podlink::HttpServer> http;
  std::string metrics = "off";
  if (!args.metrics_addr.empty()) {
    auto h = podlink::HttpServer::Start(args.metrics_addr, [&broker, &listener](const std::string& path) {
      if (path == "/metrics") {
        return podlink::HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                                     broker.RenderMetrics() + (*listener)->RenderMetrics()};
      }
      if (path == "/healthz") return podlink::HttpResponse{200, "text/plain; charset=utf-8", "ok\n"};
      if (path == "/readyz") {
        return broker.ready() ? podlink::HttpResponse{200, "text/plain; charset=utf-8", "ready\n"}
                              : podlink::HttpResponse{503, "text/plain; charset=utf-8", "not ready\n"};
      }
      return podlink::HttpResponse{404, "text/plain; charset=utf-8", "try /metrics, /healthz or /readyz\n"};
    });
    if (!h.ok()) {
      log->critical("event=metrics_listen_failed addr={} error=\"{}\"", args.metrics_addr, h.status().message());
      return 1;
    }
    http = *std::move(h);
    metrics = args.metrics_addr.substr(0, args.metrics_addr.rfind(':') + 1) + std::to_string(http->port());
  }
  broker.set_ready(true);

  std::unique_ptr<podlink::DevicePlugin> plugin, direct_plugin;
  if (!args.device_plugin_dir.empty()) {
    podlink::DevicePluginConfig dp;
    dp.dir = args.device_plugin_dir;
    dp.host_socket_dir = args.socket_dir;
    dp.host_lib_dir = args.host_lib_dir;
    if (!absl::SimpleAtoi(args.device_plugin_devices, &dp.devices)) {
      log->critical("event=bad_flag flag=--device-plugin-devices value={}", args.device_plugin_devices);
      return 2;
    }
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
      log->critical("event=device_plugin_failed error=\"{}\"", p.status().message());
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
        log->critical("event=device_plugin_failed resource=podlink.io/peer-direct error=\"{}\"", d.status().message());
        return 1;
      }
      direct_plugin = *std::move(d);
    }
  }
  log->info("event=ready version={} node={} grpc={} fd={} metrics={} handle_types={} relay_workers={}",
            PODLINK_VERSION, broker.node_id(), grpc_path, fd_path, metrics, broker.GetNodeInfo().handle_types_size(),
            broker.RelayStats().workers);

  int sig = 0;
  sigwait(&sigs, &sig);
  log->info("event=stopping signal={}", sig);
  broker.set_ready(false);
  plugin.reset();
  direct_plugin.reset();
  (*listener)->Stop();
  (*fds)->Stop();  // closes every session; Watch streams end with SESSION_CLOSED
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  log->info("event=stopped");
  return 0;
}
