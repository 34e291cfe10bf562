// What this node says of its own links (daemon/mesh/routing/local_nics.h), on a fake sysfs tree: each advertised
// address with its NIC and the GID a verbs peer would use; read again only when its period is due.
#include "daemon/mesh/routing/local_nics.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace podlink::mesh {
namespace {

namespace fs = std::filesystem;

class LocalNicsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/podlink-local-nics-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    fs::create_directories(root_ + "/sys/class/net/eth9");
    Speed("25000");
    // rxe0's port 1: a RoCE v2 entry for 10.77.1.1 (::ffff:10.77.1.1) on eth9.
    const std::string port = root_ + "/ib/rxe0/ports/1";
    for (const char* d : {"/gids", "/gid_attrs/types", "/gid_attrs/ndevs"}) fs::create_directories(port + d);
    std::ofstream(port + "/gids/1") << "0000:0000:0000:0000:0000:ffff:0a4d:0101\n";
    std::ofstream(port + "/gid_attrs/types/1") << "RoCE v2\n";
    std::ofstream(port + "/gid_attrs/ndevs/1") << "eth9\n";
    IpPrefix cabled = *IpPrefix::Parse("10.77.1.1/24");
    cabled.netdev = "eth9";
    advertised_ = {cabled, *IpPrefix::Parse("10.88.0.1/24")};  // the second: no interface holds it
  }
  void TearDown() override { fs::remove_all(root_); }
  void Speed(const std::string& mbps) { std::ofstream(root_ + "/sys/class/net/eth9/speed") << mbps << "\n"; }
  LocalNics Nics(absl::Duration period) { return LocalNics(root_ + "/sys", root_ + "/ib", period); }

  std::string root_;
  std::vector<IpPrefix> advertised_;
};

TEST_F(LocalNicsTest, EachAdvertisedAddressWithItsNicAndTheGidAVerbsPeerWouldUse) {
  LocalNics nics = Nics(absl::Hours(1));
  EXPECT_TRUE(nics.Current().empty()) << "nothing before the first read";
  nics.Read(advertised_);
  std::vector<v1::LinkInfo> links = nics.Current();
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0].address(), "10.77.1.1/24");
  EXPECT_EQ(links[0].netdev(), "eth9");
  EXPECT_EQ(links[0].speed_mbps(), 25000u);
  EXPECT_EQ(links[0].rdma_device(), "rxe0");
  EXPECT_EQ(links[0].gid_index(), 1);
  EXPECT_EQ(links[0].gid_type(), "RoCE v2");
  EXPECT_EQ(links[1].address(), "10.88.0.1/24");
  EXPECT_EQ(links[1].speed_mbps(), 0u);
  EXPECT_EQ(links[1].rdma_device(), "");
  EXPECT_EQ(links[1].gid_index(), -1) << "no GID: said as -1";
}

TEST_F(LocalNicsTest, ReadAgainOnlyWhenThePeriodIsDue) {
  LocalNics patient = Nics(absl::Hours(1)), eager = Nics(absl::ZeroDuration());
  patient.Read(advertised_);
  eager.Read(advertised_);
  Speed("50000");  // the link renegotiated
  patient.RefreshIfDue(advertised_);
  eager.RefreshIfDue(advertised_);
  EXPECT_EQ(patient.Current()[0].speed_mbps(), 25000u) << "read again before its period";
  EXPECT_EQ(eager.Current()[0].speed_mbps(), 50000u);
}

}  // namespace
}  // namespace podlink::mesh
