// Several cables between two nodes: both carry a transfer, the fastest takes one slice, and rail groups
// are the NCCL devices.
#include <algorithm>

#include "tests/integration/mesh/mesh_fixture.h"

namespace podlink::testing {
namespace {

TEST_F(Mesh, TwoCablesBothCarryATransfer) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [a1, b1] = topo_.Cable(a, b, 1);
  auto [a2, b2] = topo_.Cable(a, b, 2);
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  auto na = StartNode("node-a", a, {a1, a2}, pods);
  auto nb = StartNode("node-b", b, {b1, b2}, pods);
  auto tx = [&](const std::string& dev) { return TxBytes(a, dev); };
  uint64_t before1 = tx(a1), before2 = tx(a2);
  const uint64_t size = 64 << 20;
  KvAcrossNodes(*nb, pb, *na, pa, size, 51);
  uint64_t sent1 = tx(a1) - before1, sent2 = tx(a2) - before2;
  EXPECT_TRUE(na->WaitForLog("paths=2"));
  // Both cables carried a real share of the write (and the control plane
  // adds little): the slices were striped over both. (How evenly depends on
  // which connections' threads the CPU runs first here, the cables being
  // unshaped: at least 4 slices each. tests/mesh/bench.sh measures the
  // balance on shaped cables.)
  const uint64_t share = uint64_t{4} * (512 << 10);
  std::cerr << "striped: cable 1 " << sent1 << " bytes, cable 2 " << sent2 << "\n";
  EXPECT_GT(sent1, share) << "cable 1 carried " << sent1 << " bytes, cable 2 " << sent2;
  EXPECT_GT(sent2, share) << "cable 1 carried " << sent1 << " bytes, cable 2 " << sent2;
  EXPECT_GE(sent1 + sent2, size);

  // What an operator sees on node a: kubectl podlink links.
  int rc = -1;
  std::string text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links -o json --socket ", na->dir()), &rc);
  EXPECT_EQ(rc, 0) << text;
  json links = json::parse(text, nullptr, false);
  ASSERT_TRUE(links.is_object()) << text;
  EXPECT_EQ(links["node"], "node-a");
  EXPECT_EQ(links["enabled"], true);
  ASSERT_EQ(links["peers"].size(), 1u) << text;
  const json& peer = links["peers"][0];
  EXPECT_EQ(peer["node"], "node-b");
  EXPECT_EQ(peer["transport"], "tcp") << text;
  EXPECT_EQ(peer["connections_up"], 8) << text;  // 4 per cable
  EXPECT_GE(peer["bytes_sent"].get<uint64_t>(), size);
  EXPECT_GE(peer["bytes_received"].get<uint64_t>(), size);  // the read-back
  int paths_with_bytes = 0;
  for (const json& c : peer["connections"]) paths_with_bytes += c["bytes_sent"].get<uint64_t>() > 0;
  EXPECT_GE(paths_with_bytes, 2) << text;
  // The table, for people.
  text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links --socket ", na->dir()), &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("node-b"), std::string::npos) << text;
  EXPECT_NE(text.find("8/8"), std::string::npos) << text;
  EXPECT_NE(text.find("10.77.2.1->10.77.2.2"), std::string::npos) << text;
  std::cerr << text;
  // The same per path on /metrics (read inside node a's namespace).
  std::string metrics = RunCommand(absl::StrCat(
      "ip netns exec ", a, " python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:",
      na->metrics_port(), "/metrics\").read().decode())'"));
  for (const char* path : {"10.77.1.1->10.77.1.2", "10.77.2.1->10.77.2.2"}) {
    EXPECT_NE(metrics.find(absl::StrCat("podlink_mesh_path_connections_up{peer=\"node-b\",path=\"", path, "\"} 4")),
              std::string::npos)
        << metrics;
    size_t at = metrics.find(absl::StrCat("podlink_mesh_path_sent_bytes_total{peer=\"node-b\",path=\"", path, "\"} "));
    ASSERT_NE(at, std::string::npos) << metrics;
    EXPECT_GT(std::strtod(metrics.c_str() + metrics.find("} ", at) + 2, nullptr), 0.0) << metrics;
  }
  // The pod's slices left its host export without a copy into the kernel
  // (MSG_ZEROCOPY) until the kernel said a veth makes it copy anyway; each
  // connection then stopped asking.
  auto value = [&](const std::string& m, const std::string& series) {
    size_t at = m.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::strtod(m.c_str() + at + series.size() + 2, nullptr);
  };
  EXPECT_GT(value(metrics, "podlink_mesh_tcp_zero_copy_bytes_total{peer=\"node-b\"}"), 0.0) << metrics;
  EXPECT_GE(value(metrics, "podlink_mesh_tcp_zero_copy_copied_total{peer=\"node-b\"}"), 1.0) << metrics;
  EXPECT_TRUE(na->WaitForLog("event=mesh_tcp_zero_copy_off node=node-b"));
}
// Each daemon reads the NICs under its addresses from sysfs and advertises
// them; a transfer of one slice goes on the fastest cable, a larger one is
// striped over every cable of the best class (host memory: all of them).
// Node a reads a fake sysfs (mesh.sysfs) in which its first cable is a
// 1 Gb/s NIC and its second a 100 Gb/s one; node b its real one.
TEST_F(Mesh, NicsAreAdvertisedAndOneSliceTakesTheFastestCable) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [a1, b1] = topo_.Cable(a, b, 1);
  auto [a2, b2] = topo_.Cable(a, b, 2);
  const std::string sys = dir_ + "/sysfs-a";
  auto nic = [&](const std::string& dev, const std::string& pci, const char* speed) {
    Sh(absl::StrCat("mkdir -p ", sys, "/devices/", pci, " ", sys, "/class/net/", dev));
    std::ofstream(absl::StrCat(sys, "/devices/", pci, "/numa_node")) << "0\n";
    std::ofstream(absl::StrCat(sys, "/class/net/", dev, "/speed")) << speed << "\n";
    Sh(absl::StrCat("ln -s ", sys, "/devices/", pci, " ", sys, "/class/net/", dev, "/device"));
  };
  nic(a1, "pci0000:00/0000:00:01.0/0000:01:00.0", "1000");
  nic(a2, "pci0000:00/0000:00:02.0/0000:02:00.0", "100000");
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  auto na = StartNode("node-a", a, {a1, a2}, pods, "", absl::StrCat(R"(, "sysfs": ")", sys, R"(")"));
  auto nb = StartNode("node-b", b, {b1, b2}, pods);

  // 20 writes and a read of 256 KiB (one slice each): the fast cable.
  uint64_t before1 = TxBytes(a, a1), before2 = TxBytes(a, a2);
  const uint64_t small = 256 << 10;
  KvAcrossNodes(*nb, pb, *na, pa, small, 61, {}, {"--repeat", "20"});
  uint64_t sent1 = TxBytes(a, a1) - before1, sent2 = TxBytes(a, a2) - before2;
  std::cerr << "one slice at a time: slow cable " << sent1 << " bytes, fast cable " << sent2 << "\n";
  EXPECT_GE(sent2, 20 * small) << "fast cable " << sent2 << " bytes, slow cable " << sent1 << "\n" << na->Log();
  EXPECT_LT(sent1, small) << "the slow cable carried data: " << sent1 << " bytes (fast: " << sent2 << ")\n"
                          << na->Log();

  // 32 MiB (64 slices): both cables, the slices being pulled.
  before1 = TxBytes(a, a1);
  before2 = TxBytes(a, a2);
  const uint64_t large = 32 << 20;
  KvAcrossNodes(*nb, pb, *na, pa, large, 62);
  sent1 = TxBytes(a, a1) - before1;
  sent2 = TxBytes(a, a2) - before2;
  // (At least 4 slices each: the balance depends on the CPU here, as above.)
  const uint64_t share = uint64_t{4} * (512 << 10);
  std::cerr << "striped: cable 1 " << sent1 << " bytes, cable 2 " << sent2 << "\n";
  EXPECT_GT(sent1, share) << "cable 1 carried " << sent1 << " bytes, cable 2 " << sent2 << "\n" << na->Log();
  EXPECT_GT(sent2, share) << "cable 1 carried " << sent1 << " bytes, cable 2 " << sent2 << "\n" << na->Log();

  // What each side says of its NICs (kubectl podlink links).
  json links = LinksOf(*na);
  ASSERT_TRUE(links.is_object());
  std::map<std::string, json> own;
  for (const json& l : links["links"]) own[l["netdev"]] = l;
  ASSERT_EQ(own.size(), 2u) << links.dump();
  EXPECT_EQ(own[a1]["address"], "10.77.1.1/30");
  EXPECT_EQ(own[a1]["speed_mbps"], 1000);
  EXPECT_EQ(own[a2]["speed_mbps"], 100000);
  EXPECT_NE(own[a2]["pci_path"].get<std::string>().find("0000:02:00.0"), std::string::npos) << links.dump();
  EXPECT_EQ(own[a2]["numa_node"], 0);
  EXPECT_EQ(own[a2]["rdma_device"], "");
  ASSERT_EQ(links["peers"].size(), 1u);
  std::map<std::string, json> theirs;
  for (const json& l : links["peers"][0]["links"]) theirs[l["address"]] = l;
  ASSERT_EQ(theirs.size(), 2u) << links.dump();
  EXPECT_EQ(theirs["10.77.1.2/30"]["netdev"], b1);
  EXPECT_EQ(theirs["10.77.2.2/30"]["netdev"], b2);
  // (podlinkd sees the host's /sys, as in a DaemonSet with the host's
  // network; the harness only moves it into the node's network namespace,
  // so node b cannot read its veths there: it says it does not know.)
  EXPECT_EQ(theirs["10.77.2.2/30"]["speed_mbps"], 0);
  EXPECT_EQ(theirs["10.77.2.2/30"]["pci_path"], "");
  int rc = -1;
  std::string text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links --socket ", na->dir()), &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find(absl::StrCat("link 10.77.2.1/30 ", a2, " 100 Gb/s 0000:02:00.0 NUMA 0")), std::string::npos)
      << text;
  EXPECT_NE(text.find(absl::StrCat("its link 10.77.1.2/30 ", b1, " speed ?")), std::string::npos) << text;
}
// NCCL sees one device per rail group of the daemon's mesh NICs (the NICs
// under one PCIe bridge), with the group's speed, the fastest first; a pod
// can ask for one device per GPU instead. Node a's fake sysfs puts its first
// cable's NIC on a real PCI function of this machine (so the plugin can hand
// NCCL its path) and the other two, 100 Gb/s each, under one made-up switch
// port. Each rail device carries the conformance scenarios to node b over its
// own group's cables (its bounce buffers are exported with the group's PCI
// place as their mesh affinity).
TEST_F(Mesh, RailGroupsAreTheNcclDevicesWithTheirSpeed) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [a1, b1] = topo_.Cable(a, b, 1);
  auto [a2, b2] = topo_.Cable(a, b, 2);
  auto [a3, b3] = topo_.Cable(a, b, 3);
  const std::string sys = dir_ + "/sysfs-a";
  auto nic = [&](const std::string& dev, const std::string& pci, const char* speed) {
    Sh(absl::StrCat("mkdir -p ", sys, "/devices/", pci, " ", sys, "/class/net/", dev));
    std::ofstream(absl::StrCat(sys, "/devices/", pci, "/numa_node")) << "0\n";
    std::ofstream(absl::StrCat(sys, "/class/net/", dev, "/speed")) << speed << "\n";
    Sh(absl::StrCat("ln -s ", sys, "/devices/", pci, " ", sys, "/class/net/", dev, "/device"));
    Sh(absl::StrCat("mkdir -p ", sys, "/bus/pci/devices && ln -s ", sys, "/devices/", pci, " ", sys,
                    "/bus/pci/devices/", pci.substr(pci.rfind('/') + 1)));
  };
  // A real PCI function here, if the machine has one ("" in a container without PCI).
  std::string real;
  if (DIR* d = ::opendir("/sys/bus/pci/devices"); d != nullptr) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char* r = ::realpath(absl::StrCat("/sys/bus/pci/devices/", e->d_name).c_str(), nullptr);
      if (r != nullptr && std::string(r).rfind("/sys/devices/pci", 0) == 0) real = r;
      std::free(r);
      if (!real.empty()) break;
    }
    ::closedir(d);
  }
  nic(a1, real.empty() ? "pci0000:00/0000:00:01.0/0000:01:00.0" : real.substr(strlen("/sys/devices/")), "1000");
  nic(a2, "pci0000:00/0000:00:1c.7/0000:7e:00.0", "100000");
  nic(a3, "pci0000:00/0000:00:1c.7/0000:7e:00.1", "100000");
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  auto na = StartNode("node-a", a, {a1, a2, a3}, pods, "", absl::StrCat(R"(, "sysfs": ")", sys, R"(")"));
  auto nb = StartNode("node-b", b, {b1, b2, b3}, pods);
  [[maybe_unused]] auto [plugin, peer, args] = NcclPeer();
  // One device per GPU this machine has (the mesh tests hide none from pods; one without a GPU).
  int ngpu = 0;
  auto driver = cu::LoadDriver();
  if (!driver.ok() || (*driver)->DeviceGetCount(&ngpu) != cu::kSuccess) ngpu = 0;
  const size_t per_gpu = static_cast<size_t>(std::max(ngpu, 1));

  Pod send(*na, &pa, args, peer);
  Pod recv(*nb, &pb, args, peer);
  absl::Status veth = PodVeth(recv.pid(), send.pid(), absl::StrCat(topo_.tag(), "pr"), absl::StrCat(topo_.tag(), "ps"),
                              "10.78.9.1/24", "10.78.9.2/24");
  ASSERT_TRUE(veth.ok()) << veth;
  {
    // A pod that asks for one device per GPU (a veth of its own: the plugin needs an address to listen on).
    std::vector<std::string> gpu_args = args;
    gpu_args.push_back("PODLINK_NCCL_DEVICES=gpus");
    Pod gpus(*na, &pa, gpu_args, peer);
    veth = PodVeth(recv.pid(), gpus.pid(), absl::StrCat(topo_.tag(), "gr"), absl::StrCat(topo_.tag(), "gs"),
                   "10.78.8.1/24", "10.78.8.2/24");
    ASSERT_TRUE(veth.ok()) << veth;
    gpus.Send(R"({"cmd": "init"})");
    json g = gpus.Expect("ready");
    ASSERT_EQ(g["result"], 0) << g.dump();
    ASSERT_EQ(g["devices"].size(), per_gpu) << g.dump();
    for (size_t i = 0; i < g["devices"].size(); ++i) {
      EXPECT_EQ(g["devices"][i]["name"], absl::StrCat("podlink", i));
      EXPECT_EQ(g["devices"][i]["speed"], 3200000) << "one device per GPU: the relay's speed";
    }
    gpus.Send(R"({"cmd": "exit"})");
    EXPECT_EQ(gpus.WaitFor(30000), std::optional<int>(0));
  }
  send.Send(R"({"cmd": "init"})");
  json r = send.Expect("ready");
  ASSERT_EQ(r["result"], 0) << r.dump();
  const json& devs = r["devices"];
  ASSERT_EQ(devs.size(), 2u) << r.dump();
  EXPECT_EQ(devs[0]["name"], absl::StrCat("podlink-", a2, "+", a3)) << r.dump();
  EXPECT_EQ(devs[0]["speed"], 200000) << r.dump();
  // A made-up PCI function is not handed to NCCL: the GPU's parent instead (none without a GPU).
  EXPECT_EQ(devs[0]["pci_path"].get<std::string>().find("0000:7e:00"), std::string::npos) << r.dump();
  if (!r["gpu"].get<bool>()) {
    EXPECT_EQ(devs[0]["pci_path"], "") << r.dump();
  }
  EXPECT_EQ(devs[1]["name"], absl::StrCat("podlink-", a1)) << r.dump();
  EXPECT_EQ(devs[1]["speed"], 1000) << r.dump();
  EXPECT_EQ(devs[1]["pci_path"], real) << r.dump();
  for (const json& d : devs) EXPECT_EQ(d["result"], 0) << r.dump();
  // Node b's daemon cannot read its veths' sysfs from the harness (as in
  // NicsAreAdvertised...): no PCI place, so one device per GPU.
  recv.Send(R"({"cmd": "init"})");
  json rb = recv.Expect("ready");
  ASSERT_EQ(rb["result"], 0) << rb.dump();
  ASSERT_EQ(rb["devices"].size(), per_gpu) << rb.dump();
  EXPECT_EQ(rb["devices"][0]["name"], "podlink0");

  // One connection on the sender's device `dev` running `sc`; the bytes each
  // of node a's cables carried meanwhile.
  // The cables by init-capture: clang before 16 cannot capture a structured binding.
  auto run = [&, &a = a, &a1 = a1, &a2 = a2, &a3 = a3](int dev, const char* sc) -> std::array<uint64_t, 3> {
    SCOPED_TRACE(absl::StrCat(sc, " on device ", dev));
    const std::array<uint64_t, 3> before = {TxBytes(a, a1), TxBytes(a, a2), TxBytes(a, a3)};
    NcclScenario(send, recv, *na, *nb, sc, dev);
    return {TxBytes(a, a1) - before[0], TxBytes(a, a2) - before[1], TxBytes(a, a3) - before[2]};
  };
  const uint64_t large = uint64_t{48} << 20;  // the large scenario writes 51 MiB
  std::array<uint64_t, 3> rail0 = run(0, "large");
  EXPECT_GT(rail0[1] + rail0[2], large) << "device 0 is " << a2 << "+" << a3;
  // (At least 4 slices each: how evenly depends on the CPU here, the cables being unshaped.)
  EXPECT_GT(rail0[1], uint64_t{2} << 20) << "striped over both of the group's cables: " << rail0[1] << ", " << rail0[2];
  EXPECT_GT(rail0[2], uint64_t{2} << 20) << "striped over both of the group's cables: " << rail0[1] << ", " << rail0[2];
  EXPECT_LT(rail0[0], uint64_t{4} << 20) << "the other rail's cable carried " << rail0[0] << " bytes";
  std::array<uint64_t, 3> rail1 = run(1, "large");
  EXPECT_GT(rail1[0], large) << "device 1 is " << a1;
  EXPECT_LT(rail1[1] + rail1[2], uint64_t{4} << 20) << "the other rail's cables carried " << rail1[1] + rail1[2];
  (void)run(1, "grouped");
  for (Pod* p : {&send, &recv}) p->Send(R"({"cmd": "exit"})");
  for (Pod* p : {&send, &recv}) EXPECT_EQ(p->WaitFor(30000), std::optional<int>(0));
}

}  // namespace
}  // namespace podlink::testing
