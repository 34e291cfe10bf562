#include "daemon/identity/kube_pods.h"

#include <optional>

#include "absl/strings/cord.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include <httplib.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/metrics/metrics.h"
#include "nlohmann/json.hpp"

namespace podlink {

namespace {
// Deleted UIDs remembered (kube_pods.h, PodDirectory::deleted_).
constexpr size_t kDeletedKept = 65536;
}  // namespace
namespace {

const ComponentLog KubeLog("identity");

using json = nlohmann::json;

constexpr size_t kMaxTokenBytes = 64 << 10;
constexpr size_t kMaxPageBytes = size_t{256} << 20;  // one page of a list
constexpr size_t kMaxEventBytes = size_t{16} << 20;  // one watch event (a pod is at most ~1.5 MiB in etcd)
constexpr size_t kMaxPodBytes = size_t{16} << 20;    // one fetched pod
constexpr size_t kMaxAnnotations = 256;              // podlink.io/ ones kept per pod
constexpr size_t kMaxAnnotationBytes = 4096;         // key or value

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("API server: ", what)); }

const json* Field(const json& o, const char* name) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(name);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string StringField(const json& o, const char* name) {
  const json* f = Field(o, name);
  return f != nullptr && f->is_string() ? f->get<std::string>() : std::string();
}

absl::StatusOr<KubePod> PodFromJson(const json& o) {
  if (!o.is_object()) return Bad("a pod is not an object");
  const json* meta = Field(o, "metadata");
  if (meta == nullptr || !meta->is_object()) return Bad("a pod without metadata");
  KubePod p;
  p.uid = StringField(*meta, "uid");
  p.namespace_ = StringField(*meta, "namespace");
  p.name = StringField(*meta, "name");
  if (p.uid.empty() || p.namespace_.empty() || p.name.empty()) return Bad("a pod without uid, namespace or name");
  if (const json* ann = Field(*meta, "annotations")) {
    if (!ann->is_object()) return Bad("annotations are not an object");
    for (auto it = ann->begin(); it != ann->end(); ++it) {
      if (!absl::StartsWith(it.key(), kPodlinkAnnotationPrefix)) continue;
      if (!it->is_string()) return Bad("an annotation value is not a string");
      // Any user who can create a pod chooses its annotations: too many or too
      // large ones make this pod unusable, never the list or the watch.
      if (p.annotations.size() >= kMaxAnnotations || it.key().size() > kMaxAnnotationBytes ||
          it->get_ref<const std::string&>().size() > kMaxAnnotationBytes) {
        p.oversized = true;
        p.annotations.clear();
        break;
      }
      p.annotations[it.key()] = it->get<std::string>();
    }
  }
  if (const json* spec = Field(o, "spec")) p.node = StringField(*spec, "nodeName");
  if (const json* status = Field(o, "status")) {
    const std::string phase = StringField(*status, "phase");
    p.finished = phase == "Succeeded" || phase == "Failed";
  }
  return p;
}

absl::StatusOr<json> ParseJson(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("malformed JSON");
  return j;
}

std::string ReadSmallFile(const std::string& path, std::string* error) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *error = absl::StrCat("cannot read ", path);
    return {};
  }
  std::string s(kMaxTokenBytes + 1, '\0');
  f.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(f.gcount()));
  if (s.size() > kMaxTokenBytes) {
    *error = absl::StrCat(path, " is larger than ", kMaxTokenBytes, " bytes");
    return {};
  }
  return std::string(absl::StripAsciiWhitespace(s));
}

// Percent-encodes a query parameter's value (RFC 3986 unreserved kept).
std::string QueryEscape(absl::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

// The message of an API server Status body, if it is one (bounded for logs).
std::string StatusMessage(absl::string_view body) {
  absl::StatusOr<json> j = ParseJson(body.substr(0, 64 << 10));
  std::string m = j.ok() ? StringField(*j, "message") : std::string();
  if (m.empty()) m = std::string(body.substr(0, 200));
  return m.substr(0, 300);
}

}  // namespace

absl::StatusOr<KubeApiConfig> InClusterConfig() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    return absl::FailedPreconditionError(
        "not in a Kubernetes pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set");
  }
  KubeApiConfig c;
  c.host = host;
  if (!absl::SimpleAtoi(port, &c.port) || c.port < 1 || c.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("KUBERNETES_SERVICE_PORT is not a port: '", port, "'"));
  }
  return c;
}

absl::StatusOr<KubeApiConfig> ParseApiServerUrl(absl::string_view url) {
  if (!absl::ConsumePrefix(&url, "https://")) {
    return absl::InvalidArgumentError("the API server's URL must start with https://");
  }
  while (absl::ConsumeSuffix(&url, "/")) {
  }
  KubeApiConfig c;
  absl::string_view port;
  if (absl::StartsWith(url, "[")) {
    size_t close = url.find(']');
    if (close == absl::string_view::npos) return absl::InvalidArgumentError("an IPv6 host needs its closing ']'");
    c.host = std::string(url.substr(1, close - 1));
    url.remove_prefix(close + 1);
    if (absl::ConsumePrefix(&url, ":")) port = url;
    else if (!url.empty()) return absl::InvalidArgumentError("unexpected text after the host");
  } else {
    size_t colon = url.find(':');
    c.host = std::string(url.substr(0, colon));
    if (colon != absl::string_view::npos) port = url.substr(colon + 1);
  }
  if (c.host.empty() || c.host.find('/') != std::string::npos) {
    return absl::InvalidArgumentError("the API server's URL is https://host[:port], without a path");
  }
  if (!port.empty() && (!absl::SimpleAtoi(port, &c.port) || c.port < 1 || c.port > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("not a port: '", port, "'"));
  }
  return c;
}

absl::StatusOr<KubePod> ParsePod(absl::string_view text) {
  PODLINK_ASSIGN_OR_RETURN(json j, ParseJson(text));
  return PodFromJson(j);
}

absl::StatusOr<PodListPage> ParsePodList(absl::string_view text) {
  PODLINK_ASSIGN_OR_RETURN(json j, ParseJson(text));
  if (StringField(j, "kind") != "PodList") return Bad("the list is not a PodList");
  const json* meta = Field(j, "metadata");
  PodListPage page;
  if (meta != nullptr) {
    page.resource_version = StringField(*meta, "resourceVersion");
    page.continue_token = StringField(*meta, "continue");
  }
  if (page.resource_version.empty()) return Bad("a PodList without resourceVersion");
  if (const json* items = Field(j, "items")) {
    if (!items->is_array()) return Bad("items is not an array");
    page.pods.reserve(items->size());
    for (const json& item : *items) {
      PODLINK_ASSIGN_OR_RETURN(KubePod p, PodFromJson(item));
      page.pods.push_back(std::move(p));
    }
  }
  return page;
}

absl::StatusOr<PodWatchEvent> ParseWatchEvent(absl::string_view line) {
  PODLINK_ASSIGN_OR_RETURN(json j, ParseJson(line));
  const std::string type = StringField(j, "type");
  const json* obj = Field(j, "object");
  if (obj == nullptr || !obj->is_object()) return Bad("a watch event without an object");
  PodWatchEvent e;
  if (type == "ERROR") {
    e.type = PodWatchEvent::Type::kError;
    const json* code = Field(*obj, "code");
    e.code = code != nullptr && code->is_number_integer() ? code->get<int>() : 0;
    e.message = StringField(*obj, "message").substr(0, 300);
    return e;
  }
  const json* meta = Field(*obj, "metadata");
  if (meta != nullptr) e.resource_version = StringField(*meta, "resourceVersion");
  if (e.resource_version.empty()) return Bad("a watch event without resourceVersion");
  if (type == "BOOKMARK") {
    e.type = PodWatchEvent::Type::kBookmark;
    return e;
  }
  if (type == "ADDED") e.type = PodWatchEvent::Type::kAdded;
  else if (type == "MODIFIED") e.type = PodWatchEvent::Type::kModified;
  else if (type == "DELETED") e.type = PodWatchEvent::Type::kDeleted;
  else return Bad("unknown watch event type");
  PODLINK_ASSIGN_OR_RETURN(e.pod, PodFromJson(*obj));
  return e;
}

bool ValidKubeName(absl::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  // Dot-separated labels of 1 to 63 of a-z, 0-9 and '-', each starting and
  // ending with a letter or digit.
  size_t label = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      if (label == 0 || label > 63 || s[i - 1] == '-') return false;
      label = 0;
      continue;
    }
    char c = s[i];
    bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && (c != '-' || label == 0)) return false;
    ++label;
  }
  return true;
}

// One HTTPS connection to the API server, authenticated by the service
// account's token (read again for every request: kubelet rotates it).
class PodDirectory::Http {
 public:
  Http(const KubeApiConfig& api, absl::Duration connect_timeout) : api_(api), client_(api.host, api.port) {
    client_.set_ca_cert_path(api.ca_file.c_str());
    client_.enable_server_certificate_verification(true);
    const auto ms = absl::ToInt64Milliseconds(connect_timeout);
    client_.set_connection_timeout(ms / 1000, (ms % 1000) * 1000);
    client_.set_keep_alive(true);
  }
  // GETs `path`, passing the body of a 200 answer to `sink` (false: stop
  // reading) and any other answer's (its first 64 KiB, an API Status) to
  // `error_body`, and returns the HTTP status. A request cut short by Stop is
  // CANCELLED.
  absl::StatusOr<int> Get(const std::string& path, absl::Duration read_timeout,
                          const std::function<bool(const char*, size_t)>& sink, std::string* error_body) {
    if (stopped_.load()) return absl::CancelledError("stopping");
    std::string error;
    std::string token = ReadSmallFile(api_.token_file, &error);
    if (!error.empty()) return absl::UnavailableError(absl::StrCat("service account token: ", error));
    const auto ms = absl::ToInt64Milliseconds(read_timeout);
    client_.set_read_timeout(ms / 1000, (ms % 1000) * 1000);
    httplib::Headers headers = {{"Authorization", "Bearer " + token}, {"Accept", "application/json"}};
    int status = 0;
    httplib::Result r = client_.Get(
        path, headers,
        [&](const httplib::Response& res) {
          status = res.status;
          return true;
        },
        [&](const char* data, size_t n) {
          if (status == 200) return sink(data, n);
          if (error_body != nullptr && error_body->size() < (64 << 10)) error_body->append(data, n);
          return error_body != nullptr && error_body->size() < (64 << 10);
        });
    if (stopped_.load()) return absl::CancelledError("stopping");
    if (status != 0) return status;  // a sink that stopped early still has its status
    return absl::UnavailableError(absl::StrCat("https://", api_.host, ":", api_.port, path.substr(0, path.find('?')),
                                               ": ", httplib::to_string(r.error())));
  }
  // Get with a 200 body kept whole in `body`, up to `limit` bytes
  // (RESOURCE_EXHAUSTED beyond).
  absl::StatusOr<int> GetBody(const std::string& path, absl::Duration read_timeout, size_t limit, std::string* body,
                              std::string* error_body) {
    bool too_big = false;
    auto keep = [&](const char* d, size_t n) {
      too_big = too_big || body->size() + n > limit;
      if (!too_big) body->append(d, n);
      return !too_big;
    };
    absl::StatusOr<int> code = Get(path, read_timeout, keep, error_body);
    if (too_big) return absl::ResourceExhaustedError(absl::StrCat(path.substr(0, path.find('?')), ": over ", limit, " bytes"));
    return code;
  }
  void Stop() {
    stopped_.store(true);
    client_.stop();
  }

 private:
  KubeApiConfig api_;
  httplib::SSLClient client_;
  std::atomic<bool> stopped_{false};
};

PodDirectory::PodDirectory(PodDirectoryOptions options)
    : options_(std::move(options)),
      http_(std::make_unique<Http>(options_.api, options_.request_timeout)),
      fetch_http_(std::make_unique<Http>(options_.api, options_.request_timeout)) {}

PodDirectory::~PodDirectory() { Stop(); }

void PodDirectory::Start() {
  KubeLog()->info("event=kube_pods_start api=https://{}:{} msg=\"pods of other nodes are confirmed with the API "
                  "server\"",
                  options_.api.host, options_.api.port);
  thread_ = std::thread([this] { Run(); });
}

void PodDirectory::Stop() {
  if (stopping_.exchange(true)) return;
  stop_.Notify();
  // httplib's stop() shuts down only a request in flight: one the thread
  // starts just after it would run to its timeout. So again until it returns.
  do {
    http_->Stop();
    fetch_http_->Stop();
  } while (thread_.joinable() && !exited_.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  if (thread_.joinable()) thread_.join();
}

void PodDirectory::SetError(const absl::Status& st) {
  absl::MutexLock l(&mu_);
  last_error_ = std::string(st.message());
  ++stats_.errors;
  if (failing_since_ == absl::InfiniteFuture()) failing_since_ = absl::Now();
}

void PodDirectory::Run() {
  absl::Cleanup exited = [this] { exited_.Notify(); };
  absl::Duration backoff = options_.retry_min;
  while (!stopping_.load()) {
    bool list;
    {
      absl::MutexLock l(&mu_);
      list = resource_version_.empty();
    }
    absl::Status st = list ? List() : Watch();
    if (stopping_.load()) break;
    if (st.ok()) {
      backoff = options_.retry_min;
      continue;
    }
    SetError(st);
    KubeLog()->warn("event=kube_pods_error during={} error={} retry_in_ms={}", list ? "list" : "watch",
                    LogQuoted(st.message()), absl::ToInt64Milliseconds(backoff));
    if (stop_.WaitForNotificationWithTimeout(backoff)) break;
    backoff = std::min(backoff * 2, options_.retry_max);
  }
}

absl::Status PodDirectory::List() {
  absl::flat_hash_map<std::string, KubePod> fresh;
  std::string cont, rv;
  size_t dropped = 0;
  do {
    std::string path = absl::StrCat("/api/v1/pods?limit=", options_.page_size);
    if (!cont.empty()) absl::StrAppend(&path, "&continue=", QueryEscape(cont));
    std::string body, error_body;
    PODLINK_ASSIGN_OR_RETURN(int code,
                             http_->GetBody(path, options_.request_timeout, kMaxPageBytes, &body, &error_body));
    if (code == 410) return absl::UnavailableError("the list's continue token expired (410 Gone); listing again");
    if (code != 200) {
      return absl::UnavailableError(absl::StrCat("list pods: HTTP ", code, ": ", StatusMessage(error_body)));
    }
    PODLINK_ASSIGN_OR_RETURN(PodListPage page, ParsePodList(body));
    for (KubePod& p : page.pods) {
      if (fresh.size() >= options_.max_pods && !fresh.contains(p.uid)) {
        ++dropped;
        continue;
      }
      std::string uid = p.uid;
      fresh[uid] = std::move(p);
    }
    rv = page.resource_version;
    cont = page.continue_token;
  } while (!cont.empty() && !stopping_.load());
  if (stopping_.load()) return absl::CancelledError("stopping");
  size_t n = fresh.size();
  {
    absl::MutexLock l(&mu_);
    by_uid_.swap(fresh);
    resource_version_ = rv;
    synced_ = true;
    complete_ = dropped == 0;
    MovedOn();
    last_error_.clear();
    ++stats_.lists;
  }
  KubeLog()->info("event=kube_pods_listed pods={} resource_version={} not_kept={}", n, LogQuoted(rv), dropped);
  return absl::OkStatus();
}

absl::Status PodDirectory::Watch() {
  std::string rv;
  {
    absl::MutexLock l(&mu_);
    rv = resource_version_;
    ++stats_.watches;
  }
  std::string path = absl::StrCat("/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion=", QueryEscape(rv),
                                  "&timeoutSeconds=", options_.watch_seconds);
  std::string line;
  absl::Status failure;
  bool gone = false;
  auto sink = [&](const char* d, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (d[i] != '\n') {
        if (line.size() >= kMaxEventBytes) {
          failure = absl::ResourceExhaustedError(absl::StrCat("a watch event exceeds ", kMaxEventBytes, " bytes"));
          return false;
        }
        line.push_back(d[i]);
        continue;
      }
      absl::StatusOr<PodWatchEvent> e = ParseWatchEvent(line);
      line.clear();
      if (!e.ok()) {
        failure = e.status();
        return false;
      }
      if (e->type == PodWatchEvent::Type::kError) {
        gone = e->code == 410;
        failure = absl::UnavailableError(absl::StrCat("watch error ", e->code, ": ", e->message));
        return false;
      }
      Apply(*e);
    }
    return true;
  };
  // The server ends the watch after timeoutSeconds; a silent connection is
  // given a minute more before it counts as lost.
  std::string error_body;
  absl::StatusOr<int> code = http_->Get(path, absl::Seconds(options_.watch_seconds + 60), sink, &error_body);
  if (gone || (code.ok() && *code == 410)) {
    absl::MutexLock l(&mu_);
    resource_version_.clear();  // too old: list again
    KubeLog()->info("event=kube_pods_expired resource_version={} msg=\"410 Gone; listing again\"", LogQuoted(rv));
    return absl::OkStatus();
  }
  if (!failure.ok()) return failure;
  if (!code.ok()) return code.status();
  if (*code != 200) {
    return absl::UnavailableError(absl::StrCat("watch pods: HTTP ", *code, ": ", StatusMessage(error_body)));
  }
  absl::MutexLock l(&mu_);
  MovedOn();  // the server ended the watch after timeoutSeconds: nothing happened meanwhile
  return absl::OkStatus();
}

void PodDirectory::Apply(const PodWatchEvent& e) {
  absl::MutexLock l(&mu_);
  resource_version_ = e.resource_version;
  MovedOn();
  ++stats_.events;
  switch (e.type) {
    case PodWatchEvent::Type::kAdded:
    case PodWatchEvent::Type::kModified:
      if (by_uid_.size() < options_.max_pods || by_uid_.contains(e.pod.uid)) {
        by_uid_[e.pod.uid] = e.pod;
      } else {
        complete_ = false;  // until the next list
      }
      break;
    case PodWatchEvent::Type::kDeleted: {
      by_uid_.erase(e.pod.uid);
      fetched_.erase(e.pod.uid);
      const absl::Time now = absl::Now();
      if (deleted_.size() >= kDeletedKept) {
        // Tombstones only matter until the owners' sweeps saw them (every
        // 200 ms) and the confirmations that named the pod ran out.
        for (auto it = deleted_.begin(); it != deleted_.end();) {
          if (now - it->second > absl::Minutes(10)) {
            deleted_.erase(it++);
          } else {
            ++it;
          }
        }
      }
      if (deleted_.size() < kDeletedKept) deleted_[e.pod.uid] = now;
      break;
    }
    default:
      break;
  }
}

bool PodDirectory::TakeFetchToken(const std::string& node) {
  absl::MutexLock l(&mu_);
  absl::Time now = absl::Now();
  if (now - fetch_window_ >= absl::Seconds(1)) {
    fetch_window_ = now;
    fetches_in_window_ = 0;
    node_fetches_in_window_.clear();
  }
  const int node_share = std::max(1, options_.max_fetches_per_second / 4);
  if (fetches_in_window_ >= options_.max_fetches_per_second) return false;
  int& mine = node_fetches_in_window_[node];  // at most max_fetches_per_second nodes a window
  if (mine >= node_share) return false;
  ++mine;
  ++fetches_in_window_;
  ++stats_.fetches;
  return true;
}

absl::StatusOr<std::optional<KubePod>> PodDirectory::Fetch(const std::string& ns, const std::string& name) {
  // One lookup at a time, and a caller (a gRPC thread of the mesh) never
  // queues behind another's: it is told to retry instead.
  if (!fetch_mu_.TryLock()) return absl::UnavailableError("another pod is being looked up; retry");
  absl::Cleanup unlock = [this] { fetch_mu_.Unlock(); };
  const std::string path = absl::StrCat("/api/v1/namespaces/", ns, "/pods/", name);
  std::string body, error_body;
  PODLINK_ASSIGN_OR_RETURN(int code,
                           fetch_http_->GetBody(path, options_.request_timeout, kMaxPodBytes, &body, &error_body));
  if (code == 404) return std::optional<KubePod>();
  if (code != 200) return absl::UnavailableError(absl::StrCat("get pod: HTTP ", code, ": ", StatusMessage(error_body)));
  PODLINK_ASSIGN_OR_RETURN(KubePod p, ParsePod(body));
  return std::optional<KubePod>(std::move(p));
}

namespace {
constexpr absl::string_view kRefusalPayload = "podlink.io/remote-pod-refusal";
}  // namespace

const char* RemotePodRefusalText(RemotePodRefusal r) {
  switch (r) {
    case RemotePodRefusal::kNotFound:
      return "pod not found";
    case RemotePodRefusal::kOtherNode:
      return "pod on another node";
    case RemotePodRefusal::kAnnotationsDiffer:
      return "annotations differ";
    case RemotePodRefusal::kFinished:
      return "pod finished";
    case RemotePodRefusal::kCannotConfirmNow:
      return "cannot confirm now";
  }
  return "refused";
}

absl::Status TagRefusal(absl::Status detail, RemotePodRefusal why) {
  detail.SetPayload(kRefusalPayload, absl::Cord(std::to_string(static_cast<int>(why))));
  return detail;
}

absl::Status ForPeerNode(const absl::Status& refusal) {
  auto p = refusal.GetPayload(kRefusalPayload);
  int why = -1;
  if (!p.has_value() || !absl::SimpleAtoi(std::string(*p), &why) || why < 0 ||
      why > static_cast<int>(RemotePodRefusal::kCannotConfirmNow)) {
    return absl::Status(refusal.code(), "the owner's node refused the importing pod");
  }
  auto r = static_cast<RemotePodRefusal>(why);
  return absl::Status(r == RemotePodRefusal::kCannotConfirmNow ? absl::StatusCode::kUnavailable
                                                                : absl::StatusCode::kPermissionDenied,
                      absl::StrCat("the owner's node refused the importing pod: ", RemotePodRefusalText(r),
                                   r == RemotePodRefusal::kCannotConfirmNow ? " (retry)" : ""));
}

absl::StatusOr<KubePod> PodDirectory::Confirm(const std::string& uid, const std::string& ns, const std::string& name,
                                              const std::string& node, const std::map<std::string, std::string>& claimed) {
  auto refuse = [&](absl::Status st, RemotePodRefusal why) {
    absl::MutexLock l(&mu_);
    return CountRefusal(std::move(st), why);
  };
  if (!ValidKubeName(ns) || !ValidKubeName(name)) {
    return refuse(absl::PermissionDeniedError("the forwarded pod's namespace or name is not a Kubernetes name"),
                  RemotePodRefusal::kNotFound);
  }
  if (uid.empty()) {
    return refuse(absl::PermissionDeniedError("the forwarded pod has no UID to confirm"), RemotePodRefusal::kNotFound);
  }
  std::optional<KubePod> pod;
  bool synced;
  std::string last_error;
  {
    absl::MutexLock l(&mu_);
    if (deleted_.contains(uid)) {
      return CountRefusal(absl::PermissionDeniedError(absl::StrCat("pod ", ns, "/", name, " was deleted")),
                          RemotePodRefusal::kNotFound);
    }
    auto it = by_uid_.find(uid);
    // A stale view's pods are looked up again: it may hold deleted ones.
    if (it != by_uid_.end() && Fresh(absl::Now())) pod = it->second;
    synced = synced_;
    last_error = last_error_;
  }
  const std::string ref = ns + "/" + name;
  if (!pod.has_value()) {
    // Not (yet) seen by the watch: ask for it by name, within the rate.
    if (!TakeFetchToken(node)) {
      return refuse(absl::UnavailableError(absl::StrCat(
          "pod ", ref, " is not known yet and the API server is asked for at most ", options_.max_fetches_per_second,
          " pods a second (", std::max(1, options_.max_fetches_per_second / 4), " for one node's daemon); retry")),
          RemotePodRefusal::kCannotConfirmNow);
    }
    absl::StatusOr<std::optional<KubePod>> got = Fetch(ns, name);
    if (!got.ok()) {
      return refuse(absl::UnavailableError(
          absl::StrCat("cannot confirm pod ", ref, " with the API server", synced ? "" : " (its pods are not loaded yet)",
                       ": ", got.status().message(), last_error.empty() ? "" : "; last error: " + last_error)),
          RemotePodRefusal::kCannotConfirmNow);
    }
    if (!got->has_value()) {
      return refuse(absl::PermissionDeniedError(absl::StrCat("the API server has no pod ", ref)),
                    RemotePodRefusal::kNotFound);
    }
    pod = std::move(**got);
    absl::MutexLock l(&mu_);
    if (deleted_.contains(pod->uid)) {  // the watch delivered its deletion while we asked
      return CountRefusal(absl::PermissionDeniedError(absl::StrCat("pod ", ref, " was deleted")),
                          RemotePodRefusal::kNotFound);
    }
    const absl::Time now = absl::Now();
    if (fetched_.size() >= 4096) {
      for (auto it = fetched_.begin(); it != fetched_.end();) {
        if (now - it->second > absl::Minutes(1)) {
          fetched_.erase(it++);
        } else {
          ++it;
        }
      }
    }
    if (fetched_.size() < 4096) fetched_[pod->uid] = now;
  }
  if (pod->uid != uid) {
    return refuse(absl::PermissionDeniedError(absl::StrCat("the API server's pod ", ref, " has another UID")),
                  RemotePodRefusal::kNotFound);
  }
  if (pod->namespace_ != ns || pod->name != name) {
    return refuse(absl::PermissionDeniedError(
        absl::StrCat("the forwarded UID is pod ", pod->namespace_, "/", pod->name, ", not ", ref)),
                  RemotePodRefusal::kNotFound);
  }
  if (pod->node != node) {
    return refuse(absl::PermissionDeniedError(absl::StrCat("the API server places pod ", ref, " on node '", pod->node,
                                                           "', not on node ", node, " that speaks for it")),
                  RemotePodRefusal::kOtherNode);
  }
  if (pod->finished) {
    return refuse(absl::PermissionDeniedError(absl::StrCat("pod ", ref, " has finished")), RemotePodRefusal::kFinished);
  }
  if (pod->oversized) {
    return refuse(absl::PermissionDeniedError(absl::StrCat("pod ", ref, " has more or larger podlink.io/ annotations than ",
                                                           kMaxAnnotations, " of ", kMaxAnnotationBytes, " bytes")),
                  RemotePodRefusal::kAnnotationsDiffer);
  }
  std::map<std::string, std::string> ours;
  for (const auto& [k, v] : claimed) {
    if (absl::StartsWith(k, kPodlinkAnnotationPrefix)) ours.emplace(k, v);
  }
  if (ours != pod->annotations) {
    std::string key;
    for (const auto& [k, v] : ours) {
      auto it = pod->annotations.find(k);
      if (it == pod->annotations.end() || it->second != v) key = k;
      if (!key.empty()) break;
    }
    for (const auto& [k, v] : pod->annotations) {
      if (key.empty() && !ours.contains(k)) key = k;
    }
    return refuse(absl::PermissionDeniedError(
        absl::StrCat("pod ", ref, "'s annotation ", key, " differs from the API server's")),
                  RemotePodRefusal::kAnnotationsDiffer);
  }
  absl::MutexLock l(&mu_);
  ++stats_.confirmed;
  return *pod;
}

absl::Status PodDirectory::CountRefusal(absl::Status detail, RemotePodRefusal why) {
  ++stats_.refused;
  ++stats_.refused_by[static_cast<size_t>(why)];
  return TagRefusal(std::move(detail), why);
}

bool PodDirectory::Gone(const std::string& uid) const {
  absl::MutexLock l(&mu_);
  if (deleted_.contains(uid)) return true;
  const absl::Time now = absl::Now();
  if (!Fresh(now)) return false;
  if (auto it = by_uid_.find(uid); it != by_uid_.end()) return it->second.finished;
  if (!complete_) return false;
  auto f = fetched_.find(uid);
  return f == fetched_.end() || progress_ - f->second > options_.fetched_grace;
}

absl::Status PodDirectory::Ready() const {
  absl::MutexLock l(&mu_);
  if (synced_ && !Fresh(absl::Now())) {
    const absl::Time now = absl::Now();
    if (failing_since_ != absl::InfiniteFuture()) {
      return absl::UnavailableError(absl::StrCat("the API server has failed for ",
                                                 absl::FormatDuration(absl::Trunc(now - failing_since_,
                                                                                  absl::Milliseconds(100))),
                                                 ": ", last_error_));
    }
    return absl::UnavailableError(absl::StrCat("the pods from the API server have not moved on for ",
                                               absl::FormatDuration(now - progress_),
                                               last_error_.empty() ? "" : ": " + last_error_));
  }
  if (synced_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("pods not loaded from the API server yet",
                                             last_error_.empty() ? "" : ": " + last_error_));
}

PodDirectory::Stats PodDirectory::GetStats() const {
  absl::MutexLock l(&mu_);
  Stats s = stats_;
  s.pods = by_uid_.size();
  s.synced = synced_;
  s.resource_version = resource_version_;
  return s;
}

std::string PodDirectory::RenderMetrics() const {
  Stats s = GetStats();
  std::string out;
  RenderFamily(&out, "podlink_kube_pods", "gauge", "pods held from the API server (--remote-pods apiserver)",
               {{"", static_cast<double>(s.pods)}});
  RenderFamily(&out, "podlink_kube_synced", "gauge", "1 once the pods have been listed from the API server",
               {{"", s.synced ? 1.0 : 0.0}});
  RenderFamily(&out, "podlink_kube_requests_total", "counter", "requests to the API server, by kind",
               {{"list", static_cast<double>(s.lists)},
                {"watch", static_cast<double>(s.watches)},
                {"get", static_cast<double>(s.fetches)}},
               "kind");
  RenderFamily(&out, "podlink_kube_request_errors_total", "counter", "failed requests to the API server",
               {{"", static_cast<double>(s.errors)}});
  RenderFamily(&out, "podlink_kube_watch_events_total", "counter", "pod watch events applied",
               {{"", static_cast<double>(s.events)}});
  RenderFamily(&out, "podlink_remote_pod_checks_total", "counter",
               "identities forwarded by other nodes' daemons, checked with the API server, by result",
               {{"confirmed", static_cast<double>(s.confirmed)}, {"refused", static_cast<double>(s.refused)}},
               "result");
  std::map<std::string, double> by_reason;
  for (size_t i = 0; i < s.refused_by.size(); ++i) {
    by_reason[RemotePodRefusalText(static_cast<RemotePodRefusal>(i))] = static_cast<double>(s.refused_by[i]);
  }
  RenderFamily(&out, "podlink_remote_pod_refusals_total", "counter",
               "identities of other nodes' pods refused, by the reason class the other node is told", by_reason,
               "reason");
  return out;
}

}  // namespace podlink
