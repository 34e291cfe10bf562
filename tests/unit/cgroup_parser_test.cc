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
  CgroupLayout layout;
  layout.kubelet_roots.push_back("/podlink-test-123");
  absl::StatusOr<CgroupInfo> parsed = ParseCgroupPath(f.path, layout);
  ASSERT_TRUE(parsed.ok()) << f.what << ": " << parsed.status();
  const CgroupInfo& info = *parsed;
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

bool Refused(const std::string& path, const CgroupLayout& layout = {}) {
  absl::StatusOr<CgroupInfo> info = ParseCgroupPath(path, layout);
  return info.status().code() == absl::StatusCode::kPermissionDenied;
}

const std::string kPodSlice = S("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod") +
                              kUidUnderscore + ".slice";
const std::string kScope = S("cri-containerd-") + kCid + ".scope";

TEST(CgroupParser, StaticPodUidsAreAccepted) {
  const std::string uid = "0123456789abcdef0123456789abcdef";  // the kubelet's hash for a static pod
  auto info = ParseCgroupPath("/kubepods.slice/kubepods-pod" + uid + ".slice/" + kScope);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->pod_uid, uid);
}

TEST(CgroupParser, CrioConmonIsNotAContainer) {
  EXPECT_TRUE(Refused(kPodSlice + "/crio-conmon-" + kCid + ".scope"));
}

TEST(CgroupParser, PodLevelWithoutContainerIsRefused) {
  EXPECT_TRUE(Refused(S("/kubepods/besteffort/pod") + kUid));
  EXPECT_TRUE(Refused(kPodSlice));
  EXPECT_TRUE(Refused("/kubepods.slice"));
}

TEST(CgroupParser, NonPodProcesses) {
  EXPECT_FALSE(ParseCgroupPath("/")->in_pod());
  EXPECT_FALSE(ParseCgroupPath("/user.slice/user-1000.slice/session-3.scope")->in_pod());
  auto docker = ParseCgroupPath(S("/system.slice/docker-") + kCid + ".scope");
  ASSERT_TRUE(docker.ok());
  EXPECT_FALSE(docker->in_pod());
  EXPECT_EQ(docker->container_id, kCid);
  EXPECT_EQ(docker->runtime, "docker");
  EXPECT_EQ(docker->qos_class, "");
}

// The attacks of issue 11 (1): a client that can create cgroups below its own
// (systemd delegation, a nested runtime, a writable cgroupfs) must not become
// another pod by naming it.
TEST(CgroupParser, ChildCgroupsOfAContainerNamingAnotherPodAreRefused) {
  const std::string victim = "11111111_2222_4333_8444_555555555555";
  // <its scope>/x-pod<VICTIM>.slice, as found by the attack.
  EXPECT_TRUE(Refused(kPodSlice + "/" + kScope + "/x-pod" + victim + ".slice"));
  // A whole fake kubelet hierarchy below its own container.
  EXPECT_TRUE(Refused(kPodSlice + "/" + kScope + "/kubepods.slice/kubepods-pod" + victim + ".slice/" + kScope));
  // Anything at all below the container scope.
  EXPECT_TRUE(Refused(kPodSlice + "/" + kScope + "/init.scope"));
  EXPECT_TRUE(Refused(S("/kubepods/burstable/pod") + kUid + "/" + kCid + "/sub"));
}

TEST(CgroupParser, KubepodsPairsOutsideTheKubeletRootAreRefused) {
  // A delegated user slice can hold any names: a kubepods/pod<UID> pair
  // anywhere but at the kubelet's root is not a pod.
  EXPECT_TRUE(Refused(S("/user.slice/user-1000.slice/user@1000.service/kubepods/pod") + kUid + "/" + kCid));
  EXPECT_TRUE(Refused("/user.slice/user-1000.slice/user@1000.service/app.slice" + kPodSlice + "/" + kScope));
  EXPECT_TRUE(Refused(S("/x/kubepods.slice/kubepods-pod") + kUidUnderscore + ".slice/" + kScope));
  // A pod segment with no kubepods at all.
  EXPECT_TRUE(Refused(S("/user.slice/x-pod") + kUidUnderscore + ".slice"));
  // Paths seen from a private cgroup namespace hide the kubelet root.
  EXPECT_TRUE(Refused(S("/../../kubepods-besteffort-pod") + kUidUnderscore + ".slice/" + kScope));
  // The same test root is accepted only when configured.
  CgroupLayout test_root;
  test_root.kubelet_roots = {"/podlink-test-1"};
  EXPECT_TRUE(ParseCgroupPath("/podlink-test-1" + kPodSlice + "/" + kScope, test_root).ok());
  EXPECT_TRUE(Refused("/podlink-test-1" + kPodSlice + "/" + kScope));
  EXPECT_TRUE(Refused(kPodSlice + "/" + kScope, test_root));
}

TEST(CgroupParser, LookalikeNamesAreRefused) {
  // QoS and pod slices that do not match each other or the kubelet's names.
  EXPECT_TRUE(Refused(S("/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod") + kUidUnderscore +
                      ".slice/" + kScope));
  EXPECT_TRUE(Refused(S("/kubepods.slice/kubepods-burstable.slice/x-kubepods-burstable-pod") + kUidUnderscore +
                      ".slice/" + kScope));
  EXPECT_TRUE(Refused(S("/kubepods.slice/extra.slice/kubepods-pod") + kUidUnderscore + ".slice/" + kScope));
  EXPECT_TRUE(Refused("/kubepods/burstable/podnot-a-uuid/0123456789abcdef"));
  EXPECT_TRUE(Refused(S("/kubepods/burstable/pod") + kUid + "/abc"));  // not a container id
  EXPECT_TRUE(Refused(S("/kubepods/burstable/pod") + kUid + "/pod" + kUid + "/" + kCid));  // two pod levels
  // "kubepods" inside a user's cgroup name is refused too, not guessed.
  EXPECT_TRUE(Refused(S("/user.slice/mykubepods/pod") + kUid + "/" + kCid));
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

TEST(ParseProcCgroup, LinesNamingDifferentPodsAreRefused) {
  // A writable hierarchy (v2 under delegation) naming another pod than the
  // v1 controllers the kubelet set.
  std::string other = "11111111-2222-4333-8444-555555555555";
  std::string text = S("4:memory:/kubepods/burstable/pod") + kUid + "/" + kCid + "\n0::/kubepods/burstable/pod" +
                     other + "/" + kCid + "\n";
  EXPECT_EQ(ParseProcCgroup(text).status().code(), absl::StatusCode::kPermissionDenied);
  // Any refused line refuses the whole file.
  text = S("4:memory:/kubepods/burstable/pod") + kUid + "/" + kCid + "\n0::/kubepods/burstable/pod" + kUid + "/" +
         kCid + "/child\n";
  EXPECT_EQ(ParseProcCgroup(text).status().code(), absl::StatusCode::kPermissionDenied);
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
