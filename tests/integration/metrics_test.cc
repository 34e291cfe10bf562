// The metrics and health endpoints: scraped over HTTP and parsed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <thread>
#include <regex>
#include <sstream>

#include "gtest/gtest.h"
#include "podlink/client.h"
#include "podlink/transfer.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

struct Http {
  int status = 0;
  std::string body;
};

Http Request(int port, const std::string& raw) {
  Http h;
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(s);
    return h;
  }
  (void)!::send(s, raw.data(), raw.size(), MSG_NOSIGNAL);
  std::string resp;
  char buf[4096];
  for (;;) {
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    ssize_t n = ::recv(s, buf, sizeof(buf), 0);
    if (n <= 0) break;
    resp.append(buf, n);
  }
  ::close(s);
  if (resp.rfind("HTTP/1.0 ", 0) == 0) h.status = std::atoi(resp.c_str() + 9);
  size_t b = resp.find("\r\n\r\n");
  if (b != std::string::npos) h.body = resp.substr(b + 4);
  return h;
}

Http Get(int port, const std::string& path) { return Request(port, "GET " + path + " HTTP/1.0\r\n\r\n"); }

// "name{labels} value" -> value; checks that every sample line parses.
std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> m;
  std::istringstream in(text);
  std::string line;
  std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (-?[0-9.eE+-]+|\+Inf|NaN)$)");
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch mt;
    EXPECT_TRUE(std::regex_match(line, mt, sample)) << "not a Prometheus sample: " << line;
    if (!mt.empty()) m[mt[1]] = std::stod(mt[3]);
  }
  return m;
}

TEST(Metrics, ScrapedAndParsed) {
  PodCgroup a(RandomPodUid(), "besteffort"), b(RandomPodUid(), "besteffort");
  Daemon d(R"({"pods": [{"match": {"pod_uid": ")" + a.pod_uid() +
           R"("}, "namespace": "ml", "name": "a", "annotations": {"podlink.io/peer-group": "g"}}]})");
  ASSERT_GT(d.metrics_port(), 0) << d.Log();
  EXPECT_EQ(Get(d.metrics_port(), "/healthz").status, 200);
  Http ready = Get(d.metrics_port(), "/readyz");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body, "ready\n");

  // Activity: two exports, an import, a relay transfer, and a denial from a
  // pod outside the group.
  {
    Pod exporter(d, &a, {"export", "--size", "65536", "--name", "m", "--seed", "1", "--commands"});
    ASSERT_EQ(exporter.Expect("exported")["event"], "exported");
    Pod denied(d, &b, {"import", "--name", "ml/m"});
    // Another namespace: refused as if the export did not exist, counted as a denial.
    EXPECT_EQ(denied.Expect("imported")["code"], "NOT_FOUND");
  }
  auto c = *Client::Connect({.socket_dir = d.dir()});
  TransferEngine::Options o;
  o.force_relay = true;
  o.log_transport = false;
  auto eng = *TransferEngine::Create(*c, o);
  auto x = *c->AllocateHost(1 << 20);
  auto y = *c->AllocateHost(1 << 20);
  LocalRegion lx = *eng->Register(*x);
  LocalRegion ly = *eng->Register(*y);
  RemoteRegion ry = *eng->Open(*eng->Describe(ly));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(eng->Write({&lx, 0, &ry, 0, 1 << 20}).ok());

  // The pods' sessions close as the daemon notices their exit: wait (bounded).
  Http m;
  std::map<std::string, double> v;
  for (int i = 0; i < 500; ++i) {
    m = Get(d.metrics_port(), "/metrics");
    ASSERT_EQ(m.status, 200);
    v = Parse(m.body);
    if (v["podlink_sessions"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(v["podlink_up"], 1);
  EXPECT_EQ(v["podlink_ready"], 1);
  EXPECT_EQ(v["podlink_sessions"], 1);  // the engine's client; the pods have exited
  EXPECT_GE(v["podlink_sessions_total"], 3);
  EXPECT_EQ(v["podlink_exports"], 2);
  EXPECT_EQ(v["podlink_exports_total"], 3);
  EXPECT_EQ(v["podlink_imports_total"], 1);
  EXPECT_EQ(v["podlink_denials_total{reason=\"importer_not_in_group\"}"], 1);
  EXPECT_EQ(v["podlink_relay_rings"], 1);
  EXPECT_EQ(v["podlink_relay_ops_total"], 10);
  EXPECT_EQ(v["podlink_relay_bytes_total"], 10 << 20);
  EXPECT_EQ(v["podlink_relay_op_latency_seconds_count"], 10);
  EXPECT_EQ(v["podlink_relay_op_latency_seconds_bucket{le=\"+Inf\"}"], 10);
  EXPECT_GT(v["podlink_relay_op_latency_seconds_sum"], 0);
  EXPECT_EQ(v["podlink_gpus"], 0);

  // Bad requests get HTTP errors; a silent client does not block scrapes.
  EXPECT_EQ(Get(d.metrics_port(), "/nope").status, 404);
  EXPECT_EQ(Request(d.metrics_port(), "POST /metrics HTTP/1.0\r\n\r\n").status, 405);
  EXPECT_EQ(Request(d.metrics_port(), "garbage\r\n\r\n").status, 400);
  EXPECT_EQ(Request(d.metrics_port(), std::string(20000, 'A')).status, 400);
  int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(d.metrics_port()));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  EXPECT_EQ(Get(d.metrics_port(), "/healthz").status, 200);
  ::close(silent);
}

}  // namespace
}  // namespace podlink::testing
