#include "daemon/identity/cgroup_parser.h"

#include "gtest/gtest.h"

namespace podlink {
namespace {

constexpr char kUid[] = "5f2a7c1e-3b4d-4e8f-9a0b-1c2d3e4f5a6b";
constexpr char kUidUnderscore[] = "5f2a7c1e_3b4d_4e8f_9a0b_1c2d3e4f5a6b";
constexpr char kCid[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

struct Fixture {
  const char* what;
  std::string path;
  std::string qos;
  std::string runtime;
};

class CgroupSchemes : public ::testing::TestWithParam<Fixture> {};

TEST_P(CgroupSchemes, ExtractsPodAndContainer) {
  const Fixture& f = GetParam();
  CgroupInfo info = ParseCgroupPath(f.path);
  EXPECT_EQ(info.pod_uid, kUid) << f.what;
  EXPECT_EQ(info.container_id, kCid) << f.what;
  EXPECT_EQ(info.qos_class, f.qos) << f.what;
  EXPECT_EQ(info.runtime, f.runtime) << f.what;
  EXPECT_EQ(info.path, f.path);
}

std::string S(const std::string& a) { return a; }

INSTANTIATE_TEST_SUITE_P(
    AllDriversRuntimesQos, CgroupSchemes,
    ::testing::Values(
        Fixture{"systemd containerd burstable",
                S("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod") + kUidUnderscore +
                    ".slice/cri-containerd-" + kCid + ".scope",
                "burstable", "containerd"},
        Fixture{"systemd containerd besteffort",
                S("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod") + kUidUnderscore +
                    ".slice/cri-containerd-" + kCid + ".scope",
                "besteffort", "containerd"},
        Fixture{"systemd containerd guaranteed",
                S("/kubepods.slice/kubepods-pod") + kUidUnderscore + ".slice/cri-containerd-" + kCid + ".scope",
                "guaranteed", "containerd"},
        Fixture{"systemd cri-o burstable",
                S("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod") + kUidUnderscore +
                    ".slice/crio-" + kCid + ".scope",
                "burstable", "cri-o"},
        Fixture{"systemd cri-o guaranteed",
                S("/kubepods.slice/kubepods-pod") + kUidUnderscore + ".slice/crio-" + kCid + ".scope", "guaranteed",
                "cri-o"},
        Fixture{"systemd docker (cri-dockerd)",
                S("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod") + kUidUnderscore +
                    ".slice/docker-" + kCid + ".scope",
                "besteffort", "docker"},
        Fixture{"cgroupfs containerd burstable", S("/kubepods/burstable/pod") + kUid + "/" + kCid, "burstable", ""},
        Fixture{"cgroupfs containerd besteffort", S("/kubepods/besteffort/pod") + kUid + "/" + kCid, "besteffort",
                ""},
        Fixture{"cgroupfs guaranteed", S("/kubepods/pod") + kUid + "/" + kCid, "guaranteed", ""},
        Fixture{"cgroupfs cri-o", S("/kubepods/burstable/pod") + kUid + "/crio-" + kCid, "burstable", "cri-o"},
        Fixture{"kind node (nested prefix)",
                S("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
                  "kubelet-kubepods-burstable-pod") +
                    kUidUnderscore + ".slice/cri-containerd-" + kCid + ".scope",
                "burstable", "containerd"},
        Fixture{"test prefix before kubepods",
                S("/podlink-test-123/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod") +
                    kUidUnderscore + ".slice/cri-containerd-" + kCid + ".scope",
                "besteffort", "containerd"}));

TEST(CgroupParser, CrioConmonIsNotAContainer) {
  CgroupInfo info = ParseCgroupPath(S("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod") +
                                    kUidUnderscore + ".slice/crio-conmon-" + kCid + ".scope");
  EXPECT_EQ(info.pod_uid, kUid);
  EXPECT_EQ(info.container_id, "");
}

TEST(CgroupParser, PodSandboxLevelHasNoContainer) {
  CgroupInfo info = ParseCgroupPath(S("/kubepods/besteffort/pod") + kUid);
  EXPECT_EQ(info.pod_uid, kUid);
  EXPECT_EQ(info.container_id, "");
  EXPECT_TRUE(info.in_pod());
}

TEST(CgroupParser, NonPodProcesses) {
  EXPECT_FALSE(ParseCgroupPath("/").in_pod());
  EXPECT_FALSE(ParseCgroupPath("/user.slice/user-1000.slice/session-3.scope").in_pod());
  CgroupInfo docker = ParseCgroupPath(S("/system.slice/docker-") + kCid + ".scope");
  EXPECT_FALSE(docker.in_pod());
  EXPECT_EQ(docker.container_id, kCid);
  EXPECT_EQ(docker.runtime, "docker");
  EXPECT_EQ(docker.qos_class, "");
}

TEST(CgroupParser, RejectsLookalikes) {
  // Not a UUID after "pod", and a too-short container id.
  CgroupInfo a = ParseCgroupPath("/kubepods/burstable/podnot-a-uuid/abc");
  EXPECT_FALSE(a.in_pod());
  CgroupInfo b = ParseCgroupPath(S("/kubepods/burstable/pod") + kUid + "/abc");
  EXPECT_TRUE(b.in_pod());
  EXPECT_EQ(b.container_id, "");
  // "kubepods" must be a path segment, not a substring of a user's cgroup name.
  EXPECT_FALSE(ParseCgroupPath(S("/user.slice/mykubepods/pod") + kUid + "/" + kCid).in_pod());
}

TEST(ParseProcCgroup, PrefersV2Line) {
  std::string text = S("12:memory:/other\n0::/kubepods.slice/kubepods-pod") + kUidUnderscore +
                     ".slice/cri-containerd-" + kCid + ".scope\n";
  auto info = ParseProcCgroup(text);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->pod_uid, kUid);
}

TEST(ParseProcCgroup, HybridFallsBackToV1PodLine) {
  std::string text = S("9:name=systemd:/kubepods/burstable/pod") + kUid + "/" + kCid +
                     "\n4:memory:/kubepods/burstable/pod" + kUid + "/" + kCid + "\n0::/\n";
  auto info = ParseProcCgroup(text);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->pod_uid, kUid);
  EXPECT_EQ(info->container_id, kCid);
  EXPECT_EQ(info->qos_class, "burstable");
}

TEST(ParseProcCgroup, PathWithColons) {
  auto info = ParseProcCgroup("0::/weird:name/x\n");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->path, "/weird:name/x");
}

TEST(ParseProcCgroup, MalformedInput) {
  EXPECT_FALSE(ParseProcCgroup("").ok());
  EXPECT_FALSE(ParseProcCgroup("garbage\nmore garbage\n").ok());
  EXPECT_FALSE(ParseProcCgroup("0::relative/path\n").ok());
  std::string huge(100000, 'x');
  EXPECT_FALSE(ParseProcCgroup(huge).ok());
}

}  // namespace
}  // namespace podlink
