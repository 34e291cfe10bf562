// GID choice for mesh paths (daemon/mesh/verbs/gid.h) on fake sysfs trees
// laid out as the kernel does (/sys/class/infiniband/<dev>/ports/<p>/...).
#include "daemon/mesh/verbs/gid.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace podlink::mesh::verbs {
namespace {

namespace fs = std::filesystem;

class FakeSysfs {
 public:
  FakeSysfs() {
    char tmpl[] = "/tmp/podlink-gid-XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  const std::string& root() const { return root_; }
  // An entry of a device's GID table; type empty: unreadable (as sysfs
  // answers for unused entries).
  void Gid(const std::string& dev, int port, int index, const std::string& gid, const std::string& type,
           const std::string& ndev = "eth0") {
    std::string base = root_ + "/" + dev + "/ports/" + std::to_string(port);
    fs::create_directories(base + "/gids");
    fs::create_directories(base + "/gid_attrs/types");
    fs::create_directories(base + "/gid_attrs/ndevs");
    std::ofstream(base + "/gids/" + std::to_string(index)) << gid << "\n";
    if (!type.empty()) std::ofstream(base + "/gid_attrs/types/" + std::to_string(index)) << type << "\n";
    if (!ndev.empty()) std::ofstream(base + "/gid_attrs/ndevs/" + std::to_string(index)) << ndev << "\n";
  }

 private:
  std::string root_;
};

IpPrefix Ip(const char* text) { return *IpPrefix::Parse(text); }

constexpr char kZero[] = "0000:0000:0000:0000:0000:0000:0000:0000";
constexpr char kLinkLocal[] = "fe80:0000:0000:0000:5054:00ff:fe00:0100";
constexpr char kV4[] = "0000:0000:0000:0000:0000:ffff:0a4d:0101";  // ::ffff:10.77.1.1

TEST(VerbsGid, PicksRoceV2EntryOfTheAddress) {
  FakeSysfs s;
  s.Gid("rxe0", 1, 0, kLinkLocal, "IB/RoCE v1");
  s.Gid("rxe0", 1, 1, kLinkLocal, "RoCE v2");
  s.Gid("rxe0", 1, 2, kV4, "IB/RoCE v1");
  s.Gid("rxe0", 1, 3, kV4, "RoCE v2");
  s.Gid("rxe0", 1, 4, kZero, "");
  auto c = ChooseGid(s.root(), Ip("10.77.1.1/30"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "rxe0");
  EXPECT_EQ(c->port, 1);
  EXPECT_EQ(c->index, 3);
  EXPECT_TRUE(c->roce_v2);
  EXPECT_EQ(c->netdev, "eth0");
  EXPECT_EQ(c->gid[10], 0xff);
  EXPECT_EQ(c->gid[15], 0x01);
}

TEST(VerbsGid, RoceV1OnlyWhenNoV2) {
  FakeSysfs s;
  s.Gid("mlx5_0", 1, 0, kV4, "IB/RoCE v1");
  auto c = ChooseGid(s.root(), Ip("10.77.1.1"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index, 0);
  EXPECT_FALSE(c->roce_v2);
}

TEST(VerbsGid, TheDeviceOnTheAddressNetdevAmongSeveral) {
  FakeSysfs s;
  s.Gid("mlx5_0", 1, 3, "0000:0000:0000:0000:0000:ffff:0a4d:0201", "RoCE v2", "eth1");  // 10.77.2.1
  s.Gid("mlx5_1", 1, 3, kV4, "RoCE v2", "eth2");
  auto c = ChooseGid(s.root(), Ip("10.77.1.1/30"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "mlx5_1");
  EXPECT_EQ(c->netdev, "eth2");
}

TEST(VerbsGid, Ipv6AddressIsItsOwnGid) {
  FakeSysfs s;
  s.Gid("rxe0", 1, 1, "fd00:0000:0000:0000:0000:0000:0000:0002", "RoCE v2");
  auto c = ChooseGid(s.root(), Ip("fd00::2/64"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index, 1);
}

TEST(VerbsGid, NoDeviceForTheAddressSaysWhat) {
  FakeSysfs s;
  s.Gid("rxe0", 1, 1, kLinkLocal, "RoCE v2");
  IpPrefix ip = Ip("10.77.9.1/30");
  ip.netdev = "eth9";
  auto c = ChooseGid(s.root(), ip);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("10.77.9.1"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("eth9"), std::string::npos) << c.status();
}

TEST(VerbsGid, NoSysfsAtAll) {
  auto c = ChooseGid("/nonexistent/podlink", Ip("10.77.1.1/30"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

TEST(VerbsGid, OverrideTakesThatIndexOfTheSameDevice) {
  FakeSysfs s;
  s.Gid("rxe0", 1, 2, kV4, "IB/RoCE v1");
  s.Gid("rxe0", 1, 3, kV4, "RoCE v2");
  auto c = ChooseGid(s.root(), Ip("10.77.1.1/30"), 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index, 2);
  EXPECT_FALSE(c->roce_v2);
  auto empty = ChooseGid(s.root(), Ip("10.77.1.1/30"), 7);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
}

TEST(VerbsGid, MalformedEntriesAreSkipped) {
  FakeSysfs s;
  s.Gid("rxe0", 1, 0, "not-a-gid", "RoCE v2");
  s.Gid("rxe0", 1, 1, "0000:0000:0000:0000:0000:ffff:0a4d:01", "RoCE v2");  // short
  s.Gid("rxe0", 1, 2, kV4, "RoCE v2");
  fs::create_directories(s.root() + "/rxe0/ports/notaport");
  auto c = ChooseGid(s.root(), Ip("10.77.1.1/30"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->index, 2);
}

TEST(VerbsGid, ParseGid) {
  auto g = ParseGid(kLinkLocal);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)[0], 0xfe);
  EXPECT_EQ((*g)[1], 0x80);
  EXPECT_FALSE(ParseGid("fe80::1").ok());
  EXPECT_FALSE(ParseGid("").ok());
  EXPECT_FALSE(ParseGid("gggg:0000:0000:0000:0000:0000:0000:0000").ok());
}

}  // namespace
}  // namespace podlink::mesh::verbs
