// podlinkd between namespaced "pods": identity, authorized and denied
// imports, shared bytes, and cleanup when an owner goes away.
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

using nlohmann::json;

class BrokerNamespaces : public ::testing::Test {
 protected:
  BrokerNamespaces()
      : prefill_(RandomPodUid(), "burstable"),
        decode_(RandomPodUid(), "besteffort"),
        intruder_(RandomPodUid(), "besteffort"),
        foreign_(RandomPodUid(), "burstable"),
        plain_(RandomPodUid(), "besteffort"),
        daemon_(Config()) {}

  std::string Rule(const PodCgroup& cg, const std::string& ns, const std::string& name,
                   const std::string& group) {
    std::string ann = group.empty() ? "{}" : absl::StrCat(R"({"podlink.io/peer-group": ")", group, R"("})");
    return absl::StrCat(R"({"match": {"pod_uid": ")", cg.pod_uid(), R"("}, "namespace": ")", ns,
                        R"(", "name": ")", name, R"(", "annotations": )", ann, "}");
  }
  std::string Config() {
    return absl::StrCat(R"({"pods": [)", Rule(prefill_, "ml", "prefill-0", "job-7"), ",",
                        Rule(decode_, "ml", "decode-0", "job-7"), ",", Rule(intruder_, "ml", "intruder", "job-8"),
                        ",", Rule(foreign_, "other", "decode-0", "job-7"), ",",
                        Rule(plain_, "ml", "plain", ""), "]}");
  }

  PodCgroup prefill_, decode_, intruder_, foreign_, plain_;
  Daemon daemon_;
};

TEST_F(BrokerNamespaces, IdentityComesFromTheKernel) {
  Pod p(daemon_, &prefill_, {"info"});
  json j = p.Expect("info");
  ASSERT_EQ(j["event"], "info") << j.dump();
  const json& id = j["identity"];
  EXPECT_EQ(id["pod_uid"], prefill_.pod_uid());
  EXPECT_EQ(id["container_id"], prefill_.container_id());
  EXPECT_EQ(id["qos"], "burstable");
  EXPECT_EQ(id["namespace"], "ml");
  EXPECT_EQ(id["pod"], "prefill-0");
  EXPECT_EQ(id["annotations"]["podlink.io/peer-group"], "job-7");
  // The daemon sees the host PID, not the pod's own pid 1.
  EXPECT_GT(id["pid"].get<int>(), 1);
  EXPECT_EQ(j["handle_types"], json::array({"host-memfd", "process-memory"}));
  EXPECT_EQ(p.Wait(), 0);
}

TEST_F(BrokerNamespaces, AuthorizedImportSharesMemoryBothWays) {
  Pod exporter(daemon_, &prefill_,
               {"export", "--size", "4194304", "--name", "kv", "--seed", "11", "--await-import",
                "--expect-writeback", "23"});
  json e = exporter.Expect("exported");
  ASSERT_EQ(e["event"], "exported") << e.dump();
  Pod importer(daemon_, &decode_, {"import", "--name", "kv", "--verify", "11", "--writeback", "23"});
  json imp = importer.Expect("imported");
  ASSERT_EQ(imp["event"], "imported") << imp.dump();
  EXPECT_EQ(imp["owner"], "ml/prefill-0");
  EXPECT_EQ(imp["export_id"], e["export_id"]);
  json v = importer.Expect("verified");
  EXPECT_EQ(v["mismatches"], 0) << v.dump();
  EXPECT_EQ(v["bytes"], 3145728);
  EXPECT_EQ(importer.Expect("done")["event"], "done");
  json wb = exporter.Expect("writeback_checked");
  EXPECT_EQ(wb["mismatches"], 0) << wb.dump();
  EXPECT_EQ(wb["bytes"], 1048576);
  EXPECT_EQ(importer.Wait(), 0);
  EXPECT_EQ(exporter.Wait(), 0);
}

TEST_F(BrokerNamespaces, UnauthorizedImportsAreDeniedWithReasons) {
  Pod exporter(daemon_, &prefill_, {"export", "--size", "65536", "--name", "secret", "--seed", "1", "--commands"});
  ASSERT_EQ(exporter.Expect("exported")["event"], "exported");
  struct Case {
    const PodCgroup* cg;
    std::string name;
    std::string code;
    std::string mentions;
  };
  // Pods of the exporter's namespace are told why; a pod of another namespace
  // gets exactly the answer for a name that does not exist (it learns neither
  // the owner nor the peer group).
  for (const Case& c : std::vector<Case>{
           {&intruder_, "secret", "PERMISSION_DENIED", "peer group 'job-8'"},
           {&plain_, "secret", "PERMISSION_DENIED",
            "has no podlink.io/peer-group annotation; add podlink.io/peer-group=job-7"},
           {&foreign_, "ml/secret", "NOT_FOUND",
            "no export named 'secret' in namespace ml that this pod may import (never existed"},
           {&foreign_, "ml/never-existed", "NOT_FOUND",
            "no export named 'never-existed' in namespace ml that this pod may import (never existed"},
       }) {
    Pod p(daemon_, c.cg, {"import", "--name", c.name, "--verify", "1"});
    json j = p.Expect("imported");
    EXPECT_EQ(j["event"], "error") << j.dump();
    EXPECT_EQ(j["code"], c.code) << j.dump();
    if (c.code == "NOT_FOUND") {
      EXPECT_EQ(j["message"].get<std::string>().find("prefill"), std::string::npos) << "owner leaked: " << j.dump();
    }
    EXPECT_NE(j["message"].get<std::string>().find(c.mentions), std::string::npos) << j.dump();
    EXPECT_NE(p.Wait(), 0);
  }
  // A pod of another namespace cannot even find the name unqualified.
  Pod p(daemon_, &foreign_, {"import", "--name", "secret"});
  json j = p.Expect("imported");
  EXPECT_EQ(j["code"], "NOT_FOUND") << j.dump();
  EXPECT_NE(daemon_.Log().find("event=deny"), std::string::npos);
  // Denials did not disturb the exporter's data.
  exporter.Send("check");
  EXPECT_EQ(exporter.Expect("checked")["mismatches"], 0);
}

TEST_F(BrokerNamespaces, ExporterCanNameAnImporter) {
  Pod exporter(daemon_, &prefill_,
               {"export", "--size", "65536", "--seed", "3", "--allow", "ml/intruder", "--await-import"});
  json e = exporter.Expect("exported");
  ASSERT_EQ(e["event"], "exported");
  std::string id = std::to_string(e["export_id"].get<uint64_t>());
  Pod unnamed(daemon_, &plain_, {"import", "--id", id});
  EXPECT_EQ(unnamed.Expect("imported")["code"], "PERMISSION_DENIED");
  Pod named(daemon_, &intruder_, {"import", "--id", id, "--verify", "3"});
  EXPECT_EQ(named.Expect("verified")["mismatches"], 0);
  EXPECT_EQ(named.Wait(), 0);
  EXPECT_EQ(exporter.Wait(), 0);
}

void ExpectOwnerLossSeenByImporter(Daemon& daemon, const PodCgroup& a, const PodCgroup& b, bool sigkill) {
  Pod exporter(daemon, &a, {"export", "--size", "65536", "--name", "gone", "--seed", "5", "--commands"});
  json e = exporter.Expect("exported");
  ASSERT_EQ(e["event"], "exported");
  Pod importer(daemon, &b, {"import", "--name", "gone", "--verify", "5", "--hold", "--watch"});
  EXPECT_EQ(importer.Expect("verified")["mismatches"], 0);
  if (sigkill) {
    exporter.Kill(SIGKILL);
  } else {
    exporter.Send("exit");  // _exit without any cleanup
  }
  exporter.Wait();
  // The importer is told through Watch.
  for (;;) {
    json w = importer.Expect("watch");
    ASSERT_EQ(w["event"], "watch") << w.dump();
    if (w["type"] == 2) {  // EXPORT_GONE
      EXPECT_EQ(w["export_id"], e["export_id"]);
      EXPECT_NE(w["reason"].get<std::string>().find("session closed"), std::string::npos) << w.dump();
      break;
    }
  }
  // And the export is gone for everyone.
  Pod late(daemon, &b, {"import", "--name", "gone"});
  EXPECT_EQ(late.Expect("imported")["code"], "NOT_FOUND");
  importer.Send("exit");
  importer.Wait();
}

TEST_F(BrokerNamespaces, ExportDiesWithOwnerExit) { ExpectOwnerLossSeenByImporter(daemon_, prefill_, decode_, false); }

TEST_F(BrokerNamespaces, ExportDiesWithOwnerCrash) { ExpectOwnerLossSeenByImporter(daemon_, prefill_, decode_, true); }

TEST_F(BrokerNamespaces, ReleaseTellsImportersAndDoubleReleaseIsAnError) {
  Pod exporter(daemon_, &prefill_, {"export", "--size", "65536", "--name", "rel", "--seed", "2", "--commands"});
  ASSERT_EQ(exporter.Expect("exported")["event"], "exported");
  Pod importer(daemon_, &decode_, {"import", "--name", "rel", "--verify", "2", "--hold", "--watch"});
  EXPECT_EQ(importer.Expect("verified")["mismatches"], 0);
  exporter.Send("release");
  EXPECT_EQ(exporter.Expect("released")["ok"], true);
  for (;;) {
    json w = importer.Expect("watch");
    ASSERT_EQ(w["event"], "watch");
    if (w["type"] == 2) {
      EXPECT_NE(w["reason"].get<std::string>().find("released by its owner"), std::string::npos);
      break;
    }
  }
  exporter.Send("release-again");
  json again = exporter.Expect("released");
  EXPECT_EQ(again["ok"], false);
  EXPECT_EQ(again["code"], "NOT_FOUND");
  EXPECT_NE(again["message"].get<std::string>().find("already released"), std::string::npos) << again.dump();
  importer.Send("exit");
}

}  // namespace
}  // namespace podlink::testing

namespace podlink::testing {
namespace {

// One-sided KV-cache style transfer between two pods: the receiver registers
// a region and ships its descriptor; the sender writes it whole and notifies.
void KvBetweenPods(Daemon& daemon, const PodCgroup& server_cg, const PodCgroup& client_cg, bool relay,
                   const std::string& expect_transport) {
  Pod server(daemon, &server_cg, {"kv-serve", "--size", "16777216", "--verify", "77"});
  nlohmann::json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  std::vector<std::string> args = {"kv-put", "--desc", s["descriptor"].get<std::string>(), "--seed", "77"};
  if (relay) args.push_back("--relay");
  Pod client(daemon, &client_cg, args);
  nlohmann::json put = client.Expect("put");
  ASSERT_EQ(put["event"], "put") << put.dump();
  EXPECT_EQ(put["transport"], expect_transport);
  EXPECT_EQ(put["bytes"], 16777216);
  nlohmann::json v = server.Expect("verified");
  EXPECT_EQ(v["mismatches"], 0) << v.dump();
  EXPECT_EQ(v["notification"], 1);
  EXPECT_EQ(server.Wait(), 0);
  EXPECT_EQ(client.Wait(), 0);
}

TEST_F(BrokerNamespaces, KvTransferThroughTheRelayBetweenPods) {
  KvBetweenPods(daemon_, prefill_, decode_, /*relay=*/true, "podlink/relay");
}

TEST_F(BrokerNamespaces, KvTransferOverHostMappingBetweenPods) {
  KvBetweenPods(daemon_, prefill_, decode_, /*relay=*/false, "podlink/host");
}

TEST_F(BrokerNamespaces, KvTransferToAPodOutsideTheGroupIsDenied) {
  Pod server(daemon_, &prefill_, {"kv-serve", "--size", "65536", "--verify", "1"});
  nlohmann::json s = server.Expect("serving");
  Pod client(daemon_, &intruder_, {"kv-put", "--desc", s["descriptor"].get<std::string>(), "--seed", "1", "--relay"});
  nlohmann::json e = client.Expect("put");
  EXPECT_EQ(e["event"], "error");
  EXPECT_EQ(e["code"], "PERMISSION_DENIED") << e.dump();
}

}  // namespace
}  // namespace podlink::testing
