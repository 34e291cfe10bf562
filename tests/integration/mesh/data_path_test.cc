// Pods on two nodes moving bytes through both daemons: one-sided writes and reads, NCCL through the
// mesh, GPU exports, and the owner's node's policy.
#include "tests/integration/mesh/mesh_fixture.h"

namespace podlink::testing {
namespace {

TEST_F(Mesh, PodsOnTwoNodesWriteAndReadEachOtherByteForByte) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  KvAcrossNodes(*nb, pb, *na, pa, 24 << 20, 41);  // a -> b
  KvAcrossNodes(*na, pa, *nb, pb, 24 << 20, 42);  // b -> a
  // Sizes that are not multiples of the slice, and a single small op.
  KvAcrossNodes(*nb, pb, *na, pa, (3 << 20) + 4096, 43);
  EXPECT_TRUE(nb->WaitForLog("event=mesh_grant peer=node-a pod=ml/prefill-0"));
}
// The NCCL plugin between pods on two nodes: clear-to-send and completions on
// the pods' own connection (a veth between them, as NCCL's bootstrap needs),
// the bytes written by both podlinkd over their mesh cable. The conformance
// scenarios of tests/nccl (ordering with 32 receives in flight, large and
// odd sizes, grouped receives, a receive larger than the send, truncation, a
// close with requests in flight), every byte checked by the peers.
TEST_F(Mesh, NcclPluginBetweenPodsOnTwoNodesGoesThroughTheMesh) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  [[maybe_unused]] auto [plugin, peer, args] = NcclPeer();
  Pod send(*na, &pa, args, peer);
  Pod recv(*nb, &pb, args, peer);
  absl::Status veth = PodVeth(recv.pid(), send.pid(), absl::StrCat(topo_.tag(), "pr"), absl::StrCat(topo_.tag(), "ps"),
                              "10.78.9.1/24", "10.78.9.2/24");
  ASSERT_TRUE(veth.ok()) << veth;
  // With the step trace on (PODLINK_NCCL_STEP_TRACE): checked at the end.
  char trace_dir[] = "/var/tmp/podlink-mesh-steps.XXXXXX";
  ASSERT_NE(::mkdtemp(trace_dir), nullptr);
  ::chmod(trace_dir, 0777);  // the pods' processes may run as another uid
  for (Pod* p : {&recv, &send}) {
    p->Send(json{{"cmd", "init"}, {"step_trace", trace_dir}}.dump());
    json r = p->Expect("ready");
    ASSERT_EQ(r["result"], 0) << r.dump();
    EXPECT_EQ(r["gpu"], std::getenv("PODLINK_TEST_MEM") != nullptr) << r.dump();
  }
  uint64_t cable_before = TxBytes(a, da);
  for (const char* sc : {"ordering", "large", "grouped", "smaller", "truncate", "inflight-close"}) {
    SCOPED_TRACE(sc);
    NcclScenario(send, recv, *na, *nb, sc);
    if (HasFatalFailure()) return;
  }
  // The bytes went over the daemons' mesh cable, not the pods' veth.
  EXPECT_GT(TxBytes(a, da) - cable_before, uint64_t{48} << 20) << "the large scenario alone writes 51 MiB";
  EXPECT_TRUE(nb->WaitForLog("event=mesh_grant peer=node-a pod=ml/prefill-0"));
  // The step trace: both pods write their steps as they exit, and the sends
  // join their receives across the pods (both ends name each connection alike).
  for (Pod* p : {&send, &recv}) p->Send(R"({"cmd": "exit"})");
  for (Pod* p : {&send, &recv}) EXPECT_EQ(p->WaitFor(30000), std::optional<int>(0)) << "a pod did not exit cleanly";
  size_t files = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(trace_dir)) ++files;
  ASSERT_EQ(files, 2u) << "one step file per pod";
  std::map<std::tuple<uint64_t, uint64_t, int>, std::pair<uint64_t, uint64_t>> sends, recvs;  // size, t_post
  for (const auto& f : std::filesystem::directory_iterator(trace_dir)) {
    std::ifstream in(f.path());
    std::string header;
    std::getline(in, header);
    char kind;
    uint64_t conn, seq, size, t_try, t_post, t_submit, t_done;
    int index;
    while (in >> kind >> conn >> seq >> index >> size >> t_try >> t_post >> t_submit >> t_done) {
      (kind == 's' ? sends : recvs)[{conn, seq, index}] = {size, t_post};
    }
  }
  std::filesystem::remove_all(trace_dir);
  size_t joined = 0;
  for (const auto& [key, s] : sends) {
    auto r = recvs.find(key);
    if (r == recvs.end()) continue;
    ++joined;
    EXPECT_LE(s.first, r->second.first) << "a send larger than the receive it filled";
    EXPECT_LE(r->second.second, s.second) << "a send accepted before its receive was posted";
  }
  EXPECT_GE(sends.size(), 32u);
  // Sends of the close-in-flight scenario may never find their receive.
  EXPECT_GE(joined * 10, sends.size() * 9) << joined << " of " << sends.size() << " sends joined a receive";
}
// A pod on another node writes and reads a GPU export (the owner's daemon
// copies each slice between the wire and the GPU by the copy engine), from
// host memory and from GPU memory of its own (its daemon stages that).
// Needs a GPU: tests/gpu/run_one_gpu.sh runs it on the device machine.
TEST_F(Mesh, APodWritesAndReadsAGpuExportOfAnotherNode) {
  auto d = cu::LoadDriver();
  int n = 0;
  if (!d.ok() || (*d)->DeviceGetCount(&n) != cu::kSuccess || n == 0) GTEST_SKIP() << "no GPU";
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods, "", "", /*gpu=*/true);
  auto nb = StartNode("node-b", b, {db}, pods, "", "", /*gpu=*/true);
  KvAcrossNodes(*nb, pb, *na, pa, 24 << 20, 51, {"--gpu", "0"});              // host on a -> GPU on b
  KvAcrossNodes(*nb, pb, *na, pa, 24 << 20, 52, {"--gpu", "0"}, {"--gpu", "0"});  // GPU on a -> GPU on b
  KvAcrossNodes(*na, pa, *nb, pb, 24 << 20, 53, {}, {"--gpu", "0"});          // GPU on b -> host on a
  EXPECT_TRUE(nb->WaitForLog("event=mesh_grant peer=node-a pod=ml/prefill-0"));
}
TEST_F(Mesh, PolicyOfTheOwnersNodeDecides) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [da, db] = topo_.Cable(a, b, 1);
  PodCgroup owner(RandomPodUid(), "burstable"), intruder(RandomPodUid(), "burstable"),
      foreign(RandomPodUid(), "burstable");
  std::string pods = Rule(owner, "ml", "decode-0", "job-7") + "," + Rule(intruder, "ml", "intruder", "job-8") +
                     "," + Rule(foreign, "other", "prefill-0", "job-7");
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  Pod server(*nb, &owner, {"kv-serve", "--size", "65536", "--verify", "1"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  {
    Pod c(*na, &intruder, {"kv-put", "--desc", s["descriptor"], "--seed", "1"});
    json e = c.Expect("put");
    EXPECT_EQ(e["code"], "PERMISSION_DENIED") << e.dump();
  }
  {
    Pod c(*na, &foreign, {"kv-put", "--desc", s["descriptor"], "--seed", "1"});
    json e = c.Expect("put");
    EXPECT_EQ(e["code"], "NOT_FOUND") << e.dump();  // another namespace learns nothing
  }
  EXPECT_TRUE(nb->WaitForLog("event=deny remote=mesh:node-a pod=ml/intruder"));
}

}  // namespace
}  // namespace podlink::testing
