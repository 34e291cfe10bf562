#include "daemon/identity/cgroup_parser.h"

#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
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

// Pod UIDs are RFC 4122 UUIDs; the systemd driver writes '_' for '-'.
std::string CanonicalPodUid(absl::string_view raw) {
  std::string uid = absl::AsciiStrToLower(absl::StrReplaceAll(raw, {{"_", "-"}}));
  if (uid.size() != 36) return "";
  for (size_t i = 0; i < uid.size(); ++i) {
    bool dash = (i == 8 || i == 13 || i == 18 || i == 23);
    if (dash ? uid[i] != '-' : !absl::ascii_isxdigit(static_cast<unsigned char>(uid[i]))) return "";
  }
  return uid;
}

// Container ids are 12..64 hex digits (containerd, CRI-O, Docker all use 64).
bool IsContainerId(absl::string_view s) { return s.size() >= 12 && s.size() <= 64 && IsHex(s); }

// Recognizes "<runtime-prefix><id>[.scope]" and returns true with id/runtime set.
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

}  // namespace

CgroupInfo ParseCgroupPath(absl::string_view path) {
  CgroupInfo info;
  info.path = std::string(path);
  std::vector<absl::string_view> segs = absl::StrSplit(path, '/', absl::SkipEmpty());
  bool in_kubepods = false;
  for (absl::string_view seg : segs) {
    absl::string_view name = seg;
    bool slice = absl::ConsumeSuffix(&name, ".slice");
    if (!in_kubepods) {
      // "kubepods", "kubepods.slice", or "kubelet-kubepods.slice" under kubelet.slice.
      if (name == "kubepods" || absl::EndsWith(name, "-kubepods")) in_kubepods = true;
      continue;
    }
    if (slice) {
      // systemd: kubepods-burstable.slice, kubepods-burstable-pod<uid>.slice,
      // kubepods-pod<uid>.slice (guaranteed).
      size_t pos = name.rfind("-pod");
      if (pos != absl::string_view::npos) {
        std::string uid = CanonicalPodUid(name.substr(pos + 4));
        if (!uid.empty()) {
          info.pod_uid = uid;
          if (absl::StrContains(name, "-burstable-")) {
            info.qos_class = "burstable";
          } else if (absl::StrContains(name, "-besteffort-")) {
            info.qos_class = "besteffort";
          } else {
            info.qos_class = "guaranteed";
          }
          continue;
        }
      }
      if (absl::EndsWith(name, "-burstable")) info.qos_class = "burstable";
      if (absl::EndsWith(name, "-besteffort")) info.qos_class = "besteffort";
      continue;
    }
    // cgroupfs: kubepods/burstable/pod<uid>/<id>
    if (info.pod_uid.empty()) {
      if (name == "burstable" || name == "besteffort") {
        info.qos_class = std::string(name);
        continue;
      }
      absl::string_view rest = name;
      if (absl::ConsumePrefix(&rest, "pod")) {
        std::string uid = CanonicalPodUid(rest);
        if (!uid.empty()) {
          info.pod_uid = uid;
          if (info.qos_class.empty()) info.qos_class = "guaranteed";
          continue;
        }
      }
      continue;
    }
    if (info.container_id.empty()) {
      ParseContainerSegment(seg, info.container_id, info.runtime);
    }
  }
  if (info.pod_uid.empty()) {
    // Not a pod; still record a container id (plain Docker/containerd).
    info.qos_class.clear();
    for (absl::string_view seg : segs) {
      if (ParseContainerSegment(seg, info.container_id, info.runtime)) break;
    }
  }
  return info;
}

absl::StatusOr<CgroupInfo> ParseProcCgroup(absl::string_view contents) {
  std::optional<CgroupInfo> v2;
  std::optional<CgroupInfo> v1_pod;
  bool any = false;
  for (absl::string_view line : absl::StrSplit(contents, '\n', absl::SkipWhitespace())) {
    // hierarchy-ID:controller-list:cgroup-path ; the path may contain ':'.
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3 || parts[2].empty() || parts[2][0] != '/') continue;
    any = true;
    CgroupInfo info = ParseCgroupPath(parts[2]);
    if (parts[0] == "0" && parts[1].empty()) {
      v2 = std::move(info);
    } else if (!v1_pod && info.in_pod()) {
      v1_pod = std::move(info);
    }
  }
  if (!any) return absl::InvalidArgumentError("cgroup file has no 'id:controllers:/path' line");
  if (v2 && (v2->in_pod() || !v1_pod)) return *std::move(v2);
  if (v1_pod) return *std::move(v1_pod);
  // Only v1 lines and none names a pod: report the first path.
  for (absl::string_view line : absl::StrSplit(contents, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() == 3 && !parts[2].empty() && parts[2][0] == '/') return ParseCgroupPath(parts[2]);
  }
  return absl::InvalidArgumentError("unreachable");
}

}  // namespace podlink
