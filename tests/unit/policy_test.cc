#include "daemon/policy/policy.h"

#include "gtest/gtest.h"

namespace podlink {
namespace {

PodInfo Pod(std::string ns, std::string name, std::string group = "", std::string key = "") {
  PodInfo p;
  p.namespace_ = ns;
  p.name = name;
  p.key = key.empty() ? ns + "/" + name : key;
  if (!group.empty()) p.annotations[kPeerGroupAnnotation] = group;
  return p;
}

absl::Status Check(const PodInfo& owner, const PodInfo& importer, std::vector<PodName> allowed = {}) {
  ExportPolicyView v{42, "kv-cache", &owner, &allowed};
  return CheckImport(v, importer);
}

TEST(Policy, SamePodAlwaysAllowed) {
  PodInfo a = Pod("ml", "a");
  EXPECT_TRUE(Check(a, a).ok());
  // Same pod key, e.g. two containers of one pod.
  EXPECT_TRUE(Check(Pod("ml", "a", "", "pod:1"), Pod("ml", "a", "", "pod:1")).ok());
}

TEST(Policy, SamePeerGroupSameNamespaceAllowed) {
  EXPECT_TRUE(Check(Pod("ml", "prefill", "job-7"), Pod("ml", "decode", "job-7")).ok());
}

TEST(Policy, DenyByDefault) {
  absl::Status s = Check(Pod("ml", "prefill"), Pod("ml", "decode"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("podlink.io/peer-group"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("ml/decode"), absl::string_view::npos) << s;
}

TEST(Policy, DifferentGroupsDeniedWithFix) {
  absl::Status s = Check(Pod("ml", "prefill", "job-7"), Pod("ml", "decode", "job-8"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("podlink.io/peer-group=job-7"), absl::string_view::npos) << s;
}

TEST(Policy, ImporterWithoutAnnotationDeniedWithFix) {
  absl::Status s = Check(Pod("ml", "prefill", "job-7"), Pod("ml", "decode"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("add podlink.io/peer-group=job-7"), absl::string_view::npos) << s;
}

TEST(Policy, SameGroupOtherNamespaceDenied) {
  absl::Status s = Check(Pod("team-a", "prefill", "job-7"), Pod("team-b", "decode", "job-7"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("one namespace"), absl::string_view::npos) << s;
}

TEST(Policy, NamedImporterAllowedAcrossNamespacesAndGroups) {
  EXPECT_TRUE(Check(Pod("team-a", "prefill"), Pod("team-b", "decode"), {{"team-b", "decode"}}).ok());
  // Naming is exact: another pod of that namespace is still denied.
  EXPECT_FALSE(Check(Pod("team-a", "prefill"), Pod("team-b", "other"), {{"team-b", "decode"}}).ok());
  EXPECT_FALSE(Check(Pod("team-a", "prefill"), Pod("team-c", "decode"), {{"team-b", "decode"}}).ok());
}

TEST(Policy, DenialReasonLabels) {
  std::vector<PodName> none;
  auto label = [&](const PodInfo& o, const PodInfo& i) {
    const char* r = "unset";
    ExportPolicyView v{1, "", &o, &none};
    EXPECT_FALSE(CheckImport(v, i, &r).ok());
    return std::string(r);
  };
  EXPECT_EQ(label(Pod("a", "x", "g"), Pod("b", "y", "g")), "namespace_mismatch");
  EXPECT_EQ(label(Pod("a", "x"), Pod("a", "y", "g")), "exporter_not_in_group");
  EXPECT_EQ(label(Pod("a", "x", "g"), Pod("a", "y")), "importer_not_in_group");
  EXPECT_EQ(label(Pod("a", "x", "g"), Pod("a", "y", "h")), "group_mismatch");
}

TEST(Policy, EmptyGroupsDoNotMatch) {
  PodInfo owner = Pod("ml", "a");
  owner.annotations[kPeerGroupAnnotation] = "";
  PodInfo imp = Pod("ml", "b");
  imp.annotations[kPeerGroupAnnotation] = "";
  EXPECT_FALSE(Check(owner, imp).ok());
}

}  // namespace
}  // namespace podlink
