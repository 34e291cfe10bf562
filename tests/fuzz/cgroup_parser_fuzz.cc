// Fuzzes the kubelet cgroup parser (daemon/identity/cgroup_parser.h): the
// input is the text of a /proc/<pid>/cgroup file, which a client shapes by
// creating cgroups of its own. It is parsed whole (ParseProcCgroup), line by
// line and as one path (ParseCgroupPath), under the default layout and under
// one whose kubelet roots are cut from the input's own paths.
//
// Every OK result that puts the process in a pod must:
//   - carry a canonical pod UID (36 chars, lowercase hex, dashes at 8, 13,
//     18, 23; or 32 lowercase hex for a static pod) and a container id of
//     12..64 lowercase hex digits;
//   - have a path that starts with one of the layout's roots followed by a
//     kubepods segment;
//   - stop being a pod when anything is appended below it: nothing below a
//     container's cgroup is believed (it is the client's to create).
// Violations abort.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "daemon/identity/cgroup_parser.h"

#include "tests/fuzz/fuzz_check.h"

namespace podlink {
namespace {

constexpr size_t kMaxDerivedRoots = 16;
constexpr char kUid[] = "5f2a7c1e-3b4d-4e8f-9a0b-1c2d3e4f5a6b";
constexpr char kUidUnderscore[] = "5f2a7c1e_3b4d_4e8f_9a0b_1c2d3e4f5a6b";
constexpr char kCid[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

bool IsLowerHex(absl::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return !s.empty();
}

bool IsCanonicalPodUid(absl::string_view u) {
  if (u.size() == 32) return IsLowerHex(u);
  if (u.size() != 36) return false;
  for (size_t i = 0; i < u.size(); ++i) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? u[i] != '-' : !IsLowerHex(u.substr(i, 1))) return false;
  }
  return true;
}

std::vector<absl::string_view> Segments(absl::string_view path) {
  return absl::StrSplit(path, '/', absl::SkipEmpty());
}

// True if `path` is <root>/<a segment naming kubepods>/... for a layout root.
bool UnderKubeletRoot(absl::string_view path, const CgroupLayout& layout) {
  std::vector<absl::string_view> segs = Segments(path);
  for (const std::string& root : layout.kubelet_roots) {
    std::vector<absl::string_view> rs = Segments(root);
    if (rs.size() < segs.size() && std::equal(rs.begin(), rs.end(), segs.begin()) &&
        absl::StrContains(segs[rs.size()], "kubepods")) {
      return true;
    }
  }
  return false;
}

// The cgroup paths of the input's "id:controllers:/path" lines.
std::vector<absl::string_view> LinePaths(absl::string_view text) {
  std::vector<absl::string_view> paths;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() == 3 && absl::StartsWith(parts[2], "/")) paths.push_back(parts[2]);
  }
  return paths;
}

// Roots cut from the input's paths at each '/', as written (with their
// doubled or trailing slashes), so some roots lie above a kubepods segment,
// some inside a pod and some are kind-style "<name>.slice" roots.
CgroupLayout DerivedLayout(const std::vector<absl::string_view>& paths) {
  CgroupLayout layout;
  layout.kubelet_roots.clear();
  for (absl::string_view path : paths) {
    for (size_t pos = path.find('/', 1);
         pos != absl::string_view::npos && layout.kubelet_roots.size() < kMaxDerivedRoots;
         pos = path.find('/', pos + 1)) {
      layout.kubelet_roots.emplace_back(path.substr(0, pos));
      if (layout.kubelet_roots.size() < kMaxDerivedRoots) layout.kubelet_roots.emplace_back(path.substr(0, pos + 1));
    }
  }
  if (layout.kubelet_roots.empty()) layout.kubelet_roots.push_back("/");
  return layout;
}

void CheckResult(const absl::StatusOr<CgroupInfo>& r, const CgroupLayout& layout, bool default_layout,
                 const char* what) {
  if (!r.ok()) {
    const absl::StatusCode code = r.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kPermissionDenied || code == absl::StatusCode::kInvalidArgument,
               "%s: unexpected error %s", what, r.status().ToString().c_str());
    return;
  }
  const CgroupInfo& info = *r;
  if (!info.container_id.empty()) {
    FUZZ_CHECK(info.container_id.size() >= 12 && info.container_id.size() <= 64 && IsLowerHex(info.container_id),
               "%s: container id '%s' of %s", what, info.container_id.c_str(), info.path.c_str());
  }
  if (!info.in_pod()) return;
  FUZZ_CHECK(IsCanonicalPodUid(info.pod_uid), "%s: pod uid '%s' of %s", what, info.pod_uid.c_str(),
             info.path.c_str());
  FUZZ_CHECK(!info.container_id.empty(), "%s: pod %s without a container: %s", what, info.pod_uid.c_str(),
             info.path.c_str());
  FUZZ_CHECK(UnderKubeletRoot(info.path, layout), "%s: pod path %s is not <root>/kubepods... for any root", what,
             info.path.c_str());
  FUZZ_CHECK(info.qos_class == "guaranteed" || info.qos_class == "burstable" || info.qos_class == "besteffort",
             "%s: qos '%s' of %s", what, info.qos_class.c_str(), info.path.c_str());

  // Nothing below a container is believed. (A layout root inside a pod could
  // legitimately make a whole nested kubepods tree a pod; only the default
  // layout has no such root.)
  std::vector<std::string> below = {"/x", absl::StrCat("/", kCid),
                                    absl::StrCat("/cri-containerd-", kCid, ".scope")};
  if (default_layout) {
    below.push_back(absl::StrCat("/kubepods/pod", kUid, "/", kCid));
    below.push_back(
        absl::StrCat("/kubepods.slice/kubepods-pod", kUidUnderscore, ".slice/cri-containerd-", kCid, ".scope"));
  }
  for (const std::string& suffix : below) {
    std::string deeper = info.path + suffix;
    absl::StatusOr<CgroupInfo> sub = ParseCgroupPath(deeper, layout);
    FUZZ_CHECK(!sub.ok() || !sub->in_pod(), "%s: %s (below pod %s's container) believed as pod %s", what,
               deeper.c_str(), info.pod_uid.c_str(), sub->pod_uid.c_str());
  }
}

void CheckText(absl::string_view text, const CgroupLayout& layout, bool default_layout) {
  absl::StatusOr<CgroupInfo> whole = ParseProcCgroup(text, layout);
  CheckResult(whole, layout, default_layout, "ParseProcCgroup");
  if (whole.ok()) {
    FUZZ_CHECK(absl::StrContains(text, whole->path), "ParseProcCgroup: path %s is not in the input",
               whole->path.c_str());
  }
  for (absl::string_view path : LinePaths(text)) {
    absl::StatusOr<CgroupInfo> line = ParseCgroupPath(path, layout);
    CheckResult(line, layout, default_layout, "ParseCgroupPath(line)");
    // A line that is a pod makes the file that pod (or a refusal).
    if (line.ok() && line->in_pod() && whole.ok()) {
      FUZZ_CHECK(whole->pod_uid == line->pod_uid && whole->container_id == line->container_id,
                 "ParseProcCgroup chose %s/%s, but line %s is pod %s/%s", whole->pod_uid.c_str(),
                 whole->container_id.c_str(), line->path.c_str(), line->pod_uid.c_str(), line->container_id.c_str());
    }
  }
  CheckResult(ParseCgroupPath(text, layout), layout, default_layout, "ParseCgroupPath(input)");
}

}  // namespace
}  // namespace podlink

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  podlink::CheckText(text, podlink::CgroupLayout{}, /*default_layout=*/true);
  podlink::CheckText(text, podlink::DerivedLayout(podlink::LinePaths(text)), /*default_layout=*/false);
  return 0;
}
