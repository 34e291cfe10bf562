// Pods as the Kubernetes API server states them.
//
// Another node's daemon forwards the identity of the pod it imports for
// (namespace, name, UID, annotations). With --remote-pods=apiserver the owner
// believes it only when the API server agrees: the pod exists with that UID,
// is bound to the forwarding daemon's node (its certificate's name) and
// carries the same podlink.io/ annotations (docs/security.md).
//
// PodDirectory keeps that view as a Kubernetes informer does: one paged
// list of /api/v1/pods, then a watch from the list's resourceVersion with
// bookmarks; an expired version (410 Gone) lists again. A pod it does not
// hold is fetched once by name (rate-limited), for pods created since the
// last event. Reads need only get/list/watch on pods (deploy/rbac.yaml).
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace podlink {

// Where the API server is and how podlinkd authenticates to it.
struct KubeApiConfig {
  std::string host;  // DNS name or address (IPv6 without brackets)
  int port = 443;
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
};

// In a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, and the
// service account's token and CA at their standard paths.
absl::StatusOr<KubeApiConfig> InClusterConfig();
// "https://host[:port]" (an IPv6 host in brackets), for out-of-cluster runs
// and tests; the token and CA files keep their defaults.
absl::StatusOr<KubeApiConfig> ParseApiServerUrl(absl::string_view url);

inline constexpr char kPodlinkAnnotationPrefix[] = "podlink.io/";

// What podlinkd keeps of a pod: enough to confirm a forwarded identity.
struct KubePod {
  std::string uid;
  std::string namespace_;
  std::string name;
  std::string node;  // spec.nodeName; empty while unscheduled
  std::map<std::string, std::string> annotations;  // podlink.io/ keys only
  bool finished = false;  // status.phase Succeeded or Failed
  // Its podlink.io/ annotations exceed the bounds (count, size): kept, so
  // that one pod cannot stop the list or the watch, but never confirmed.
  bool oversized = false;
  bool operator==(const KubePod&) const = default;
};

// The API server's JSON, parsed and bounded (a pod's object, a PodList page,
// one line of a watch). Anything malformed is INVALID_ARGUMENT.
absl::StatusOr<KubePod> ParsePod(absl::string_view json);
struct PodListPage {
  std::vector<KubePod> pods;
  std::string resource_version;
  std::string continue_token;
};
absl::StatusOr<PodListPage> ParsePodList(absl::string_view json);
struct PodWatchEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark, kError };
  Type type = Type::kError;
  KubePod pod;                   // added, modified, deleted
  std::string resource_version;  // every type but error
  int code = 0;                  // error: the Status's code (410: list again)
  std::string message;           // error: the Status's message
};
absl::StatusOr<PodWatchEvent> ParseWatchEvent(absl::string_view line);

// Whether `s` may be a namespace or pod name (RFC 1123 subdomain): what a
// peer sends is checked before it becomes part of a request path.
bool ValidKubeName(absl::string_view s);

struct PodDirectoryOptions {
  KubeApiConfig api;
  size_t max_pods = 200000;    // beyond this, pods are fetched one by one
  absl::Duration request_timeout = absl::Seconds(10);
  int watch_seconds = 60;  // the API server ends each watch after this (so the view moves on at least this often)
  absl::Duration retry_min = absl::Milliseconds(500);
  absl::Duration retry_max = absl::Seconds(30);
  int max_fetches_per_second = 20;  // pods not held, asked for by name; one node's daemon gets a quarter
  size_t page_size = 500;
  // A view that has not moved on for this long (no list, event, bookmark or
  // watch ending normally) is stale: its pods are looked up by name again and
  // none is called gone.
  absl::Duration stale_after = absl::Minutes(2);  // two watches' lengths: a hung connection
  // ...and once a request to the API server failed (an error answer, no
  // answer), the view is stale this long after the first failure unless it
  // moved on since: during an outage nothing is confirmed from memory for
  // longer than this (deletions may be missed meanwhile).
  absl::Duration failing_grace = absl::Seconds(5);
  // A pod confirmed by name but not yet delivered by the watch is called
  // gone only once the view has moved on this long past that lookup.
  absl::Duration fetched_grace = absl::Minutes(1);
};

// What another node is told of a refused pod: a class, never the API
// server's address, errors or other pods (the detail goes to the owner's log
// and metrics).
enum class RemotePodRefusal : int { kNotFound = 0, kOtherNode, kAnnotationsDiffer, kFinished, kCannotConfirmNow };
const char* RemotePodRefusalText(RemotePodRefusal r);
// Marks a refusal (its message stays the detail) with its class.
absl::Status TagRefusal(absl::Status detail, RemotePodRefusal why);
// The status to send the importing node: the code (UNAVAILABLE for "cannot
// confirm now", else PERMISSION_DENIED) and the class alone.
absl::Status ForPeerNode(const absl::Status& refusal);

class PodDirectory {
 public:
  explicit PodDirectory(PodDirectoryOptions options);
  ~PodDirectory();
  PodDirectory(const PodDirectory&) = delete;
  PodDirectory& operator=(const PodDirectory&) = delete;

  // Starts listing and watching on a thread of its own.
  void Start();
  void Stop();

  // The API server's pod for a forwarded identity, if it confirms every part
  // of it: `uid` names pod `ns`/`name`, bound to `node`, not finished, with
  // exactly the podlink.io/ annotations in `claimed`. Refusals say which part
  // differs (PERMISSION_DENIED) or why nothing can be confirmed now
  // (UNAVAILABLE).
  absl::StatusOr<KubePod> Confirm(const std::string& uid, const std::string& ns, const std::string& name,
                                  const std::string& node, const std::map<std::string, std::string>& claimed);

  // OK once the first list has loaded and while the API server answers.
  absl::Status Ready() const;

  // Whether the pod with UID `uid` is known to be gone: deleted (the watch
  // said so, whatever the view's state and however the pod was confirmed),
  // finished, or absent
  // from a complete, fresh view (listed, every pod held, moved on within
  // stale_after) that has also moved on fetched_grace past any lookup by name
  // that confirmed it (the watch may not have delivered it yet). False
  // whenever that cannot be known.
  bool Gone(const std::string& uid) const;

  struct Stats {
    size_t pods = 0;
    uint64_t lists = 0;          // full lists (the first, and after 410 Gone)
    uint64_t watches = 0;        // watch requests started
    uint64_t events = 0;         // watch events applied
    uint64_t fetches = 0;        // pods fetched by name
    uint64_t errors = 0;         // failed requests
    uint64_t confirmed = 0;      // Confirm: yes
    uint64_t refused = 0;        // Confirm: no
    std::array<uint64_t, 5> refused_by{};  // by RemotePodRefusal
    bool synced = false;
    std::string resource_version;
  };
  Stats GetStats() const;
  std::string RenderMetrics() const;

 private:
  class Http;
  void Run();
  absl::Status List();
  absl::Status Watch();
  void Apply(const PodWatchEvent& e);
  absl::StatusOr<std::optional<KubePod>> Fetch(const std::string& ns, const std::string& name);
  // Whether a lookup by name for a pod `node`'s daemon forwarded fits the
  // rate: all nodes together, and each node its share.
  bool TakeFetchToken(const std::string& node);
  void SetError(const absl::Status& st);
  // Counts a refusal of Confirm by its class and tags it (TagRefusal).
  absl::Status CountRefusal(absl::Status detail, RemotePodRefusal why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PodDirectoryOptions options_;
  std::unique_ptr<Http> http_;        // list and watch (the directory's thread)
  std::unique_ptr<Http> fetch_http_;  // fetches by name (Confirm's callers)
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  absl::Notification stop_;
  absl::Notification exited_;  // Run returned

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, KubePod> by_uid_ ABSL_GUARDED_BY(mu_);
  std::string resource_version_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time fetch_window_ ABSL_GUARDED_BY(mu_);
  int fetches_in_window_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> node_fetches_in_window_ ABSL_GUARDED_BY(mu_);
  bool complete_ ABSL_GUARDED_BY(mu_) = false;  // the last list kept every pod, and so has the watch since
  absl::Time progress_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // the view last moved on
  // The first failed request since the view last moved on (InfiniteFuture: none).
  absl::Time failing_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool Fresh(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return synced_ && now - progress_ <= options_.stale_after &&
           (failing_since_ == absl::InfiniteFuture() || now - failing_since_ <= options_.failing_grace);
  }
  void MovedOn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    progress_ = absl::Now();
    failing_since_ = absl::InfiniteFuture();
  }
  absl::flat_hash_map<std::string, absl::Time> fetched_ ABSL_GUARDED_BY(mu_);  // confirmed by name: uid -> when
  // UIDs the watch delivered as DELETED (a UID never comes back): gone at
  // once, however they were confirmed, and never confirmed again. Bounded;
  // the oldest go first, past kDeletedKept.
  absl::flat_hash_map<std::string, absl::Time> deleted_ ABSL_GUARDED_BY(mu_);
  absl::Mutex fetch_mu_;  // one fetch at a time on fetch_http_
};

}  // namespace podlink
