// The mesh's NICs from sysfs and the ranking of a peer's paths for a
// transfer (daemon/mesh/links/nic_rank.h), on a fake sysfs tree: one root complex
// with a PCIe switch holding a GPU and two NICs, a NIC on another root port,
// one on another host bridge of the same NUMA node, one on the other NUMA
// node, a virtio NIC and a veth.
#include "daemon/mesh/links/nic_rank.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/pci.h"
#include "daemon/mesh/mesh_engine.h"
#include "gtest/gtest.h"

namespace podlink::mesh {
namespace {

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("nic-rank-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    const std::string sw = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    Device(sw + "/0000:02:00.0/0000:03:00.0", 0);                // the GPU
    Nic("pix0", sw + "/0000:02:01.0/0000:04:00.0", 0, "100000");  // beside it, under the switch
    Nic("pix1", sw + "/0000:02:01.1/0000:04:00.1", 0, "25000");   // the same switch, slower
    Nic("pxb0", sw + "/0000:02:02.0/0000:06:00.0/0000:07:00.0/0000:08:00.0", 0, "100000");  // a switch below
    Nic("phb0", "devices/pci0000:00/0000:00:02.0/0000:05:00.0", 0, "200000");
    Nic("node0", "devices/pci0000:40/0000:40:01.0/0000:41:00.0", 0, "200000");
    Nic("sys0", "devices/pci0000:80/0000:80:01.0/0000:81:00.0", 1, "400000");
    Nic("virt0", "devices/pci0000:00/0000:00:03.0/virtio0", -1, "-1");
    fs::create_directories(root_ / "class/net/veth0");
    Write("class/net/veth0/speed", "10000");
    fs::create_directories(root_ / "bus/pci/devices");
    fs::create_directory_symlink(root_ / sw / "0000:02:00.0/0000:03:00.0", root_ / "bus/pci/devices/0000:03:00.0");
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const std::string& rel, const std::string& text) { std::ofstream(root_ / rel) << text << "\n"; }
  void Device(const std::string& rel, int numa) {
    fs::create_directories(root_ / rel);
    Write(rel + "/numa_node", std::to_string(numa));
  }
  void Nic(const std::string& name, const std::string& dev, int numa, const std::string& speed) {
    Device(dev, numa);
    fs::create_directories(root_ / "class/net" / name);
    fs::create_directory_symlink(root_ / dev, root_ / "class/net" / name / "device");
    Write("class/net/" + name + "/speed", speed);
  }
  NicInfo Read(const std::string& name) { return ReadNic(root_.string(), name); }
  MemoryPlace Gpu() { return GpuPlace(root_.string(), "0000:03:00.0"); }

  fs::path root_;
};

TEST_F(FakeSysfs, ReadsSpeedPciPathAndNuma) {
  NicInfo n = Read("pix0");
  EXPECT_EQ(n.netdev, "pix0");
  EXPECT_EQ(n.speed_mbps, 100000u);
  EXPECT_EQ(n.numa_node, 0);
  EXPECT_NE(n.pci_path.find("0000:02:01.0/0000:04:00.0"), std::string::npos) << n.pci_path;
  NicInfo s = Read("sys0");
  EXPECT_EQ(s.numa_node, 1);
  NicInfo v = Read("veth0");  // virtual: a speed, no PCI function
  EXPECT_EQ(v.speed_mbps, 10000u);
  EXPECT_TRUE(v.pci_path.empty());
  EXPECT_EQ(v.numa_node, -1);
  EXPECT_EQ(Read("virt0").speed_mbps, 0u);   // -1 in sysfs: unknown
  EXPECT_FALSE(Read("virt0").pci_path.empty());  // under its PCI function
  NicInfo missing = Read("nosuch0");
  EXPECT_EQ(missing.speed_mbps, 0u);
  EXPECT_TRUE(missing.pci_path.empty());
  // A name from a peer or a config never walks out of class/net.
  EXPECT_TRUE(Read("../../devices").pci_path.empty());
  EXPECT_TRUE(Read("..").pci_path.empty());
}

TEST_F(FakeSysfs, GpuPlaceComesFromTheBusId) {
  MemoryPlace g = Gpu();
  EXPECT_NE(g.pci_path.find("0000:03:00.0"), std::string::npos);
  EXPECT_EQ(g.numa_node, 0);
  EXPECT_TRUE(GpuPlace(root_.string(), "0000:99:00.0").pci_path.empty());
  EXPECT_TRUE(GpuPlace(root_.string(), "../../../etc").pci_path.empty());
}

TEST_F(FakeSysfs, AffinityClassesFollowNccl) {
  MemoryPlace g = Gpu();
  EXPECT_EQ(AffinityOf(Read("pix0"), g), Affinity::kPix);
  EXPECT_EQ(AffinityOf(Read("pix1"), g), Affinity::kPix);
  EXPECT_EQ(AffinityOf(Read("pxb0"), g), Affinity::kPxb);
  EXPECT_EQ(AffinityOf(Read("phb0"), g), Affinity::kPhb);
  EXPECT_EQ(AffinityOf(Read("node0"), g), Affinity::kNode);
  EXPECT_EQ(AffinityOf(Read("sys0"), g), Affinity::kSys);
  EXPECT_EQ(AffinityOf(Read("virt0"), g), Affinity::kPhb);  // its PCI function sits on the root complex
  EXPECT_EQ(AffinityOf(Read("veth0"), g), Affinity::kUnknown);
  EXPECT_EQ(AffinityOf(Read("pix0"), MemoryPlace{}), Affinity::kUnknown);  // host memory
  EXPECT_STREQ(AffinityName(Affinity::kPxb), "PXB");
}

TEST_F(FakeSysfs, GpuMemoryUsesTheNearestNicsFastestFirst) {
  std::vector<RankedPath> paths;
  for (const char* n : {"sys0", "veth0", "pix1", "phb0", "pix0", "pxb0", "node0"}) {
    paths.push_back({std::string(n) + "-path", Read(n)});
  }
  PathPreference p = RankPaths(paths, Gpu());
  EXPECT_EQ(p.tier, (std::vector<std::string>{"pix0-path", "pix1-path"}));
  EXPECT_EQ(p.fastest, (std::vector<std::string>{"pix0-path"}));
  // Without the switch's NICs, the next class.
  paths.erase(std::remove_if(paths.begin(), paths.end(),
                             [](const RankedPath& r) { return r.name.rfind("pix", 0) == 0; }),
              paths.end());
  EXPECT_EQ(RankPaths(paths, Gpu()).tier, (std::vector<std::string>{"pxb0-path"}));
}

TEST_F(FakeSysfs, HostMemoryUsesEveryPathTheFastestForOneSlice) {
  std::vector<RankedPath> paths;
  for (const char* n : {"veth0", "pix1", "sys0", "pix0"}) paths.push_back({n, Read(n)});
  PathPreference p = RankPaths(paths, MemoryPlace{});
  EXPECT_EQ(p.tier, (std::vector<std::string>{"sys0", "pix0", "pix1", "veth0"}));
  EXPECT_EQ(p.fastest, (std::vector<std::string>{"sys0"}));
  // Equal speeds (veth cables): all of them are the fastest.
  std::vector<RankedPath> veths = {{"a", Read("veth0")}, {"b", Read("veth0")}};
  EXPECT_EQ(RankPaths(veths, MemoryPlace{}).fastest, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(RankPaths({}, MemoryPlace{}).tier.empty());
}

// Host memory placed at a NIC (ExportRequest.mesh_affinity naming it: an NCCL
// rail device's bounce buffers) prefers that NIC and its switch siblings, and
// a NIC straight on the root complex is still nearest to itself.
TEST_F(FakeSysfs, MemoryPlacedAtANicPrefersItsRail) {
  fs::create_directory_symlink(root_ / "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.1/0000:04:00.1",
                               root_ / "bus/pci/devices/0000:04:00.1");
  fs::create_directory_symlink(root_ / "devices/pci0000:00/0000:00:02.0/0000:05:00.0",
                               root_ / "bus/pci/devices/0000:05:00.0");
  std::vector<RankedPath> paths;
  for (const char* n : {"sys0", "pix0", "phb0", "pix1", "node0"}) paths.push_back({n, Read(n)});
  MemoryPlace at_pix1 = GpuPlace(root_.string(), "0000:04:00.1");
  EXPECT_EQ(AffinityOf(Read("pix1"), at_pix1), Affinity::kPix);
  EXPECT_EQ(RankPaths(paths, at_pix1).tier, (std::vector<std::string>{"pix0", "pix1"}));
  MemoryPlace at_phb0 = GpuPlace(root_.string(), "0000:05:00.0");
  EXPECT_EQ(AffinityOf(Read("phb0"), at_phb0), Affinity::kPix);
  EXPECT_EQ(AffinityOf(Read("pix0"), at_phb0), Affinity::kPhb);
  EXPECT_EQ(RankPaths(paths, at_phb0).tier, (std::vector<std::string>{"phb0"}));
}

TEST(MayUse, PreferredWhileUpThenTheTierThenAny) {
  PathPreference p;
  p.tier = {"near-fast", "near-slow"};
  p.fastest = {"near-fast"};
  std::set<std::string> all = {"near-fast", "near-slow", "far"};
  EXPECT_TRUE(MayUse(nullptr, true, "far", all));
  // Several slices: the tier.
  EXPECT_TRUE(MayUse(&p, false, "near-fast", all));
  EXPECT_TRUE(MayUse(&p, false, "near-slow", all));
  EXPECT_FALSE(MayUse(&p, false, "far", all));
  // One slice: the fastest.
  EXPECT_TRUE(MayUse(&p, true, "near-fast", all));
  EXPECT_FALSE(MayUse(&p, true, "near-slow", all));
  // The fastest is down: the rest of the tier.
  std::set<std::string> slow_left = {"near-slow", "far"};
  EXPECT_TRUE(MayUse(&p, true, "near-slow", slow_left));
  EXPECT_FALSE(MayUse(&p, true, "far", slow_left));
  // The whole tier is down: anything that is up.
  std::set<std::string> far_left = {"far"};
  EXPECT_TRUE(MayUse(&p, true, "far", far_left));
  EXPECT_TRUE(MayUse(&p, false, "far", far_left));
}

// What a peer advertises is kept for operators only, bounded and printable.
TEST(PeerLinkInfo, AHostilePeersLinksAreBoundedAndPrintable) {
  podlink::mesh::v1::HelloResponse hello;
  for (int i = 0; i < 1000; ++i) {
    podlink::mesh::v1::LinkInfo* l = hello.add_links();
    l->set_address("10.0.0.1/30");
    l->set_netdev(std::string("eth\x1b[2J\x07\n") + std::string(100000, 'x'));
    l->set_gid_type(std::string(5000, '\x7f'));
  }
  std::vector<podlink::mesh::v1::LinkInfo> kept = PeerLinkInfo(hello);
  ASSERT_EQ(kept.size(), 64u);
  for (const auto& l : kept) {
    EXPECT_EQ(l.address(), "10.0.0.1/30");
    EXPECT_EQ(l.netdev().size(), 256u);
    EXPECT_EQ(l.netdev().rfind("eth?[2J??x", 0), 0u) << l.netdev().substr(0, 16);
    EXPECT_EQ(l.gid_type(), std::string(256, '?'));
  }
}

// The one bus-id form the daemon (sysfs, a pod's mesh_affinity) and the NCCL
// plugin accept.
TEST(PciBusId, OnlySysfsForm) {
  EXPECT_TRUE(IsPciBusId("0000:18:00.0"));
  EXPECT_TRUE(IsPciBusId("abcd:ef:1f.7"));
  for (const char* bad : {"", "0000:18:00", "0000:18:00.8", "0000:18:00.00", "0000:1G:00.0", "0000:AB:00.0",
                          "00000000:18:00.0", "0000-18:00.0", "0000:18-00.0", "0000:18:00-0", "pci0000:00",
                          "0000:18:00.0/../..", "0000:18:00.\n"}) {
    EXPECT_FALSE(IsPciBusId(bad)) << bad;
  }
  EXPECT_FALSE(IsPciBusId(std::string_view("0000:18:00.0\0", 13)));
}

}  // namespace
}  // namespace podlink::mesh
