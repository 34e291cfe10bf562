// kubectl-podlink: diagnostics for podlink, as a kubectl plugin
// (`kubectl podlink ...` once this binary is on PATH).
//
//   kubectl podlink status  [-o json|yaml]    node, GPUs, NVLink matrix, sessions, exports, relay counters
//   kubectl podlink exports [-o json|yaml]    every export on the node
//   kubectl podlink peers   [-o json|yaml]    the NVLink matrix
//   kubectl podlink links   [-o json|yaml]    the mesh: per peer node its connections, paths and counters
//   kubectl podlink doctor POD [-n NS] [--pod-json FILE] [-o json|yaml]
//                                             what keeps POD from using podlink, and how to fix it
//   kubectl podlink bench POD_A POD_B [-n NS] [-o json|yaml]
//   kubectl podlink version [-o json|yaml]    this plugin's version and, where reachable, podlinkd's
//
// status/exports/peers talk to podlinkd's socket on this node (--socket DIR,
// $PODLINK_SOCKET_DIR, or /run/podlink) and need root on the host: run them on
// the node or with `kubectl exec -n podlink-system <podlinkd pod> --
// kubectl-podlink ...` (--for-pod / --node do that). doctor reads the pod with
// `kubectl get pod -o json` (or --pod-json) and, where podlinkd is reachable,
// what it knows of the pod. Every kubectl call carries --kubeconfig and
// --context when given; without -n, pods are looked up in the namespace of the
// kubeconfig's context (`kubectl config view --minify`), else "default".
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "client-lib/tools/yaml_output.h"
#include "common/cli.h"
#include "common/command.h"
#include "podlink/client.h"

using nlohmann::json;

ABSL_FLAG(std::string, output, "", "json or yaml: machine-readable output (also -o json, -o yaml)");
ABSL_FLAG(std::string, namespace, "",
          "namespace of POD (doctor, bench, --for-pod; also -n NAMESPACE); empty: the namespace of the kubeconfig's "
          "current (or --context) context, else default");
ABSL_FLAG(std::string, kubeconfig, "", "kubeconfig file, passed to every kubectl call (kubectl's --kubeconfig)");
ABSL_FLAG(std::string, context, "", "kubeconfig context, passed to every kubectl call (kubectl's --context)");
ABSL_FLAG(std::string, pod_json, "", "doctor: read the pod from this file instead of `kubectl get pod`");
ABSL_FLAG(std::string, socket, "", "podlinkd's socket directory; empty: $PODLINK_SOCKET_DIR, else /run/podlink");
ABSL_FLAG(std::string, for_pod, "",
          "cluster mode: run status/exports/peers/version in the podlinkd pod on this pod's node (kubectl exec); "
          "the pod is in --namespace");
ABSL_FLAG(std::string, node, "", "cluster mode: run status/exports/peers/version in the podlinkd pod on this node");
ABSL_FLAG(std::string, daemon_namespace, "podlink-system", "cluster mode: namespace of the podlinkd DaemonSet");
ABSL_FLAG(uint64_t, size, 1ull << 30, "bench: bytes to write");
ABSL_FLAG(std::string, demo, "/usr/local/podlink/lib/podlink-demo", "bench: podlink-demo's path inside the pods");

namespace {

constexpr char kUsage[] = R"(usage: kubectl podlink COMMAND [options]

  status               node, GPUs, NVLink matrix, sessions, exports, relay counters
  exports              every export on this node
  peers                the NVLink matrix between this node's GPUs
  links                the mesh to other nodes: per peer node its connections, paths, bytes, failures;
                       the route to each node whose regions pods hold (direct, or via relays)
  doctor POD           what keeps POD from using podlink, in plain words, with fixes
  bench POD_A POD_B    one-sided write of --size bytes from POD_B into POD_A (through podlink-demo in
                       the pods, which the device plugin's mount provides), then the bandwidth
  version              this plugin's version and, where reachable, podlinkd's and its node

status, exports, peers and links need root on the node, outside containers: run them on the
node, or through `kubectl exec -n podlink-system <podlinkd pod> -- kubectl-podlink ...`,
or let --for-pod / --node do that. -o json|yaml and -n NAMESPACE are kubectl's spellings
of --output and --namespace. Without -n, pods are looked up in the namespace of the
kubeconfig's context (else default); --kubeconfig and --context reach every kubectl call.
)";

enum class Format { kText, kJson, kYaml };

struct Args {
  std::string cmd, pod, pod_b, ns, pod_json, socket, kubeconfig, context;
  std::string for_pod, node, daemon_ns, demo;
  uint64_t size = 0;
  Format format = Format::kText;
  bool structured() const { return format != Format::kText; }
  bool cluster() const { return !for_pod.empty() || !node.empty(); }
};

// kubectl's short spellings: -o is --output, -n is --namespace.
std::vector<std::string> LongOptions(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size() && out[i] != "--"; ++i) {
    for (auto [short_name, long_name] : {std::pair{"-o", "--output"}, {"-n", "--namespace"}}) {
      if (out[i] == short_name || absl::StartsWith(out[i], std::string(short_name) + "=")) {
        out[i] = long_name + out[i].substr(2);
      }
    }
  }
  return out;
}

// Every option, checked once: the command line's meaning, or what is wrong with it.
absl::StatusOr<Args> ArgsFromFlags(const std::vector<std::string>& pos) {
  Args a;
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output == "json") {
    a.format = Format::kJson;
  } else if (output == "yaml") {
    a.format = Format::kYaml;
  } else if (!output.empty()) {
    return absl::InvalidArgumentError("-o/--output must be json or yaml (got '" + output + "')");
  }
  a.ns = absl::GetFlag(FLAGS_namespace);
  a.kubeconfig = absl::GetFlag(FLAGS_kubeconfig);
  a.context = absl::GetFlag(FLAGS_context);
  a.pod_json = absl::GetFlag(FLAGS_pod_json);
  a.socket = absl::GetFlag(FLAGS_socket);
  a.for_pod = absl::GetFlag(FLAGS_for_pod);
  a.node = absl::GetFlag(FLAGS_node);
  a.daemon_ns = absl::GetFlag(FLAGS_daemon_namespace);
  a.size = absl::GetFlag(FLAGS_size);
  a.demo = absl::GetFlag(FLAGS_demo);
  if (a.size == 0) return absl::InvalidArgumentError("--size must be a positive integer (got '0')");
  if (pos.empty()) {
    return absl::InvalidArgumentError("no command given (status, exports, peers, doctor, bench or version)");
  }
  a.cmd = pos[0];
  size_t want = 1;
  if (a.cmd == "doctor") {
    if (pos.size() < 2) return absl::InvalidArgumentError("doctor needs a pod name");
    a.pod = pos[1];
    want = 2;
  } else if (a.cmd == "bench") {
    if (pos.size() < 3) return absl::InvalidArgumentError("bench needs two pods: the receiver and the sender");
    a.pod = pos[1];
    a.pod_b = pos[2];
    want = 3;
  } else if (a.cmd != "status" && a.cmd != "exports" && a.cmd != "peers" && a.cmd != "links" &&
             a.cmd != "version") {
    return absl::InvalidArgumentError("unknown command '" + a.cmd +
                                      "' (commands: status, exports, peers, links, doctor, bench, version)");
  }
  if (pos.size() > want) return absl::InvalidArgumentError("unexpected argument '" + pos[want] + "'");
  return a;
}

std::string Human(uint64_t b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  return i == 0 ? absl::StrFormat("%.0f %s", v, u[i]) : absl::StrFormat("%.1f %s", v, u[i]);
}

int Fail(const std::string& what, const absl::Status& s) {
  std::cerr << "kubectl-podlink: " << what << ": " << s.message() << "\n";
  return 1;
}

// Quotes for /bin/sh.
std::string Q(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

using Output = podlink::CommandOutput;
Output Sh(const std::string& cmd) { return podlink::RunCommand(cmd); }

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// `kubectl` with the user's --kubeconfig and --context: every kubectl call starts so.
std::string Kubectl(const Args& a) {
  std::string cmd = "kubectl";
  if (!a.kubeconfig.empty()) cmd += " --kubeconfig " + Q(a.kubeconfig);
  if (!a.context.empty()) cmd += " --context " + Q(a.context);
  return cmd;
}

// -o json or -o yaml.
void Print(const Args& a, const json& j) {
  std::cout << (a.format == Format::kYaml ? podlink::ToYaml(j) : j.dump(2) + "\n");
}

// The namespace pods are looked up in: -n, else the namespace of the
// kubeconfig's current (or --context) context, else "default".
absl::StatusOr<std::string> PodNamespace(const Args& a) {
  if (!a.ns.empty()) return a.ns;
  Output o = Sh(Kubectl(a) + " config view --minify -o 'jsonpath={..namespace}'");
  if (o.code != 0) {
    return absl::FailedPreconditionError("cannot read the namespace of the kubeconfig's context (kubectl config "
                                         "view --minify: " + Trim(o.text) + "); pass -n NAMESPACE");
  }
  std::string ns = Trim(o.text);
  return ns.empty() ? "default" : ns;
}

// Cluster mode: runs `kubectl-podlink ARGS` inside the podlinkd pod on the
// right node (--node, or the node of --for-pod) and returns what it printed.
absl::StatusOr<Output> InDaemonPod(const Args& a, const std::vector<std::string>& args) {
  std::string node = a.node;
  if (node.empty()) {
    Output o = Sh(Kubectl(a) + " get pod " + Q(a.for_pod) + " -n " + Q(a.ns) + " -o 'jsonpath={.spec.nodeName}'");
    node = Trim(o.text);
    if (o.code != 0 || node.empty()) {
      return absl::NotFoundError("cannot find the node of pod " + a.ns + "/" + a.for_pod + ": " + o.text);
    }
  }
  Output d = Sh(Kubectl(a) + " get pods -n " + Q(a.daemon_ns) +
                " -l app.kubernetes.io/component=podlinkd --field-selector spec.nodeName=" + Q(node) +
                " -o 'jsonpath={.items[0].metadata.name}'");
  std::string daemon = Trim(d.text);
  if (d.code != 0 || daemon.empty()) {
    return absl::NotFoundError("no podlinkd pod on node " + node + " in namespace " + a.daemon_ns +
                               " (is the DaemonSet installed and scheduled there?) " + d.text);
  }
  std::string cmd = Kubectl(a) + " exec -n " + Q(a.daemon_ns) + " " + Q(daemon) + " -- kubectl-podlink";
  for (const std::string& arg : args) cmd += " " + Q(arg);
  return Sh(cmd);
}

// status/exports/peers in cluster mode. The pod's kubectl-podlink prints JSON
// for -o yaml too: the YAML is made here.
int ViaCluster(const Args& a) {
  std::vector<std::string> args = {a.cmd};
  if (a.structured()) args.insert(args.end(), {"-o", "json"});
  if (!a.socket.empty()) args.insert(args.end(), {"--socket", a.socket});
  absl::StatusOr<Output> r = InDaemonPod(a, args);
  if (!r.ok()) return Fail(a.cmd, r.status());
  json j = json::value_t::discarded;
  if (a.format == Format::kYaml && r->code == 0) j = json::parse(r->text, nullptr, false);
  if (j.is_discarded()) {
    std::cout << r->text;
  } else {
    Print(a, j);
  }
  return r->code;
}

int Bench(const Args& a) {
  // POD_A registers a region and waits; POD_B writes it whole and notifies.
  std::string serve = Kubectl(a) + " exec -n " + Q(a.ns) + " " + Q(a.pod) + " -- " + Q(a.demo) +
                      " kv-serve --size " + std::to_string(a.size) + " --verify 7";
  FILE* server = popen((serve + " 2>&1").c_str(), "r");
  if (server == nullptr) return Fail("bench", absl::UnavailableError("cannot run kubectl"));
  char line[4096];
  std::string desc;
  while (fgets(line, sizeof(line), server) != nullptr) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == "serving") {
      desc = j.value("descriptor", "");
      break;
    }
    if (!j.is_discarded() && j.value("event", "") == "error") break;
  }
  if (desc.empty()) {
    pclose(server);
    return Fail("bench", absl::UnavailableError("pod " + a.pod + " did not register a region (is podlink-demo at " +
                                                a.demo + " and does the pod request podlink.io/peer?)"));
  }
  Output put = Sh(Kubectl(a) + " exec -n " + Q(a.ns) + " " + Q(a.pod_b) + " -- " + Q(a.demo) + " kv-put --desc " +
                  Q(desc) + " --seed 7");
  json pj;
  for (const auto& l : absl::StrSplit(put.text, '\n')) {
    json j = json::parse(std::string(l), nullptr, false);
    if (!j.is_discarded() && j.value("event", "") != "") pj = j;
  }
  json vj;
  while (fgets(line, sizeof(line), server) != nullptr) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == "verified") vj = j;
  }
  pclose(server);
  bool ok = put.code == 0 && pj.value("event", "") == "put" && vj.value("mismatches", -1) == 0;
  if (a.structured()) {
    Print(a, {{"ok", ok}, {"from", a.pod_b}, {"to", a.pod}, {"put", pj}, {"verified", vj}});
  } else if (ok) {
    std::cout << absl::StrFormat("%s -> %s: %s via %s in %.3f s = %.1f GB/s (incl. first-use setup), %s verified\n",
                                 a.pod_b, a.pod, Human(a.size), pj.value("transport", "?"), pj.value("seconds", 0.0),
                                 pj.value("gbps", 0.0), Human(vj.value("bytes", 0ull)));
  } else {
    std::cout << "bench failed: " << (pj.is_null() ? put.text : pj.dump()) << "\n";
  }
  return ok ? 0 : 1;
}

absl::StatusOr<std::unique_ptr<podlink::Client>> Connect(const Args& a) {
  podlink::ConnectOptions o;
  o.socket_dir = a.socket;
  o.timeout = absl::Seconds(5);
  return podlink::Client::Connect(o);
}

json NodeJson(const podlink::NodeInfo& n) {
  json gpus = json::array();
  for (const auto& g : n.gpus) {
    json peers = json::array();
    for (const auto& p : g.peers) peers.push_back({{"uuid", p.uuid}, {"nvlinks", p.link_count}, {"p2p", p.p2p_supported}});
    gpus.push_back({{"index", g.index}, {"uuid", g.uuid}, {"pci_bus_id", g.pci_bus_id}, {"device_node", g.device_node},
                    {"name", g.name}, {"memory", g.total_memory}, {"fabric", g.fabric_supported}, {"peers", peers}});
  }
  json types = json::array();
  for (auto t : n.handle_types) types.push_back(podlink::HandleTypeName(t));
  return {{"node", n.node_name}, {"node_id", n.node_id}, {"version", n.daemon_version}, {"cuda", n.cuda_available},
          {"cuda_status", n.cuda_status}, {"handle_types", types}, {"gpus", gpus}};
}

// The node's name; a podlinkd older than the node_name field reports only its boot id.
std::string NodeLabel(const podlink::NodeInfo& n) {
  return n.node_name.empty() ? "with boot id " + n.node_id : n.node_name;
}

json ExportJson(const podlink::ExportInfo& e) {
  return {{"id", e.export_id}, {"name", e.name}, {"owner", e.owner.namespace_ + "/" + e.owner.name},
          {"size", e.size}, {"type", podlink::HandleTypeName(e.handle_type)}, {"gpu", e.gpu_uuid},
          {"peer_group", e.peer_group}, {"imports", e.import_count}, {"imports_total", e.imports_total}};
}

void PrintMatrix(const podlink::NodeInfo& n) {
  if (n.gpus.size() < 2) {
    std::cout << "NVLink matrix: fewer than two GPUs\n";
    return;
  }
  std::cout << "NVLink matrix (links between GPUs; P2P = peer access without NVLink):\n      ";
  for (const auto& g : n.gpus) std::cout << absl::StrFormat("%-7s", absl::StrFormat("GPU%d", g.index));
  std::cout << "\n";
  for (const auto& g : n.gpus) {
    std::cout << absl::StrFormat("GPU%-3d", g.index);
    for (const auto& h : n.gpus) {
      std::string cell = "-";
      if (g.uuid == h.uuid) {
        cell = "X";
      } else {
        for (const auto& p : g.peers) {
          if (p.uuid == h.uuid) cell = p.link_count > 0 ? absl::StrFormat("NV%d", p.link_count) : (p.p2p_supported ? "P2P" : "-");
        }
      }
      std::cout << absl::StrFormat("%-7s", cell);
    }
    std::cout << "\n";
  }
}

int Status(const Args& a) {
  auto c = Connect(a);
  if (!c.ok()) return Fail("connect", c.status());
  auto n = (*c)->GetNodeInfo();
  if (!n.ok()) return Fail("node info", n.status());
  auto st = (*c)->GetStats();
  if (!st.ok()) return Fail("stats", st.status());
  if (a.structured()) {
    json j = NodeJson(*n);
    j["stats"] = {{"sessions", st->sessions}, {"exports", st->exports}, {"imports_total", st->imports_total},
                  {"denials_total", st->denials_total}, {"relay_rings", st->relay_rings},
                  {"relay_ops_total", st->relay_ops_total}, {"relay_bytes_total", st->relay_bytes_total},
                  {"relay_failed_total", st->relay_failed_total}, {"relay_notifies_total", st->relay_notifies_total}};
    Print(a, j);
    return 0;
  }
  std::cout << "node " << NodeLabel(*n) << ", podlinkd " << n->daemon_version << "\n";
  std::cout << "CUDA: " << (n->cuda_available ? "yes" : "no (" + n->cuda_status + ")") << "; handle types:";
  for (auto t : n->handle_types) std::cout << " " << podlink::HandleTypeName(t);
  std::cout << "\n\n";
  if (!n->gpus.empty()) {
    std::cout << absl::StrFormat("%-4s %-42s %-14s %-13s %-10s %s\n", "GPU", "UUID", "PCI", "DEVICE", "MEMORY", "FABRIC");
    for (const auto& g : n->gpus) {
      std::cout << absl::StrFormat("%-4d %-42s %-14s %-13s %-10s %s\n", g.index, g.uuid, g.pci_bus_id, g.device_node,
                                   Human(g.total_memory), g.fabric_supported ? "yes" : "no");
    }
    std::cout << "\n";
    PrintMatrix(*n);
    std::cout << "\n";
  }
  std::cout << absl::StrFormat("sessions %d, exports %d, imports %d, denials %d\n", st->sessions, st->exports,
                               st->imports_total, st->denials_total);
  std::cout << absl::StrFormat("relay: %d rings, %d ops, %s moved, %d failed, %d notifications\n", st->relay_rings,
                               st->relay_ops_total, Human(st->relay_bytes_total), st->relay_failed_total,
                               st->relay_notifies_total);
  return 0;
}

int Exports(const Args& a) {
  auto c = Connect(a);
  if (!c.ok()) return Fail("connect", c.status());
  auto l = (*c)->ListAll();
  if (!l.ok()) return Fail("list", l.status());
  if (a.structured()) {
    json j = json::array();
    for (const auto& e : *l) j.push_back(ExportJson(e));
    Print(a, j);
    return 0;
  }
  if (l->empty()) {
    std::cout << "no exports on this node\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-6s %-20s %-30s %-10s %-11s %-14s %s\n", "ID", "NAME", "OWNER", "SIZE", "TYPE",
                               "PEER-GROUP", "IMPORTS");
  for (const auto& e : *l) {
    std::cout << absl::StrFormat("%-6d %-20s %-30s %-10s %-11s %-14s %d\n", e.export_id, e.name.empty() ? "-" : e.name,
                                 e.owner.namespace_ + "/" + e.owner.name, Human(e.size),
                                 podlink::HandleTypeName(e.handle_type), e.peer_group.empty() ? "-" : e.peer_group,
                                 e.import_count);
  }
  return 0;
}

int Peers(const Args& a) {
  auto c = Connect(a);
  if (!c.ok()) return Fail("connect", c.status());
  auto n = (*c)->GetNodeInfo();
  if (!n.ok()) return Fail("node info", n.status());
  if (a.structured()) {
    Print(a, NodeJson(*n)["gpus"]);
    return 0;
  }
  PrintMatrix(*n);
  return 0;
}

// How this node confirms other nodes' pods, in one line.
std::string RemotePodsLine(const podlink::Client::MeshStatus& m) {
  if (m.remote_pods == "forwarded") {
    return "pods of other nodes: believed as their daemons state them (--remote-pods forwarded; no API server "
           "confirms them)";
  }
  if (!m.remote_pods_problem.empty()) {
    return "pods of other nodes: REFUSED, cannot be confirmed now: " + m.remote_pods_problem;
  }
  return "pods of other nodes: confirmed with the API server";
}

int Links(const Args& a) {
  auto c = Connect(a);
  if (!c.ok()) return Fail("connect", c.status());
  auto m = (*c)->GetMeshStatus();
  if (!m.ok()) return Fail("mesh status", m.status());
  auto links_json = [](const std::vector<podlink::Client::MeshLink>& links) {
    json out = json::array();
    for (const auto& l : links) {
      out.push_back({{"address", l.address}, {"netdev", l.netdev}, {"speed_mbps", l.speed_mbps},
                     {"pci_path", l.pci_path}, {"numa_node", l.numa_node}, {"rdma_device", l.rdma_device},
                     {"gid_index", l.gid_index}, {"gid_type", l.gid_type}});
    }
    return out;
  };
  // "eth1 100 Gb/s NUMA 0 mlx5_0 GID 3 (RoCE v2)"
  auto link_text = [](const podlink::Client::MeshLink& l) {
    std::string t = absl::StrCat(l.address, " ", l.netdev.empty() ? "-" : l.netdev);
    absl::StrAppend(&t, l.speed_mbps > 0 ? absl::StrFormat(" %g Gb/s", l.speed_mbps / 1000.0) : " speed ?");
    if (!l.pci_path.empty()) absl::StrAppend(&t, " ", l.pci_path.substr(l.pci_path.rfind('/') + 1));
    if (l.numa_node >= 0) absl::StrAppend(&t, " NUMA ", l.numa_node);
    if (!l.rdma_device.empty()) absl::StrAppend(&t, " ", l.rdma_device, " GID ", l.gid_index, " (", l.gid_type, ")");
    return t;
  };
  if (a.structured()) {
    json peers = json::array();
    for (const auto& p : m->peers) {
      json conns = json::array();
      for (const auto& x : p.connections) conns.push_back({{"path", x.path}, {"up", x.up}, {"bytes_sent", x.bytes_sent}});
      peers.push_back({{"node", p.node}, {"transport", p.transport}, {"connections_up", p.connections_up},
                       {"bytes_sent", p.bytes_sent},
                       {"bytes_received", p.bytes_received}, {"connection_failures", p.connection_failures},
                       {"resent_slices", p.resent_slices}, {"remote_handles", p.remote_handles},
                       {"connections", conns}, {"links", links_json(p.links)}});
    }
    json routes = json::array();
    for (const auto& r : m->routes) {
      routes.push_back({{"destination", r.destination}, {"via", r.via}, {"remote_handles", r.remote_handles}});
    }
    json known = json::array();
    for (const auto& k : m->known_nodes) {
      known.push_back({{"node", k.node}, {"addresses", k.addresses}, {"port", k.port},
                       {"advert_age_seconds", k.advert_age_seconds}});
    }
    Print(a, {{"enabled", m->enabled}, {"node", m->node_name}, {"addresses", m->addresses},
              {"links", links_json(m->links)}, {"port", m->port},
              {"data_port", m->data_port}, {"peers", peers}, {"routes", routes}, {"known_nodes", known},
              {"grants", m->grants},
              {"relayed_grants", m->relayed_grants}, {"relay_forwarded_bytes", m->relay_forwarded_bytes},
              {"served_write_bytes", m->served_write_bytes}, {"served_read_bytes", m->served_read_bytes},
              {"refused_connections", m->refused_connections}, {"refused_frames", m->refused_frames},
              {"denials", m->denials}, {"remote_pods", m->remote_pods},
              {"remote_pods_problem", m->remote_pods_problem}});
    return 0;
  }
  if (!m->enabled) {
    std::cout << "node " << m->node_name << ": the mesh is off (mesh.enabled in podlinkd's config)\n";
    return 0;
  }
  std::cout << "node " << m->node_name << ", mesh port " << m->port << ", data port " << m->data_port
            << ", addresses";
  for (const auto& x : m->addresses) std::cout << " " << x;
  std::cout << "\n";
  for (const auto& l : m->links) std::cout << "  link " << link_text(l) << "\n";
  std::cout << absl::StrFormat("peers hold %d regions of this node; served %s written, %s read; refused %d "
                               "connections, %d frames, %d opens\n\n",
                               m->grants, Human(m->served_write_bytes), Human(m->served_read_bytes),
                               m->refused_connections, m->refused_frames, m->denials);
  std::cout << RemotePodsLine(*m) << "\n\n";
  if (m->relayed_grants > 0 || m->relay_forwarded_bytes > 0) {
    std::cout << absl::StrFormat("relaying for other nodes: %d regions, %s forwarded\n\n", m->relayed_grants,
                                 Human(m->relay_forwarded_bytes));
  }
  if (!m->routes.empty()) {
    std::cout << absl::StrFormat("%-24s %-32s %s\n", "DESTINATION", "ROUTE", "REGIONS");
    for (const auto& r : m->routes) {
      std::cout << absl::StrFormat("%-24s %-32s %d\n", r.destination,
                                   r.via.empty() ? "direct" : "via " + absl::StrJoin(r.via, ","), r.remote_handles);
    }
    std::cout << "\n";
  }
  if (!m->known_nodes.empty()) {
    std::cout << absl::StrFormat("%-24s %-40s %s\n", "KNOWN NODE", "ADDRESSES", "ADVERT");
    for (const auto& k : m->known_nodes) {
      std::cout << absl::StrFormat("%-24s %-40s %s\n", k.node, absl::StrJoin(k.addresses, ","),
                                   k.advert_age_seconds < 0 ? "none (config or hello)"
                                                            : absl::StrCat(k.advert_age_seconds, " s old"));
    }
    std::cout << "\n";
  }
  if (m->peers.empty()) {
    std::cout << "no peer node contacted yet\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-24s %-9s %-6s %-10s %-10s %-9s %-7s %s\n", "PEER", "TRANSPORT", "UP", "SENT",
                               "RECEIVED", "FAILURES", "RESENT", "REGIONS");
  for (const auto& p : m->peers) {
    std::cout << absl::StrFormat("%-24s %-9s %-6s %-10s %-10s %-9d %-7d %d\n", p.node,
                                 p.transport.empty() ? "-" : p.transport,
                                 absl::StrCat(p.connections_up, "/", p.connections.size()), Human(p.bytes_sent),
                                 Human(p.bytes_received), p.connection_failures, p.resent_slices, p.remote_handles);
    for (const auto& l : p.links) std::cout << "    its link " << link_text(l) << "\n";
    for (const auto& x : p.connections) {
      std::cout << absl::StrFormat("    %-40s %-5s %s\n", x.path, x.up ? "up" : "down", Human(x.bytes_sent));
    }
  }
  return 0;
}

// podlinkd's version and node: from this node's socket, or in cluster mode
// from `kubectl-podlink version` in the podlinkd pod.
absl::StatusOr<json> DaemonVersion(const Args& a) {
  if (a.cluster()) {
    std::vector<std::string> args = {"version", "-o", "json"};
    if (!a.socket.empty()) args.insert(args.end(), {"--socket", a.socket});
    absl::StatusOr<Output> r = InDaemonPod(a, args);
    if (!r.ok()) return r.status();
    json j = json::parse(r->text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::UnavailableError("kubectl-podlink version in the podlinkd pod failed: " + Trim(r->text));
    }
    if (!j.contains("daemon_version")) return absl::UnavailableError(j.value("daemon_error", "no daemon_version"));
    return json{{"daemon_version", j["daemon_version"]}, {"node", j.value("node", "")}};
  }
  auto c = Connect(a);
  if (!c.ok()) return c.status();
  auto n = (*c)->GetNodeInfo();
  if (!n.ok()) return n.status();
  return json{{"daemon_version", n->daemon_version}, {"node", n->node_name}};
}

// This plugin's version, and podlinkd's where it is reachable (exit 0 either way).
int Version(const Args& a) {
  absl::StatusOr<json> daemon = DaemonVersion(a);
  if (a.structured()) {
    json j = {{"plugin_version", PODLINK_VERSION}};
    if (daemon.ok()) {
      j.update(*daemon);
    } else {
      j["daemon_error"] = std::string(daemon.status().message());
    }
    Print(a, j);
    return 0;
  }
  std::cout << "kubectl-podlink " << PODLINK_VERSION << "\n";
  if (daemon.ok()) {
    const std::string node = daemon->value("node", "");
    std::cout << "podlinkd " << daemon->value("daemon_version", "") << (node.empty() ? "" : " on node " + node)
              << "\n";
  } else {
    std::cout << "podlinkd: not reachable: " << daemon.status().message() << "\n";
  }
  return 0;
}

// --- doctor -------------------------------------------------------------------

struct Finding {
  bool ok;
  std::string check, detail, fix;
};

absl::StatusOr<json> ReadPod(const Args& a) {
  std::string text;
  if (!a.pod_json.empty()) {
    std::ifstream f(a.pod_json);
    if (!f) return absl::NotFoundError("cannot read " + a.pod_json);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  } else {
    Output o = Sh(Kubectl(a) + " get pod " + Q(a.pod) + " -n " + Q(a.ns) + " -o json");
    if (o.code != 0) return absl::UnavailableError("kubectl get pod failed: " + o.text.substr(0, 500));
    text = std::move(o.text);
  }
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("kind", "") != "Pod") {
    return absl::InvalidArgumentError("not a Pod object in JSON");
  }
  return j;
}

int Doctor(const Args& a) {
  auto pod = ReadPod(a);
  if (!pod.ok()) return Fail("doctor", pod.status());
  const json& p = *pod;
  // A pod from --pod-json without a namespace, and no -n: Kubernetes' default.
  std::string name = p["metadata"].value("namespace", a.ns.empty() ? "default" : a.ns) + "/" +
                     p["metadata"].value("name", a.pod);
  std::vector<Finding> f;
  json ann = p["metadata"].value("annotations", json::object());
  std::string group = ann.value("podlink.io/peer-group", "");
  f.push_back({!group.empty(), "peer group",
               group.empty() ? "no podlink.io/peer-group annotation: other pods cannot import this pod's memory, and it "
                               "can import only exports that name it"
                             : "podlink.io/peer-group=" + group,
               group.empty() ? "add the annotation podlink.io/peer-group=<job> to this pod and to its peers (same "
                               "namespace)"
                             : ""});
  bool wants_peer = false, wants_gpu = false;
  bool has_socket_mount = false;
  std::string plugin_env;
  for (const auto& c : p["spec"].value("containers", json::array())) {
    json limits = c.value("resources", json::object()).value("limits", json::object());
    wants_peer |= limits.contains("podlink.io/peer") || limits.contains("podlink.io/peer-direct");
    wants_gpu |= limits.contains("nvidia.com/gpu");
    for (const auto& m : c.value("volumeMounts", json::array())) has_socket_mount |= m.value("mountPath", "") == "/run/podlink";
    for (const auto& e : c.value("env", json::array())) {
      if (e.value("name", "") == "NCCL_NET_PLUGIN") plugin_env = e.value("value", "");
    }
  }
  f.push_back({wants_peer, "podlink.io/peer resource",
               wants_peer ? "requested: the device plugin mounts /run/podlink and the client library and sets "
                            "PODLINK_SOCKET_DIR and NCCL_NET_PLUGIN"
                          : "not requested: nothing mounts podlinkd's socket into the container",
               wants_peer ? "" : "add resources.limits[\"podlink.io/peer\"]: 1 to the container (or mount /run/podlink "
                                 "yourself and set PODLINK_SOCKET_DIR)"});
  if (!wants_peer) {
    f.push_back({has_socket_mount, "socket mount",
                 has_socket_mount ? "/run/podlink is mounted by the pod spec" : "/run/podlink is not mounted",
                 has_socket_mount ? "" : "request podlink.io/peer, or mount the host's /run/podlink at /run/podlink"});
  }
  f.push_back({wants_gpu, "GPU", wants_gpu ? "nvidia.com/gpu requested" : "no nvidia.com/gpu requested",
               wants_gpu ? "" : "host-memory sharing still works; GPU exports need a GPU in the container"});
  if (!plugin_env.empty() && plugin_env != "podlink" && plugin_env.find("podlink") == std::string::npos) {
    f.push_back({false, "NCCL environment", "NCCL_NET_PLUGIN=" + plugin_env + " overrides podlink's plugin",
                 "remove NCCL_NET_PLUGIN from the pod spec; the device plugin sets it"});
  }
  bool direct = ann.value("podlink.io/direct", "") == "true";
  bool wants_direct = false;
  for (const auto& c : p["spec"].value("containers", json::array())) {
    wants_direct |= c.value("resources", json::object()).value("limits", json::object()).contains("podlink.io/peer-direct");
  }
  if (direct && !wants_direct) {
    f.push_back({false, "direct mode",
                 "podlink.io/direct=true, but without the podlink.io/peer-direct resource the peers' device nodes are "
                 "not in the container, so transfers go through the relay",
                 "request podlink.io/peer-direct: 1 instead of podlink.io/peer (it also mounts every GPU's /dev/nvidiaN)"});
  } else {
    f.push_back({true, "direct mode",
                 wants_direct ? "podlink.io/peer-direct requested: peers' GPU memory is mapped in-process"
                              : "off: peers' GPU memory moves through podlinkd's relay (about as fast at large sizes)",
                 ""});
  }
  // NCCL native mode (docs/nccl.md): what podlinkd's JoinNcclNative checks, from the pod spec.
  if (ann.value("podlink.io/nccl-native", "") == "true") {
    std::vector<std::string> missing;
    if (group.empty()) missing.push_back("a podlink.io/peer-group annotation (native mode joins one group's pods)");
    if (!wants_direct) {
      missing.push_back("the podlink.io/peer-direct resource (NCCL's P2P maps the peers' GPU memory itself)");
    }
    if (p["spec"].value("hostNetwork", false)) {
      missing.push_back("a network namespace of its own (hostNetwork pods cannot be bridged)");
    }
    f.push_back({missing.empty(), "NCCL native mode",
                 missing.empty()
                     ? "asked for and allowed by the spec: NCCL's log should show 'NCCL native mode' and 'via P2P/CUMEM'"
                     : "podlink.io/nccl-native=true, but the pod lacks " + absl::StrJoin(missing, "; and ") +
                           ": NCCL stays on the podlink relay",
                 missing.empty() ? "" : "add what is missing, or drop the annotation to stay on the relay"});
  } else {
    f.push_back({true, "NCCL native mode",
                 "off: NCCL reaches this node's pods through the podlink relay (annotate podlink.io/nccl-native=true "
                 "with podlink.io/peer-direct for NCCL's own P2P between the group's pods)",
                 ""});
  }
  std::string phase = p.value("status", json::object()).value("phase", "");
  f.push_back({phase == "Running", "phase", phase.empty() ? "unknown" : phase,
               phase == "Running" ? "" : "wait for the pod to run; `kubectl describe pod` says why it does not"});
  // What podlinkd on this node knows, where reachable.
  auto c = Connect(a);
  if (c.ok()) {
    auto l = (*c)->ListAll();
    if (l.ok()) {
      int owned = 0;
      for (const auto& e : *l) owned += (e.owner.namespace_ + "/" + e.owner.name) == name;
      f.push_back({true, "podlinkd", absl::StrFormat("reachable; %d export(s) owned by %s", owned, name), ""});
    }
    // Imports by pods of other nodes (the mesh): how this node confirms them.
    if (auto m = (*c)->GetMeshStatus(); m.ok() && m->enabled) {
      if (m->remote_pods == "forwarded") {
        f.push_back({false, "pods of other nodes",
                     "believed as their daemons state them (--remote-pods forwarded): a node with a mesh certificate "
                     "can speak for any pod",
                     "start podlinkd with --remote-pods apiserver (the chart and deploy/ do), with a service account "
                     "that may get, list and watch pods"});
      } else if (!m->remote_pods_problem.empty()) {
        f.push_back({false, "pods of other nodes",
                     "refused: podlinkd cannot confirm them with the API server now (" + m->remote_pods_problem + ")",
                     "check the API server and podlinkd's service account; imports from other nodes resume once "
                     "the API server answers"});
      } else {
        f.push_back({true, "pods of other nodes", "confirmed with the API server", ""});
      }
    }
  }
  bool all_ok = true;
  for (const auto& x : f) all_ok &= x.ok;
  if (a.structured()) {
    json j = {{"pod", name}, {"ok", all_ok}, {"checks", json::array()}};
    for (const auto& x : f) j["checks"].push_back({{"check", x.check}, {"ok", x.ok}, {"detail", x.detail}, {"fix", x.fix}});
    Print(a, j);
  } else {
    std::cout << "pod " << name << ":\n";
    for (const auto& x : f) {
      std::cout << (x.ok ? "  ok    " : "  FIX   ") << x.check << ": " << x.detail << "\n";
      if (!x.fix.empty()) std::cout << "        -> " << x.fix << "\n";
    }
    std::cout << (all_ok ? "nothing to fix\n" : "fix the items marked FIX\n");
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const podlink::cli::Program program{"kubectl-podlink", PODLINK_VERSION, kUsage, __FILE__};
  std::vector<std::string> args = LongOptions(argc, argv);
  std::vector<char*> args_c;
  for (std::string& arg : args) args_c.push_back(arg.data());
  absl::StatusOr<Args> parsed =
      ArgsFromFlags(podlink::cli::Parse(static_cast<int>(args_c.size()), args_c.data(), program));
  if (!parsed.ok()) {
    std::cerr << "kubectl-podlink: " << parsed.status().message() << " (--help lists the options)\n";
    return 2;
  }
  Args a = *std::move(parsed);
  const bool node_cmd = a.cmd == "status" || a.cmd == "exports" || a.cmd == "peers" || a.cmd == "links" ||
                        a.cmd == "version";
  // Commands that look pods up need their namespace: -n, else the context's.
  // Nothing else runs kubectl (status on a node needs neither kubectl nor a kubeconfig).
  const bool looks_up_pods = a.cmd == "bench" || (a.cmd == "doctor" && a.pod_json.empty()) ||
                             (node_cmd && a.node.empty() && !a.for_pod.empty());
  if (looks_up_pods) {
    absl::StatusOr<std::string> ns = PodNamespace(a);
    if (!ns.ok()) return Fail(a.cmd, ns.status());
    a.ns = *ns;
  }
  if (a.cmd == "version") return Version(a);
  if (node_cmd && a.cluster()) return ViaCluster(a);
  if (a.cmd == "bench") return Bench(a);
  if (a.cmd == "status") return Status(a);
  if (a.cmd == "exports") return Exports(a);
  if (a.cmd == "peers") return Peers(a);
  if (a.cmd == "links") return Links(a);
  return Doctor(a);
}
