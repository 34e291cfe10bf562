// Fuzzes what podlinkd parses from the Kubernetes API server and from its
// own command line for it (daemon/identity/kube_pods.h): a pod, a PodList
// page, a watch event, a name a peer forwards, the API server's URL. The
// first byte picks which; the rest is the text.
//
// Every accepted result must hold what the owner's check relies on:
//   - a pod has a UID, namespace and name, and keeps only podlink.io/
//     annotations, at most 256 of at most 4 KiB each;
//   - written back as JSON, it parses to the same pod;
//   - a list has a resourceVersion; every event but ERROR has one;
//   - a valid Kubernetes name cannot change a request path ('/', '?', '%',
//     '#', "..") and is at most 253 characters;
//   - a URL gives a host without '/' and a port in 1..65535.
// Violations abort.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "daemon/identity/kube_pods.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_check.h"

namespace podlink {
namespace {

void CheckPod(const KubePod& p, const char* what) {
  FUZZ_CHECK(!p.uid.empty() && !p.namespace_.empty() && !p.name.empty(), "%s: a pod without uid/namespace/name",
             what);
  FUZZ_CHECK(p.annotations.size() <= 256, "%s: %zu annotations kept", what, p.annotations.size());
  for (const auto& [k, v] : p.annotations) {
    FUZZ_CHECK(absl::StartsWith(k, kPodlinkAnnotationPrefix), "%s: annotation %s kept", what, k.c_str());
    FUZZ_CHECK(k.size() <= 4096 && v.size() <= 4096, "%s: an annotation of %zu/%zu bytes kept", what, k.size(),
               v.size());
  }
  // Written back as the API server would, it reads the same.
  nlohmann::json ann = nlohmann::json::object();
  for (const auto& [k, v] : p.annotations) ann[k] = v;
  nlohmann::json j = {{"metadata", {{"uid", p.uid}, {"namespace", p.namespace_}, {"name", p.name}, {"annotations", ann}}},
                      {"spec", {{"nodeName", p.node}}},
                      {"status", {{"phase", p.finished ? "Succeeded" : "Running"}}}};
  absl::StatusOr<KubePod> again = ParsePod(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  // Invalid UTF-8 in a string is replaced when written; compare only exact round trips.
  // (An oversized pod's annotations are not kept, so it reads back as an ordinary one.)
  if (!p.oversized && j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) ==
                          j.dump(-1, ' ', false, nlohmann::json::error_handler_t::ignore)) {
    FUZZ_CHECK(again.ok() && *again == p, "%s: the pod does not read back the same", what);
  }
}

void CheckName(absl::string_view s) {
  if (!ValidKubeName(s)) return;
  FUZZ_CHECK(s.size() <= 253, "a name of %zu characters", s.size());
  for (const char* bad : {"/", "?", "%", "#", "..", " ", "\\"}) {
    FUZZ_CHECK(!absl::StrContains(s, bad), "name '%s' holds '%s'", std::string(s).c_str(), bad);
  }
}

}  // namespace
}  // namespace podlink

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  using namespace podlink;
  switch (data[0] % 5) {
    case 0: {
      absl::StatusOr<KubePod> p = ParsePod(text);
      if (p.ok()) CheckPod(*p, "ParsePod");
      break;
    }
    case 1: {
      absl::StatusOr<PodListPage> l = ParsePodList(text);
      if (!l.ok()) break;
      FUZZ_CHECK(!l->resource_version.empty(), "a list without resourceVersion");
      for (const KubePod& p : l->pods) CheckPod(p, "ParsePodList");
      break;
    }
    case 2: {
      absl::StatusOr<PodWatchEvent> e = ParseWatchEvent(text);
      if (!e.ok()) break;
      if (e->type == PodWatchEvent::Type::kError) {
        FUZZ_CHECK(e->message.size() <= 300, "an error message of %zu bytes", e->message.size());
        break;
      }
      FUZZ_CHECK(!e->resource_version.empty(), "an event without resourceVersion");
      if (e->type != PodWatchEvent::Type::kBookmark) CheckPod(e->pod, "ParseWatchEvent");
      break;
    }
    case 3:
      CheckName(text);
      break;
    default: {
      absl::StatusOr<KubeApiConfig> c = ParseApiServerUrl(text);
      if (!c.ok()) break;
      FUZZ_CHECK(!c->host.empty() && c->host.find('/') == std::string::npos, "host '%s'", c->host.c_str());
      FUZZ_CHECK(c->port >= 1 && c->port <= 65535, "port %d", c->port);
      break;
    }
  }
  return 0;
}
