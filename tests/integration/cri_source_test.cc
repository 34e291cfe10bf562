// podlinkd with --pod-source cri against a test container runtime: namespaced
// client processes resolve to their pods (name, namespace, annotations from
// the sandbox), the annotation drives policy, new pods are found on a cache
// miss, unknown pods are refused, and host processes still get an identity.
#include <unistd.h>

#include <mutex>

#include "cri/runtime/v1/api.grpc.pb.h"
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

  void Add(const std::string& uid, const std::string& ns, const std::string& name, const std::string& group,
           bool ready = true, uint32_t attempt = 0) {
    std::lock_guard<std::mutex> l(mu_);
    runtime::v1::PodSandbox sb;
    sb.set_id("sandbox-" + uid.substr(0, 8) + "-" + std::to_string(attempt));
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

 private:
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<runtime::v1::PodSandbox> items_;
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
  rt.Add(prefill.pod_uid(), "ml", "prefill-0", "job-7", true, 1);
  rt.Add(decode.pod_uid(), "ml", "decode-0", "job-7");
  rt.Add(other.pod_uid(), "ml", "other", "");
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
  rt.Add(late.pod_uid(), "ml", "late-0", "job-7");
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

}  // namespace
}  // namespace podlink::testing
