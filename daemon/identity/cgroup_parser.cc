#include "daemon/identity/cgroup_parser.h"

#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace podlink {
namespace {

bool IsHex(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Container ids are 12..64 hex digits (containerd, CRI-O, Docker all use 64).
bool IsContainerId(absl::string_view s) { return s.size() >= 12 && s.size() <= 64 && IsHex(s); }

// Recognizes "<runtime-prefix><id>[.scope]" or a bare id.
bool ParseContainerSegment(absl::string_view seg, std::string& id, std::string& runtime) {
  absl::ConsumeSuffix(&seg, ".scope");
  struct Prefix {
    absl::string_view text;
    absl::string_view runtime;
  };
  static constexpr Prefix kPrefixes[] = {
      {"cri-containerd-", "containerd"},
      {"crio-", "cri-o"},
      {"docker-", "docker"},
      {"containerd-", "containerd"},
  };
  if (absl::StartsWith(seg, "crio-conmon-")) return false;  // CRI-O's monitor, not a container
  for (const Prefix& p : kPrefixes) {
    absl::string_view rest = seg;
    if (absl::ConsumePrefix(&rest, p.text) && IsContainerId(rest)) {
      id = absl::AsciiStrToLower(rest);
      runtime = std::string(p.runtime);
      return true;
    }
  }
  if (IsContainerId(seg)) {  // cgroupfs driver: bare id
    id = absl::AsciiStrToLower(seg);
    runtime = "";
    return true;
  }
  return false;
}

// True for a segment that claims to be a pod's or kubepods' cgroup: such a
// segment outside the kubelet's layout is an impersonation attempt or a
// layout podlinkd does not understand, and either way must not be guessed.
bool LooksKube(absl::string_view seg) {
  absl::string_view name = seg;
  absl::ConsumeSuffix(&name, ".slice");
  if (absl::StrContains(name, "kubepods")) return true;
  size_t pos = name.rfind("pod");
  return pos != absl::string_view::npos && !CanonicalPodUid(name.substr(pos + 3)).empty();
}

std::vector<absl::string_view> Segments(absl::string_view path) {
  return absl::StrSplit(path, '/', absl::SkipEmpty());
}

// The systemd name prefix children of `root` carry: "" for "/" or a plain
// directory, "kubelet-" under "kubelet.slice".
std::string SlicePrefix(absl::string_view root) {
  std::vector<absl::string_view> segs = Segments(root);
  if (segs.empty()) return "";
  absl::string_view last = segs.back();
  if (!absl::ConsumeSuffix(&last, ".slice") || last == "-") return "";
  return absl::StrCat(last, "-");
}

// Matches `rest` (the segments below one kubelet root) against the kubelet's
// layout. nullopt if it does not match.
std::optional<CgroupInfo> MatchKubelet(const std::vector<absl::string_view>& rest, const std::string& prefix) {
  if (rest.empty()) return std::nullopt;
  CgroupInfo info;
  size_t i = 0;
  std::string uid;
  if (rest[0] == absl::StrCat(prefix, "kubepods.slice")) {
    // systemd driver.
    ++i;
    std::string pod_prefix = absl::StrCat(prefix, "kubepods-pod");
    info.qos_class = "guaranteed";
    for (absl::string_view qos : {"burstable", "besteffort"}) {
      if (i < rest.size() && rest[i] == absl::StrCat(prefix, "kubepods-", qos, ".slice")) {
        info.qos_class = std::string(qos);
        pod_prefix = absl::StrCat(prefix, "kubepods-", qos, "-pod");
        ++i;
        break;
      }
    }
    if (i >= rest.size()) return std::nullopt;
    absl::string_view pod = rest[i++];
    if (!absl::ConsumePrefix(&pod, pod_prefix) || !absl::ConsumeSuffix(&pod, ".slice")) return std::nullopt;
    uid = CanonicalPodUid(pod);
  } else if (rest[0] == "kubepods" && prefix.empty()) {
    // cgroupfs driver.
    ++i;
    info.qos_class = "guaranteed";
    if (i < rest.size() && (rest[i] == "burstable" || rest[i] == "besteffort")) info.qos_class = std::string(rest[i++]);
    if (i >= rest.size()) return std::nullopt;
    absl::string_view pod = rest[i++];
    if (!absl::ConsumePrefix(&pod, "pod")) return std::nullopt;
    uid = CanonicalPodUid(pod);
  } else {
    return std::nullopt;
  }
  if (uid.empty()) return std::nullopt;
  // Exactly one container segment, and nothing below it.
  if (i + 1 != rest.size()) return std::nullopt;
  if (!ParseContainerSegment(rest[i], info.container_id, info.runtime)) return std::nullopt;
  info.pod_uid = uid;
  return info;
}

}  // namespace

std::string CanonicalPodUid(absl::string_view raw) {
  std::string uid = absl::AsciiStrToLower(absl::StrReplaceAll(raw, {{"_", "-"}}));
  if (uid.size() == 32) return IsHex(uid) ? uid : "";  // static pods: a hash, no dashes
  if (uid.size() != 36) return "";
  for (size_t i = 0; i < uid.size(); ++i) {
    bool dash = (i == 8 || i == 13 || i == 18 || i == 23);
    if (dash ? uid[i] != '-' : !absl::ascii_isxdigit(static_cast<unsigned char>(uid[i]))) return "";
  }
  return uid;
}

absl::StatusOr<CgroupInfo> ParseCgroupPath(absl::string_view path, const CgroupLayout& layout) {
  std::vector<absl::string_view> segs = Segments(path);
  for (const std::string& root : layout.kubelet_roots) {
    std::vector<absl::string_view> root_segs = Segments(root);
    if (root_segs.size() >= segs.size() || !std::equal(root_segs.begin(), root_segs.end(), segs.begin())) continue;
    std::vector<absl::string_view> rest(segs.begin() + static_cast<long>(root_segs.size()), segs.end());
    if (std::optional<CgroupInfo> info = MatchKubelet(rest, SlicePrefix(root))) {
      info->path = std::string(path);
      return *std::move(info);
    }
  }
  for (absl::string_view seg : segs) {
    if (LooksKube(seg)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "cgroup ", path, " names a pod or kubepods cgroup but is not a container cgroup in the kubelet's layout "
          "under ", absl::StrJoin(layout.kubelet_roots, " or "),
          " (a pod segment elsewhere, a cgroup below the container's, or a cgroup namespace that hides the host's "
          "paths); podlinkd identifies pods only by the kubelet's own cgroups"));
    }
  }
  CgroupInfo info;
  info.path = std::string(path);
  // Not a pod; still record a container id (plain Docker/containerd).
  for (absl::string_view seg : segs) {
    if (ParseContainerSegment(seg, info.container_id, info.runtime)) break;
  }
  return info;
}

absl::StatusOr<CgroupInfo> ParseProcCgroup(absl::string_view contents, const CgroupLayout& layout) {
  std::optional<CgroupInfo> v2, first, pod;
  for (absl::string_view line : absl::StrSplit(contents, '\n', absl::SkipWhitespace())) {
    // hierarchy-ID:controller-list:cgroup-path ; the path may contain ':'.
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3 || parts[2].empty() || parts[2][0] != '/') continue;
    absl::StatusOr<CgroupInfo> info = ParseCgroupPath(parts[2], layout);
    if (!info.ok()) return info.status();
    if (info->in_pod()) {
      if (pod && (pod->pod_uid != info->pod_uid || pod->container_id != info->container_id)) {
        return absl::PermissionDeniedError(absl::StrCat("cgroup hierarchies disagree about the process's pod: ",
                                                        pod->path, " vs ", info->path));
      }
      if (!pod) pod = *info;
    }
    if (parts[0] == "0" && parts[1].empty()) v2 = *info;
    if (!first) first = *std::move(info);
  }
  if (!first) return absl::InvalidArgumentError("cgroup file has no 'id:controllers:/path' line");
  if (pod) return *std::move(pod);
  return v2 ? *std::move(v2) : *std::move(first);
}

}  // namespace podlink
