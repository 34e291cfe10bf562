// podlinkd with --pod-source cri against a test container runtime: namespaced
// client processes resolve to their pods (name, namespace, annotations from
// the sandbox), the annotation drives policy, new pods are found on a cache
// miss, unknown pods are refused, a cgroup whose container the runtime lists
// under another pod (or not at all) is refused, and host processes still get
// an identity.
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

class TestRuntime final : public runtime::v1::RuntimeService::Service {
 public:
  explicit TestRuntime(const std::string& path) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~TestRuntime() { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }

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
  // Lists container `id` in the sandbox `sandbox_id`.
  void AddContainer(const std::string& sandbox_id, const std::string& id,
                    runtime::v1::ContainerState state = runtime::v1::CONTAINER_RUNNING) {
    std::lock_guard<std::mutex> l(mu_);
    runtime::v1::Container c;
    c.set_id(id);
    c.set_pod_sandbox_id(sandbox_id);
    c.mutable_metadata()->set_name("main");
    c.set_state(state);
    containers_.push_back(c);
  }
  int lists() {
    std::lock_guard<std::mutex> l(mu_);
    return lists_;
  }
  grpc::Status ListPodSandbox(grpc::ServerContext*, const runtime::v1::ListPodSandboxRequest*,
                              runtime::v1::ListPodSandboxResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    ++lists_;
    for (const auto& sb : items_) *resp->add_items() = sb;
    return grpc::Status::OK;
  }
  grpc::Status ListContainers(grpc::ServerContext*, const runtime::v1::ListContainersRequest*,
                              runtime::v1::ListContainersResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& c : containers_) *resp->add_containers() = c;
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<runtime::v1::PodSandbox> items_;
  std::vector<runtime::v1::Container> containers_;
  int lists_ = 0;
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
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the refresh rate limit
  Pod newcomer(d, &late, {"import", "--name", "kv", "--verify", "4"});
  EXPECT_EQ(newcomer.Expect("verified")["mismatches"], 0);
  EXPECT_GT(rt.lists(), lists);

  // A pod the runtime does not know is refused, with a reason in the log.
  Pod stranger(d, &unknown, {"info"});
  nlohmann::json s = stranger.Expect("info");
  EXPECT_EQ(s["event"], "error");
  EXPECT_EQ(s["code"], "UNAVAILABLE") << s.dump();
  EXPECT_TRUE(d.WaitForLog("not known to the container runtime")) << d.Log();

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
  EXPECT_TRUE(d.WaitForLog("did not list pod sandboxes")) << d.Log();
  EXPECT_TRUE(d.Alive());
}

// The hardening check: the container a cgroup names must be one of the pod's.
TEST(CriSource, ContainerOfAnotherPodIsRefused) {
  std::string sock = TempSocket();
  TestRuntime rt(sock);
  PodCgroup a(RandomPodUid(), "besteffort"), b(RandomPodUid(), "burstable");
  rt.Add(a.pod_uid(), "ml", "a-0", "job-7");
  std::string b_sandbox = rt.Add(b.pod_uid(), "ml", "b-0", "job-7");
  rt.AddContainer(b_sandbox, b.container_id());
  rt.AddContainer(b_sandbox, a.container_id());  // the container a's cgroup names is b's
  Daemon d("{}", {"--pod-source", "cri", "--cri-socket", sock});

  Pod impostor(d, &a, {"info"});
  nlohmann::json s = impostor.Expect("info");
  EXPECT_EQ(s["event"], "error");
  EXPECT_EQ(s["code"], "PERMISSION_DENIED") << s.dump();
  EXPECT_TRUE(d.WaitForLog("lists its container " + a.container_id() + " under pod ml/b-0")) << d.Log();

  Pod owner(d, &b, {"info"});  // the pod the runtime names is still served
  EXPECT_EQ(owner.Expect("info")["identity"]["pod"], "b-0");
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
  EXPECT_TRUE(d.WaitForLog("container " + pod.container_id() + " (from the client's cgroup) of pod ml/fresh-0")) << d.Log();

  // A container just created: once the runtime lists it, the next miss finds it.
  int lists = rt.lists();
  rt.AddContainer(sandbox, pod.container_id());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the refresh rate limit
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

}  // namespace
}  // namespace podlink::testing
