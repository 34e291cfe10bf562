// podlinkd with --pod-source cri against a test container runtime: namespaced
// client processes resolve to their pods (name, namespace, annotations from
// the sandbox), the annotation drives policy, new pods are found on a cache
// miss, unknown pods are refused, a cgroup whose container the runtime lists
// under another pod (or not at all) is refused, and host processes still get
// an identity.
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>

#include "absl/strings/ascii.h"
#include "cri/runtime/v1/api.grpc.pb.h"
#include "daemon/identity/cri_source.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "podlink/client.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

// A container runtime's RuntimeService as the kubelet leaves it: sandboxes
// and containers labelled with their pod's uid, filters honoured as
// containerd honours them. Stall() makes every call wait (as a runtime
// stopped with SIGSTOP) until Stall(false) or the caller's deadline.
class TestRuntime final : public runtime::v1::RuntimeService::Service {
 public:
  explicit TestRuntime(const std::string& path) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~TestRuntime() {
    Stall(false);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  // Adds a pod sandbox (id `sandbox_id`, or one made up) and returns its id.
  std::string Add(const std::string& uid, const std::string& ns, const std::string& name, const std::string& group,
                  bool ready = true, uint32_t attempt = 0, const std::string& sandbox_id = "") {
    std::lock_guard<std::mutex> l(mu_);
    runtime::v1::PodSandbox sb;
    sb.set_id(sandbox_id.empty() ? "sandbox-" + uid.substr(0, 8) + "-" + std::to_string(attempt) : sandbox_id);
    sb.mutable_metadata()->set_uid(uid);
    sb.mutable_metadata()->set_namespace_(ns);
    sb.mutable_metadata()->set_name(name);
    sb.mutable_metadata()->set_attempt(attempt);
    sb.set_state(ready ? runtime::v1::SANDBOX_READY : runtime::v1::SANDBOX_NOTREADY);
    sb.set_created_at(1700000000000000000LL + attempt);
    (*sb.mutable_labels())["io.kubernetes.pod.uid"] = uid;
    (*sb.mutable_labels())["io.kubernetes.pod.name"] = name;
    (*sb.mutable_annotations())["kubernetes.io/config.source"] = "api";
    if (!group.empty()) (*sb.mutable_annotations())["podlink.io/peer-group"] = group;
    sb.set_runtime_handler("runc");
    items_.push_back(sb);
    return sb.id();
  }
  void SetReady(const std::string& sandbox_id, bool ready) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& sb : items_) {
      if (sb.id() == sandbox_id) sb.set_state(ready ? runtime::v1::SANDBOX_READY : runtime::v1::SANDBOX_NOTREADY);
    }
  }
  // Lists container `id` in the sandbox `sandbox_id`, labelled with its pod's uid as the kubelet does.
  void AddContainer(const std::string& sandbox_id, const std::string& id,
                    runtime::v1::ContainerState state = runtime::v1::CONTAINER_RUNNING) {
    std::lock_guard<std::mutex> l(mu_);
    runtime::v1::Container c;
    c.set_id(id);
    c.set_pod_sandbox_id(sandbox_id);
    c.mutable_metadata()->set_name("main");
    c.set_state(state);
    for (const auto& sb : items_) {
      if (sb.id() == sandbox_id) (*c.mutable_labels())["io.kubernetes.pod.uid"] = sb.metadata().uid();
    }
    containers_.push_back(c);
  }
  void Stall(bool on) {
    std::lock_guard<std::mutex> l(mu_);
    stalled_ = on;
  }
  int lists() {
    std::lock_guard<std::mutex> l(mu_);
    return lists_;
  }
  // Every ListPodSandbox named a pod (by the uid label) or a sandbox id: none listed everything.
  bool every_list_filtered() {
    std::lock_guard<std::mutex> l(mu_);
    return unfiltered_ == 0;
  }

  grpc::Status Version(grpc::ServerContext* ctx, const runtime::v1::VersionRequest*,
                       runtime::v1::VersionResponse* resp) override {
    if (!Wait(ctx)) return grpc::Status(grpc::StatusCode::CANCELLED, "stalled");
    resp->set_version("0.1.0");
    resp->set_runtime_name("test-runtime");
    resp->set_runtime_version("1.0");
    resp->set_runtime_api_version("v1");
    return grpc::Status::OK;
  }
  grpc::Status ListPodSandbox(grpc::ServerContext* ctx, const runtime::v1::ListPodSandboxRequest* req,
                              runtime::v1::ListPodSandboxResponse* resp) override {
    if (!Wait(ctx)) return grpc::Status(grpc::StatusCode::CANCELLED, "stalled");
    std::lock_guard<std::mutex> l(mu_);
    ++lists_;
    const auto& f = req->filter();
    if (f.id().empty() && f.label_selector().empty()) ++unfiltered_;
    for (const auto& sb : items_) {
      if ((f.id().empty() || f.id() == sb.id()) && Selected(f.label_selector(), sb.labels())) *resp->add_items() = sb;
    }
    return grpc::Status::OK;
  }
  grpc::Status ListContainers(grpc::ServerContext* ctx, const runtime::v1::ListContainersRequest* req,
                              runtime::v1::ListContainersResponse* resp) override {
    if (!Wait(ctx)) return grpc::Status(grpc::StatusCode::CANCELLED, "stalled");
    std::lock_guard<std::mutex> l(mu_);
    const auto& f = req->filter();
    for (const auto& c : containers_) {
      if ((f.id().empty() || f.id() == c.id()) && (f.pod_sandbox_id().empty() || f.pod_sandbox_id() == c.pod_sandbox_id()) &&
          Selected(f.label_selector(), c.labels())) {
        *resp->add_containers() = c;
      }
    }
    return grpc::Status::OK;
  }

 private:
  static bool Selected(const google::protobuf::Map<std::string, std::string>& selector,
                       const google::protobuf::Map<std::string, std::string>& labels) {
    for (const auto& [k, v] : selector) {
      auto it = labels.find(k);
      if (it == labels.end() || it->second != v) return false;
    }
    return true;
  }
  bool Wait(grpc::ServerContext* ctx) {
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!stalled_) return true;
      }
      if (ctx->IsCancelled()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<runtime::v1::PodSandbox> items_;
  std::vector<runtime::v1::Container> containers_;
  int lists_ = 0;
  int unfiltered_ = 0;
  bool stalled_ = false;
};

// Another container of `pod` (a second cgroup under the pod's), removed at the end.
class SecondContainer {
 public:
  explicit SecondContainer(const PodCgroup& pod) {
    id_ = std::string(48, 'c') + pod.container_id().substr(0, 16);
    path_ = pod.path().substr(0, pod.path().rfind('/')) + "/cri-containerd-" + id_ + ".scope";
    EXPECT_EQ(::mkdir(path_.c_str(), 0755), 0) << path_;
  }
  ~SecondContainer() {
    for (int i = 0; i < 100 && ::rmdir(path_.c_str()) != 0 && errno == EBUSY; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  const std::string& id() const { return id_; }
  const std::string& path() const { return path_; }

 private:
  std::string id_, path_;
};

std::string TempSocket() {
  char tmpl[] = "/tmp/podlink-cri-XXXXXX";
  return std::string(::mkdtemp(tmpl)) + "/cri.sock";
}

TEST(CriSource, PodsResolveThroughTheRuntimeAndAnnotationsDrivePolicy) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup prefill(RandomPodUid(), "burstable"), decode(RandomPodUid(), "besteffort"),
      other(RandomPodUid(), "besteffort"), late(RandomPodUid(), "besteffort"), unknown(RandomPodUid(), "besteffort");
  // An old, not-ready attempt of prefill's sandbox with other annotations: the ready one wins.
  rt.Add(prefill.pod_uid(), "ml", "prefill-0", "stale-group", /*ready=*/false, /*attempt=*/0);
  rt.AddContainer(rt.Add(prefill.pod_uid(), "ml", "prefill-0", "job-7", true, 1), prefill.container_id());
  // Runtimes list lowercase ids; the check compares them in lowercase anyway.
  rt.AddContainer(rt.Add(decode.pod_uid(), "ml", "decode-0", "job-7"), absl::AsciiStrToUpper(decode.container_id()));
  rt.AddContainer(rt.Add(other.pod_uid(), "ml", "other", ""), other.container_id());
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});

  Pod who(d, &prefill, {"info"});
  nlohmann::json id = who.Expect("info")["identity"];
  EXPECT_EQ(id["namespace"], "ml");
  EXPECT_EQ(id["pod"], "prefill-0");
  EXPECT_EQ(id["pod_uid"], prefill.pod_uid());
  EXPECT_EQ(id["annotations"]["podlink.io/peer-group"], "job-7");
  EXPECT_EQ(id["annotations"]["kubernetes.io/config.source"], "api");

  Pod exporter(d, &prefill, {"export", "--size", "65536", "--name", "kv", "--seed", "4", "--commands"});
  ASSERT_EQ(exporter.Expect("exported")["event"], "exported");
  Pod ok(d, &decode, {"import", "--name", "kv", "--verify", "4"});
  EXPECT_EQ(ok.Expect("verified")["mismatches"], 0);
  Pod denied(d, &other, {"import", "--name", "kv"});
  nlohmann::json e = denied.Expect("imported");
  EXPECT_EQ(e["code"], "PERMISSION_DENIED") << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find("ml/other"), std::string::npos);

  // A pod created after the daemon started is found on the cache miss.
  int lists = rt.lists();
  rt.AddContainer(rt.Add(late.pod_uid(), "ml", "late-0", "job-7"), late.container_id());
  Pod newcomer(d, &late, {"import", "--name", "kv", "--verify", "4"});
  EXPECT_EQ(newcomer.Expect("verified")["mismatches"], 0);
  EXPECT_GT(rt.lists(), lists);

  // A pod the runtime does not know is refused, with a reason in the log.
  Pod stranger(d, &unknown, {"info"});
  nlohmann::json s = stranger.Expect("info");
  EXPECT_EQ(s["event"], "error");
  EXPECT_EQ(s["code"], "UNAVAILABLE") << s.dump();
  // The client is told why, not only the log.
  EXPECT_NE(s["message"].get<std::string>().find("pod " + unknown.pod_uid() + " (from the client's cgroup) is not "
                                                 "known to the container runtime"),
            std::string::npos) << s.dump();

  // Host processes (no pod cgroup) still get the standalone identity.
  auto host = Client::Connect({.socket_dir = d.dir()});
  ASSERT_TRUE(host.ok()) << host.status();
  auto me = (*host)->WhoAmI();
  ASSERT_TRUE(me.ok());
  EXPECT_EQ(me->namespace_, "standalone");
}

TEST(CriSource, RuntimeDownRefusesPodsClearly) {
  std::string sock = TempSocket();  // nothing listens there
  PodCgroup pod(RandomPodUid(), "besteffort");
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});
  Pod p(d, &pod, {"info"});
  nlohmann::json s = p.Expect("info");
  EXPECT_EQ(s["event"], "error");
  EXPECT_EQ(s["code"], "UNAVAILABLE") << s.dump();
  EXPECT_NE(s["message"].get<std::string>().find("did not list the sandboxes of pod " + pod.pod_uid()),
            std::string::npos) << s.dump();
  // Not ready while the runtime does not answer, and /readyz says why.
  Http ready = HttpGet(d.metrics_port(), "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("container runtime at " + sock), std::string::npos) << ready.body;
  EXPECT_EQ(d.Metric("podlink_container_runtime_up"), 0);
  EXPECT_TRUE(d.Alive());
}

// The hardening check: the container a cgroup names must be one of the pod's.
TEST(CriSource, ContainerOfAnotherPodIsRefused) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup a(RandomPodUid(), "besteffort"), b(RandomPodUid(), "burstable");
  rt.Add(a.pod_uid(), "ml", "a-0", "job-7");
  std::string b_sandbox = rt.Add(b.pod_uid(), "ml", "other-pod", "job-7");
  rt.AddContainer(b_sandbox, b.container_id());
  rt.AddContainer(b_sandbox, a.container_id());  // the container a's cgroup names is b's
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});

  Pod impostor(d, &a, {"info"});
  nlohmann::json s = impostor.Expect("info");
  EXPECT_EQ(s["event"], "error");
  EXPECT_EQ(s["code"], "PERMISSION_DENIED") << s.dump();
  // The log names the other pod; the client is told only that it is another.
  EXPECT_TRUE(d.WaitForLog("runtime_pod=\"ml/other-pod\"")) << d.Log();
  EXPECT_NE(s["message"].get<std::string>().find("lists its container " + a.container_id() + " under another pod"),
            std::string::npos) << s.dump();
  // (A name no hex digit or UUID can spell: the message holds a's cgroup path, random hex.)
  EXPECT_EQ(s["message"].get<std::string>().find("other-pod"), std::string::npos) << s.dump();
  EXPECT_EQ(s["message"].get<std::string>().find(b.pod_uid()), std::string::npos) << s.dump();

  Pod owner(d, &b, {"info"});  // the pod the runtime names is still served
  EXPECT_EQ(owner.Expect("info")["identity"]["pod"], "other-pod");
  EXPECT_TRUE(d.Alive());
}

TEST(CriSource, ContainerUnknownToTheRuntimeIsRefusedUntilListed) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup pod(RandomPodUid(), "besteffort");
  std::string sandbox = rt.Add(pod.pod_uid(), "ml", "fresh-0", "");  // the pod is known, its container not
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});

  Pod early(d, &pod, {"info"});
  nlohmann::json s = early.Expect("info");
  EXPECT_EQ(s["event"], "error");
  EXPECT_EQ(s["code"], "UNAVAILABLE") << s.dump();
  EXPECT_NE(s["message"].get<std::string>().find("container " + pod.container_id() +
                                                 " (from the client's cgroup) of pod ml/fresh-0"),
            std::string::npos) << s.dump();

  // A container just created: once the runtime lists it, the next miss finds it.
  int lists = rt.lists();
  rt.AddContainer(sandbox, pod.container_id());
  Pod later(d, &pod, {"info"});
  EXPECT_EQ(later.Expect("info")["identity"]["pod"], "fresh-0");
  EXPECT_GT(rt.lists(), lists);
}

// A sandbox's own (pause container's) cgroup is its pod's, and an exited
// container still belongs to its pod.
TEST(CriSource, SandboxAndExitedContainersBelongToTheirPod) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup pause(RandomPodUid(), "besteffort"), exited(RandomPodUid(), "besteffort");
  rt.Add(pause.pod_uid(), "ml", "pause-0", "", true, 0, /*sandbox_id=*/pause.container_id());
  rt.AddContainer(rt.Add(exited.pod_uid(), "ml", "exited-0", ""), exited.container_id(),
                  runtime::v1::CONTAINER_EXITED);
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});

  Pod in_sandbox(d, &pause, {"info"});
  EXPECT_EQ(in_sandbox.Expect("info")["identity"]["pod"], "pause-0");
  Pod in_exited(d, &exited, {"info"});
  EXPECT_EQ(in_exited.Expect("info")["identity"]["pod"], "exited-0");
}

// The cgroup parser already refuses a process in a pod's cgroup but in none
// of its containers, so podlinkd never gets here with one; the CRI source
// refuses it on its own too.
TEST(CriSource, ProcessInThePodCgroupItselfIsRefused) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  std::string uid = RandomPodUid();
  std::string container(64, 'a');
  rt.AddContainer(rt.Add(uid, "ml", "direct-0", ""), container);
  CriPodSource source(sock, /*fallback=*/nullptr);  // pods only

  PeerIdentity peer;
  peer.cgroup.path = "/kubepods.slice/kubepods-pod" + uid + ".slice";
  peer.cgroup.pod_uid = uid;
  absl::StatusOr<PodInfo> direct = source.Resolve(peer);
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kPermissionDenied) << direct.status();

  peer.cgroup.container_id = container;  // the same pod, in its container
  absl::StatusOr<PodInfo> contained = source.Resolve(peer);
  ASSERT_TRUE(contained.ok()) << contained.status();
  EXPECT_EQ(contained->Ref(), "ml/direct-0");
}

// Pods are looked up one at a time (the uid label), as soon as they miss:
// a pod created just after another is found at once, static pods' 32-hex
// uids too, and no call lists every pod on the node.
TEST(CriSource, EachPodIsLookedUpAloneTheMomentItMisses) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup first(RandomPodUid(), "besteffort");
  rt.AddContainer(rt.Add(first.pod_uid(), "ml", "first-0", ""), first.container_id());
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});
  Pod a(d, &first, {"info"});
  EXPECT_EQ(a.Expect("info")["identity"]["pod"], "first-0");

  PodCgroup second(RandomPodUid(), "besteffort");  // created right after: no window to wait out
  rt.AddContainer(rt.Add(second.pod_uid(), "ml", "second-0", ""), second.container_id());
  Pod b(d, &second, {"info"});
  EXPECT_EQ(b.Expect("info")["identity"]["pod"], "second-0");

  std::string static_uid = "0123456789abcdef0123456789abcdef";  // the kubelet's hash for a static pod
  PodCgroup mirror(static_uid, "burstable");
  rt.AddContainer(rt.Add(static_uid, "kube-system", "etcd-node1", ""), mirror.container_id());
  Pod c(d, &mirror, {"info"});
  nlohmann::json id = c.Expect("info")["identity"];
  EXPECT_EQ(id["pod"], "etcd-node1");
  EXPECT_EQ(id["pod_uid"], static_uid);

  EXPECT_TRUE(rt.every_list_filtered());
  // Known pods are answered from the cache.
  int lists = rt.lists();
  Pod again(d, &first, {"info"});
  EXPECT_EQ(again.Expect("info")["identity"]["pod"], "first-0");
  EXPECT_EQ(rt.lists(), lists);
  EXPECT_GE(d.Metric("podlink_pod_cache_pods").value_or(0), 3);
}

// A runtime that stops answering (SIGSTOP) holds up only the clients of pods
// it must be asked about: known pods connect, and open sessions keep
// exporting and importing, while a new pod's client waits.
TEST(CriSource, AStalledRuntimeDelaysOnlyPodsNotYetKnown) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup known(RandomPodUid(), "besteffort"), peer(RandomPodUid(), "besteffort"), fresh(RandomPodUid(), "besteffort");
  rt.AddContainer(rt.Add(known.pod_uid(), "ml", "known-0", "job"), known.container_id());
  rt.AddContainer(rt.Add(peer.pod_uid(), "ml", "peer-0", "job"), peer.container_id());
  rt.AddContainer(rt.Add(fresh.pod_uid(), "ml", "fresh-0", "job"), fresh.container_id());
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});
  Pod warm(d, &peer, {"info"});  // cached before the stall
  EXPECT_EQ(warm.Expect("info")["identity"]["pod"], "peer-0");
  Pod exporter(d, &known, {"export", "--size", "65536", "--name", "kv", "--seed", "5", "--commands"});
  ASSERT_EQ(exporter.Expect("exported")["event"], "exported");

  rt.Stall(true);
  Pod waiting(d, &fresh, {"info"});  // must ask the runtime: waits
  EXPECT_FALSE(waiting.Next(500).has_value()) << "answered although the runtime is stalled";
  Pod importer(d, &peer, {"import", "--name", "kv", "--verify", "5"});
  EXPECT_EQ(importer.Expect("verified", 2500)["mismatches"], 0);
  Pod second(d, &known, {"export", "--size", "65536", "--name", "kv2", "--seed", "6"});  // offers a descriptor
  nlohmann::json more = second.Expect("exported", 2500);
  EXPECT_EQ(more["event"], "exported") << more.dump();
  std::optional<nlohmann::json> still = waiting.Next(0);
  EXPECT_FALSE(still.has_value()) << "the new pod was answered during the stall: " << still->dump();

  rt.Stall(false);  // the waiting client is answered once the runtime is
  nlohmann::json late = waiting.Expect("info");
  EXPECT_TRUE(late["event"] == "info" || late["code"] == "UNAVAILABLE") << late.dump();
}

// After a runtime restart new pods are found within a second or so (gRPC's
// reconnect backoff is capped), and /readyz follows the runtime.
TEST(CriSource, ARestartedRuntimeIsReachedAgainPromptly) {
  std::string sock = TempSocket();
  auto rt = std::make_unique<TestRuntime>(sock);
  PodCgroup before(RandomPodUid(), "besteffort"), after(RandomPodUid(), "besteffort");
  rt->AddContainer(rt->Add(before.pod_uid(), "ml", "before-0", ""), before.container_id());
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});
  Pod a(d, &before, {"info"});
  EXPECT_EQ(a.Expect("info")["identity"]["pod"], "before-0");
  EXPECT_EQ(HttpGet(d.metrics_port(), "/readyz").status, 200);

  rt.reset();  // the runtime goes away...
  Pod during(d, &after, {"info"});
  EXPECT_EQ(during.Expect("info")["code"], "UNAVAILABLE");
  bool unready = false;
  for (int i = 0; i < 100 && !unready; ++i) {  // the prober asks every 5 s
    unready = HttpGet(d.metrics_port(), "/readyz").status == 503;
    if (!unready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(unready);

  rt = std::make_unique<TestRuntime>(sock);  // ...and comes back, with a new pod
  rt->AddContainer(rt->Add(after.pod_uid(), "ml", "after-0", ""), after.container_id());
  auto t0 = std::chrono::steady_clock::now();
  Pod back(d, &after, {"info"});
  EXPECT_EQ(back.Expect("info")["identity"]["pod"], "after-0");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 10) << "gRPC's default backoff would take up to two minutes";
  bool ready = false;
  for (int i = 0; i < 100 && !ready; ++i) {
    ready = HttpGet(d.metrics_port(), "/readyz").status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(ready);
  EXPECT_EQ(d.Metric("podlink_container_runtime_up"), 1);
}

// A pod whose sandbox is re-created (attempt 1, new annotations) is seen anew
// by the first client of the new sandbox's containers.
TEST(CriSource, ARecreatedSandboxBringsItsNewAnnotations) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup pod(RandomPodUid(), "besteffort");
  std::string first = rt.Add(pod.pod_uid(), "ml", "svc-0", "group-a", true, 0);
  rt.AddContainer(first, pod.container_id());
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});
  Pod old(d, &pod, {"info"});
  EXPECT_EQ(old.Expect("info")["identity"]["annotations"]["podlink.io/peer-group"], "group-a");

  rt.SetReady(first, false);
  SecondContainer next(pod);
  rt.AddContainer(rt.Add(pod.pod_uid(), "ml", "svc-0", "group-b", true, 1), next.id());
  Pod renewed(d, next.path(), {"info"}, "");
  EXPECT_EQ(renewed.Expect("info")["identity"]["annotations"]["podlink.io/peer-group"], "group-b");
}

// Clients of one pod waiting for the runtime are bounded: the rest are told
// so at once instead of piling up descriptors in podlinkd.
TEST(CriSource, ClientsWaitingForTheRuntimeAreBoundedPerPod) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup pod(RandomPodUid(), "besteffort");
  rt.AddContainer(rt.Add(pod.pod_uid(), "ml", "many-0", ""), pod.container_id());
  PodCgroup other(RandomPodUid(), "besteffort");
  rt.AddContainer(rt.Add(other.pod_uid(), "ml", "warm-0", ""), other.container_id());
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});
  {
    // A client of another pod served first: the runtime's connection and
    // what gRPC makes on first use are then open before counting (without it
    // the count raced the first connection to the runtime).
    Pod warm(d, &other, {"info"});
    EXPECT_EQ(warm.Expect("info")["identity"]["pod"], "warm-0");
    warm.Wait();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int fds_before = d.OpenFds();
  rt.Stall(true);
  std::vector<std::unique_ptr<Pod>> clients;
  for (int i = 0; i < 24; ++i) clients.push_back(std::make_unique<Pod>(d, &pod, std::vector<std::string>{"info"}));
  int refused = 0;
  for (auto& c : clients) {
    std::optional<nlohmann::json> r = c->Next(1500);
    if (r && (*r)["code"] == "RESOURCE_EXHAUSTED") ++refused;
  }
  EXPECT_GE(refused, 24 - 8 - 1) << d.Log();  // 8 may wait, 1 is being resolved
  // The lookups that timed out are the pod's answer for a second; then it is served.
  rt.Stall(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  Pod after(d, &pod, {"info"});
  EXPECT_EQ(after.Expect("info")["identity"]["pod"], "many-0");
  // Every connection, refused, timed out or served, is closed again in podlinkd.
  clients.clear();
  after.Wait();
  int fds = d.OpenFds();
  for (int i = 0; i < 100 && fds > fds_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fds = d.OpenFds();
  }
  EXPECT_LE(fds, fds_before) << "podlinkd kept descriptors of its clients";
}

// Clients queued behind a lookup the runtime did not answer get its failure at
// once instead of a lookup (and its deadline) each.
TEST(CriSource, AFailedLookupAnswersThePodsQueuedClientsAtOnce) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup pod(RandomPodUid(), "besteffort");
  rt.AddContainer(rt.Add(pod.pod_uid(), "ml", "queued-0", ""), pod.container_id());
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});
  rt.Stall(true);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Pod>> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(std::make_unique<Pod>(d, &pod, std::vector<std::string>{"info"}));
  for (auto& c : clients) {
    nlohmann::json r = c->Expect("info", 15000);
    EXPECT_EQ(r["code"], "UNAVAILABLE") << r.dump();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 6.0) << "six queued clients took one lookup each (3 s deadline)";
  rt.Stall(false);
}

}  // namespace
}  // namespace podlink::testing
