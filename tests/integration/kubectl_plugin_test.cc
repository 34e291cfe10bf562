// kubectl-podlink: found by `kubectl plugin list`, its commands run against a
// live podlinkd (tables, -o json and -o yaml, the node's name, version),
// node-wide views refused inside a pod, doctor on pod fixtures.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "common/command.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

using ShellResult = CommandOutput;

// `cmd` with the built kubectl-podlink first on PATH.
ShellResult Shell(const std::string& cmd) {
  return RunCommand(absl::StrCat("PATH=", KUBECTL_PODLINK_DIR, ":$PATH ", cmd));
}

nlohmann::json Json(const ShellResult& r) {
  auto j = nlohmann::json::parse(r.text, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.text;
  return j;
}

TEST(KubectlPodlink, FoundByKubectlPluginList) {
  ShellResult r = Shell("kubectl plugin list");
  EXPECT_NE(r.text.find("kubectl-podlink"), std::string::npos) << r.text;
  ShellResult help = Shell("kubectl podlink --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.text.find("doctor POD"), std::string::npos);
  EXPECT_EQ(Shell("kubectl podlink frobnicate").code, 2);
}

TEST(KubectlPodlink, CommandsAgainstALiveDaemon) {
  ::setenv("NODE_NAME", "gpu-node-test", 1);  // as the DaemonSet sets it (downward API); podlinkd inherits it
  PodCgroup cg(RandomPodUid(), "burstable");
  Daemon d(R"({"pods": [{"match": {"pod_uid": ")" + cg.pod_uid() +
           R"("}, "namespace": "ml", "name": "prefill-0", "annotations": {"podlink.io/peer-group": "job-7"}}]})");
  Pod exporter(d, &cg, {"export", "--size", "1048576", "--name", "kv", "--commands"});
  ASSERT_EQ(exporter.Expect("exported")["event"], "exported");
  std::string sock = " --socket " + d.dir();

  ShellResult st = Shell("kubectl podlink status -o json" + sock);
  ASSERT_EQ(st.code, 0) << st.text;
  auto sj = Json(st);
  EXPECT_EQ(sj["stats"]["exports"], 1);
  EXPECT_GE(sj["stats"]["sessions"], 2);  // the exporter and this command
  EXPECT_EQ(sj["cuda"], false);
  EXPECT_EQ(sj["node"], "gpu-node-test");
  ShellResult table = Shell("kubectl podlink status" + sock);
  EXPECT_EQ(table.text.rfind("node gpu-node-test, podlinkd ", 0), 0u) << table.text;
  EXPECT_NE(table.text.find("sessions"), std::string::npos) << table.text;
  EXPECT_NE(table.text.find("relay:"), std::string::npos);

  ShellResult ex = Shell("kubectl podlink exports -o json" + sock);
  ASSERT_EQ(ex.code, 0) << ex.text;
  auto ej = Json(ex);
  ASSERT_EQ(ej.size(), 1u);
  EXPECT_EQ(ej[0]["owner"], "ml/prefill-0");
  EXPECT_EQ(ej[0]["name"], "kv");
  EXPECT_EQ(ej[0]["peer_group"], "job-7");
  EXPECT_EQ(ej[0]["size"], 1048576);
  ShellResult ext = Shell("kubectl podlink exports" + sock);
  EXPECT_NE(ext.text.find("ml/prefill-0"), std::string::npos) << ext.text;
  ShellResult exy = Shell("kubectl podlink exports -o yaml" + sock);
  EXPECT_EQ(exy.code, 0) << exy.text;
  EXPECT_NE(exy.text.find("\n  owner: ml/prefill-0\n  peer_group: job-7\n  size: 1048576\n"), std::string::npos)
      << exy.text;

  ShellResult ver = Shell("kubectl podlink version -o json" + sock);
  ASSERT_EQ(ver.code, 0) << ver.text;
  auto vj = Json(ver);
  EXPECT_EQ(vj["daemon_version"], vj["plugin_version"]);
  EXPECT_EQ(vj["node"], "gpu-node-test");
  ShellResult vt = Shell("kubectl podlink version" + sock);
  EXPECT_NE(vt.text.find(" on node gpu-node-test\n"), std::string::npos) << vt.text;

  ShellResult peers = Shell("kubectl podlink peers -o json" + sock);
  EXPECT_EQ(peers.code, 0);
  EXPECT_TRUE(Json(peers).is_array());

  // Inside a pod the node-wide views are refused, with the way to get them.
  Pod inside(d, &cg, {"exports", "--socket", d.dir()}, KUBECTL_PODLINK_DIR "/kubectl-podlink");
  EXPECT_EQ(inside.Wait(), 1);
  // The mesh status too, which names the API server's errors when other nodes' pods cannot be confirmed.
  Pod inside_links(d, &cg, {"links", "-o", "json", "--socket", d.dir()}, KUBECTL_PODLINK_DIR "/kubectl-podlink");
  EXPECT_EQ(inside_links.Wait(), 1);
  // Unreachable daemon: a clear error, not a hang.
  ShellResult none = Shell("kubectl podlink status --socket /nonexistent");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.text.find("Is podlinkd running"), std::string::npos) << none.text;
}

TEST(KubectlPodlink, DoctorExplainsWhatToFix) {
  std::string fx = std::string(PODLINK_SOURCE_DIR) + "/tests/fixtures/";
  ShellResult good = Shell("kubectl podlink doctor decode-0 -n ml -o json --socket /nonexistent --pod-json " + fx + "pod-good.json");
  EXPECT_EQ(good.code, 0) << good.text;
  auto gj = Json(good);
  EXPECT_EQ(gj["ok"], true);
  EXPECT_EQ(gj["pod"], "ml/decode-0");

  ShellResult bad = Shell("kubectl podlink doctor decode-1 -n ml --socket /nonexistent --pod-json " + fx + "pod-bad.json");
  EXPECT_EQ(bad.code, 1) << bad.text;
  EXPECT_NE(bad.text.find("add the annotation podlink.io/peer-group"), std::string::npos) << bad.text;
  EXPECT_NE(bad.text.find("podlink.io/peer\"]: 1"), std::string::npos) << bad.text;
  EXPECT_NE(bad.text.find("NCCL_NET_PLUGIN=aws-ofi overrides"), std::string::npos) << bad.text;
  EXPECT_NE(bad.text.find("Pending"), std::string::npos);

  ShellResult direct = Shell("kubectl podlink doctor decode-2 --socket /nonexistent --pod-json " + fx +
                             "pod-direct-missing.json");
  EXPECT_EQ(direct.code, 1) << direct.text;
  EXPECT_NE(direct.text.find("request podlink.io/peer-direct"), std::string::npos) << direct.text;

  // NCCL native mode asked for without what podlinkd checks: each reason named; with all of it, nothing to fix.
  ShellResult native = Shell("kubectl podlink doctor rank-1 --socket /nonexistent --pod-json " + fx +
                             "pod-native-missing.json");
  EXPECT_EQ(native.code, 1) << native.text;
  EXPECT_NE(native.text.find("FIX   NCCL native mode"), std::string::npos) << native.text;
  EXPECT_NE(native.text.find("podlink.io/peer-group annotation (native mode"), std::string::npos) << native.text;
  EXPECT_NE(native.text.find("the podlink.io/peer-direct resource"), std::string::npos) << native.text;
  EXPECT_NE(native.text.find("hostNetwork pods cannot be bridged"), std::string::npos) << native.text;
  ShellResult native_ok = Shell("kubectl podlink doctor rank-0 --socket /nonexistent --pod-json " + fx +
                                "pod-native-good.json");
  EXPECT_EQ(native_ok.code, 0) << native_ok.text;
  EXPECT_NE(native_ok.text.find("ok    NCCL native mode: asked for and allowed"), std::string::npos) << native_ok.text;

  ShellResult missing = Shell("kubectl podlink doctor x --pod-json /nonexistent.json");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.text.find("cannot read"), std::string::npos);
  ShellResult notpod = Shell("kubectl podlink doctor x --pod-json " + fx + "../../.yamllint");
  EXPECT_EQ(notpod.code, 1);
  EXPECT_EQ(Shell("kubectl podlink doctor").code, 2);
}

}  // namespace
}  // namespace podlink::testing

namespace podlink::testing {
namespace {

// Cluster mode and bench, with a fake kubectl first on PATH.
class KubectlPodlinkCluster : public ::testing::Test {
 protected:
  KubectlPodlinkCluster() : daemon_("{}") {
    char tmpl[] = "/tmp/podlink-fakekube-XXXXXX";
    bin_ = ::mkdtemp(tmpl);
    std::string cmd = "cp '" + std::string(PODLINK_SOURCE_DIR) + "/tests/fixtures/fake-kubectl' '" + bin_ + "/kubectl'";
    EXPECT_EQ(system(cmd.c_str()), 0);
    log_ = bin_ + "/log";
  }
  ~KubectlPodlinkCluster() override {
    std::string cmd = "rm -rf '" + bin_ + "'";
    (void)!system(cmd.c_str());
  }
  ShellResult Kube(const std::string& args, const std::string& env = "") {
    return Shell("env PATH=" + bin_ + ":" + KUBECTL_PODLINK_DIR + ":$PATH FAKE_KUBECTL_LOG=" + log_ +
                 " PODLINK_SOCKET_DIR=" + daemon_.dir() + " " + env + " kubectl-podlink " + args);
  }
  std::string Log() {
    ShellResult r = Shell("cat " + log_);
    return r.text;
  }
  Daemon daemon_;
  std::string bin_, log_;
};

TEST_F(KubectlPodlinkCluster, StatusRunsInThePodlinkdPodOnThePodsNode) {
  ShellResult r = Kube("status --for-pod decode-0 -n ml -o json --socket " + daemon_.dir());
  ASSERT_EQ(r.code, 0) << r.text;
  auto j = Json(r);
  EXPECT_GE(j["stats"]["sessions"], 1);
  std::string log = Log();
  EXPECT_NE(log.find("get pod decode-0 -n ml -o jsonpath={.spec.nodeName}"), std::string::npos) << log;
  EXPECT_NE(log.find("--field-selector spec.nodeName=gpu-node-1"), std::string::npos) << log;
  // The command is repeated inside the podlinkd pod, arguments in the user's order.
  EXPECT_NE(log.find("exec -n podlink-system podlinkd-abcde -- kubectl-podlink status -o json --socket " +
                     daemon_.dir()),
            std::string::npos)
      << log;
  ShellResult node = Kube("exports --node gpu-node-7 --socket " + daemon_.dir());
  EXPECT_EQ(node.code, 0) << node.text;
  EXPECT_NE(Log().find("spec.nodeName=gpu-node-7"), std::string::npos);
}

TEST_F(KubectlPodlinkCluster, NoDaemonOnTheNodeIsExplained) {
  ShellResult r = Kube("peers --for-pod decode-0 -n ml", "FAKE_NO_DAEMON=1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.text.find("no podlinkd pod on node gpu-node-1"), std::string::npos) << r.text;
}

TEST_F(KubectlPodlinkCluster, BenchWritesBetweenTwoPods) {
  ShellResult r = Kube(std::string("bench prefill-0 decode-0 -n ml --size 8388608 -o json --demo ") +
                       KUBECTL_PODLINK_DIR + "/podlink-demo");
  ASSERT_EQ(r.code, 0) << r.text;
  auto j = Json(r);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["put"]["bytes"], 8388608);
  EXPECT_EQ(j["verified"]["mismatches"], 0);
  std::string log = Log();
  EXPECT_NE(log.find("exec -n ml prefill-0 --"), std::string::npos) << log;
  EXPECT_NE(log.find("exec -n ml decode-0 --"), std::string::npos) << log;
  ShellResult bad = Kube("bench prefill-0 decode-0 --demo /nonexistent/podlink-demo");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.text.find("did not register a region"), std::string::npos) << bad.text;
  EXPECT_EQ(Kube("bench only-one").code, 2);
}

}  // namespace
}  // namespace podlink::testing
