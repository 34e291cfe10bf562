// A fake Kubernetes API server for podlinkd's pod directory
// (daemon/identity/kube_pods.h): HTTPS with a bearer token, and the REST
// shapes of the core/v1 pods a client of list and watch meets —
//   GET /api/v1/pods?limit=&continue=            PodList pages, metadata.resourceVersion
//   GET /api/v1/pods?watch=true&resourceVersion=&allowWatchBookmarks=&timeoutSeconds=
//                                                newline-separated WatchEvents (ADDED, MODIFIED,
//                                                DELETED, BOOKMARK; ERROR with a 410 Status once the
//                                                version is older than the last compaction)
//   GET /api/v1/namespaces/{ns}/pods/{name}      a Pod, or a 404 Status
// A request without the token is answered 401 with a Status, as the real
// server does. Tests add, change and delete pods, compact history, and read
// which requests came.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace podlink::testing {

struct FakePod {
  std::string uid, namespace_, name, node;
  std::map<std::string, std::string> annotations;
  std::string phase = "Running";
};

class FakeKubeApiServer {
 public:
  using json = nlohmann::json;
  // Serves on `address`:0 with the certificate and key given (PEM files).
  FakeKubeApiServer(const std::string& cert, const std::string& key, const std::string& address,
                    std::string token)
      : server_(cert.c_str(), key.c_str()), token_(std::move(token)) {
    server_.Get("/api/v1/pods", [this](const httplib::Request& req, httplib::Response& res) { Pods(req, res); });
    server_.Get(R"(/api/v1/namespaces/([^/]+)/pods/([^/]+))",
                [this](const httplib::Request& req, httplib::Response& res) { OnePod(req, res); });
    port_ = server_.bind_to_any_port(address);
    if (port_ <= 0) return;  // port() says so; nothing listens
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 5000 && !server_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeKubeApiServer() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }

  // Changes to the cluster, each a new resourceVersion and a watch event.
  void Put(const FakePod& p) {
    std::lock_guard<std::mutex> l(mu_);
    bool exists = pods_.count(p.uid) > 0;
    pods_[p.uid] = p;
    Record(exists ? "MODIFIED" : "ADDED", p);
  }
  void Delete(const std::string& uid) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = pods_.find(uid);
    if (it == pods_.end()) return;
    FakePod p = it->second;
    pods_.erase(it);
    Record("DELETED", p);
  }
  // A pod that exists but whose event watches have not delivered yet (the
  // watch cache lags): only a get by name or a new list sees it.
  void PutQuietly(const FakePod& p) {
    std::lock_guard<std::mutex> l(mu_);
    pods_[p.uid] = p;
    ++rv_;
  }
  // Forgets history: a watch from an older version gets 410 Gone.
  void Compact() {
    std::lock_guard<std::mutex> l(mu_);
    compacted_ = rv_;
    events_.clear();
  }
  // Ends every open watch now (as the server does when it restarts).
  void EndWatches() {
    std::lock_guard<std::mutex> l(mu_);
    ++watch_epoch_;
    cv_.notify_all();
  }
  // Every request answers 500 (an etcd outage) while on.
  void SetFailing(bool on) {
    std::lock_guard<std::mutex> l(mu_);
    failing_ = on;
  }
  void SetToken(std::string t) {
    std::lock_guard<std::mutex> l(mu_);
    token_ = std::move(t);
  }
  void SetPageSize(size_t n) {
    std::lock_guard<std::mutex> l(mu_);
    max_page_ = n;
  }
  void SetBookmarkEvery(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> l(mu_);
    bookmark_every_ = d;
  }
  // "path?query" of every request so far.
  std::vector<std::string> Requests() const {
    std::lock_guard<std::mutex> l(mu_);
    return requests_;
  }
  uint64_t resource_version() const {
    std::lock_guard<std::mutex> l(mu_);
    return rv_;
  }

  static json PodJson(const FakePod& p, uint64_t rv) {
    json ann = json::object();
    for (const auto& [k, v] : p.annotations) ann[k] = v;
    json pod = {{"kind", "Pod"},
                {"apiVersion", "v1"},
                {"metadata",
                 {{"name", p.name},
                  {"namespace", p.namespace_},
                  {"uid", p.uid},
                  {"resourceVersion", std::to_string(rv)},
                  {"creationTimestamp", "2026-11-28T00:00:00Z"},
                  {"labels", {{"app", "test"}}},
                  {"annotations", ann}}},
                {"spec",
                 {{"containers", json::array({{{"name", "main"}, {"image", "busybox"}}})},
                  {"restartPolicy", "Always"}}},
                {"status", {{"phase", p.phase}, {"podIP", "10.244.0.9"}}}};
    if (!p.node.empty()) pod["spec"]["nodeName"] = p.node;
    return pod;
  }

 private:
  static json Status(int code, const std::string& reason, const std::string& message) {
    return {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", json::object()}, {"status", "Failure"},
            {"message", message}, {"reason", reason}, {"code", code}};
  }
  bool Authorized(const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> l(mu_);
    requests_.push_back(req.path + "?" + Query(req));
    if (failing_) {
      res.status = 500;
      res.set_content(Status(500, "InternalError", "etcdserver: request timed out").dump(), "application/json");
      return false;
    }
    if (req.get_header_value("Authorization") == "Bearer " + token_) return true;
    res.status = 401;
    res.set_content(Status(401, "Unauthorized", "Unauthorized").dump(), "application/json");
    return false;
  }
  static std::string Query(const httplib::Request& req) {
    std::string q;
    for (const auto& [k, v] : req.params) q += (q.empty() ? "" : "&") + k + "=" + v;
    return q;
  }
  void Record(const char* type, const FakePod& p) {
    ++rv_;
    events_.push_back({rv_, json{{"type", type}, {"object", PodJson(p, rv_)}}.dump()});
    cv_.notify_all();
  }

  void Pods(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    const std::string watch = req.get_param_value("watch");
    if (watch == "true" || watch == "1") return Watch(req, res);
    std::lock_guard<std::mutex> l(mu_);
    size_t limit = req.has_param("limit") ? std::stoul(req.get_param_value("limit")) : 0;
    if (max_page_ != 0 && (limit == 0 || limit > max_page_)) limit = max_page_;
    size_t start = 0;
    uint64_t list_rv = rv_;
    if (req.has_param("continue")) {
      // "<rv>:<index>": a continue token is only good while history holds its version.
      std::string c = req.get_param_value("continue");
      size_t colon = c.find(':');
      list_rv = std::stoull(c.substr(0, colon));
      start = std::stoul(c.substr(colon + 1));
      if (list_rv < compacted_) {
        res.status = 410;
        res.set_content(Status(410, "Expired", "The provided continue parameter is too old").dump(),
                        "application/json");
        return;
      }
    }
    json items = json::array();
    size_t i = 0;
    for (const auto& [uid, p] : pods_) {
      if (i++ < start) continue;
      if (limit != 0 && items.size() == limit) break;
      items.push_back(PodJson(p, list_rv));
    }
    json meta = {{"resourceVersion", std::to_string(list_rv)}};
    if (limit != 0 && start + items.size() < pods_.size()) {
      meta["continue"] = std::to_string(list_rv) + ":" + std::to_string(start + items.size());
      meta["remainingItemCount"] = pods_.size() - start - items.size();
    }
    res.set_content(json{{"kind", "PodList"}, {"apiVersion", "v1"}, {"metadata", meta}, {"items", items}}.dump(),
                    "application/json");
  }

  void Watch(const httplib::Request& req, httplib::Response& res) {
    uint64_t from = req.has_param("resourceVersion") ? std::stoull(req.get_param_value("resourceVersion")) : 0;
    int seconds = req.has_param("timeoutSeconds") ? std::stoi(req.get_param_value("timeoutSeconds")) : 1800;
    bool bookmarks = req.get_param_value("allowWatchBookmarks") == "true";
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    uint64_t epoch;
    {
      std::lock_guard<std::mutex> l(mu_);
      epoch = watch_epoch_;
      if (from < compacted_) {
        // As the real server answers a watch from a compacted version: 200,
        // then one ERROR event carrying a 410 Status.
        res.set_content(json{{"type", "ERROR"},
                             {"object", Status(410, "Expired",
                                               "too old resource version: " + std::to_string(from) + " (" +
                                                   std::to_string(compacted_) + ")")}}
                                .dump() +
                            "\n",
                        "application/json");
        return;
      }
    }
    auto cursor = std::make_shared<uint64_t>(from);
    auto last_bookmark = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
    res.set_chunked_content_provider(
        "application/json", [this, cursor, deadline, bookmarks, epoch, last_bookmark](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> l(mu_);
          std::string out;
          for (const auto& [rv, line] : events_) {
            if (rv > *cursor) {
              out += line + "\n";
              *cursor = rv;
            }
          }
          auto now = std::chrono::steady_clock::now();
          if (out.empty() && bookmarks && bookmark_every_.count() > 0 && now - *last_bookmark >= bookmark_every_) {
            *last_bookmark = now;
            *cursor = std::max(*cursor, rv_);
            out = json{{"type", "BOOKMARK"},
                       {"object",
                        {{"kind", "Pod"},
                         {"apiVersion", "v1"},
                         {"metadata", {{"resourceVersion", std::to_string(*cursor)}}}}}}
                      .dump() +
                  "\n";
          }
          if (!out.empty()) {
            l.unlock();
            return sink.write(out.data(), out.size());
          }
          if (stopping_ || watch_epoch_ != epoch || now >= deadline) {
            sink.done();
            return true;
          }
          cv_.wait_for(l, std::chrono::milliseconds(50));
          return true;
        });
  }

  void OnePod(const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [uid, p] : pods_) {
      if (p.namespace_ == req.matches[1] && p.name == req.matches[2]) {
        res.set_content(PodJson(p, rv_).dump(), "application/json");
        return;
      }
    }
    res.status = 404;
    res.set_content(Status(404, "NotFound", "pods \"" + std::string(req.matches[2]) + "\" not found").dump(),
                    "application/json");
  }

  httplib::SSLServer server_;
  std::thread thread_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string token_;
  bool failing_ = false;
  std::map<std::string, FakePod> pods_;  // by UID
  std::deque<std::pair<uint64_t, std::string>> events_;
  uint64_t rv_ = 100, compacted_ = 0, watch_epoch_ = 0;
  size_t max_page_ = 0;
  std::chrono::milliseconds bookmark_every_{0};
  std::vector<std::string> requests_;
  bool stopping_ = false;
};

}  // namespace podlink::testing
