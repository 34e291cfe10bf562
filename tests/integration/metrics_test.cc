// The metrics and health endpoints: scraped over HTTP and parsed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "podlink/client.h"
#include "podlink/transfer.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

TEST(Metrics, ScrapedAndParsed) {
  PodCgroup a(RandomPodUid(), "besteffort"), b(RandomPodUid(), "besteffort");
  Daemon d(R"({"pods": [{"match": {"pod_uid": ")" + a.pod_uid() +
           R"("}, "namespace": "ml", "name": "a", "annotations": {"podlink.io/peer-group": "g"}}]})");
  ASSERT_GT(d.metrics_port(), 0) << d.Log();
  EXPECT_EQ(HttpGet(d.metrics_port(), "/healthz").status, 200);
  Http ready = HttpGet(d.metrics_port(), "/readyz");
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
    m = HttpGet(d.metrics_port(), "/metrics");
    ASSERT_EQ(m.status, 200);
    v = ParseMetrics(m.body);
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
  // Every denial reason has its series from the start (rate() needs them before the first denial).
  for (const char* r : {"namespace_mismatch", "exporter_not_in_group", "group_mismatch"}) {
    EXPECT_EQ(v.count(std::string("podlink_denials_total{reason=\"") + r + "\"}"), 1u) << r;
  }
  EXPECT_EQ(v.count("podlink_build_info{version=\"" PODLINK_VERSION "\"}"), 1u) << m.body;
  EXPECT_GT(v["process_resident_memory_bytes"], 1 << 20);
  EXPECT_GT(v["process_open_fds"], 3);
  EXPECT_GE(v["process_max_fds"], v["process_open_fds"]);
  EXPECT_GT(v["process_start_time_seconds"], 1.7e9);
  EXPECT_EQ(v.count("process_cpu_seconds_total"), 1u);
  EXPECT_EQ(v["podlink_relay_rings"], 1);
  EXPECT_EQ(v["podlink_relay_ops_total"], 10);
  EXPECT_EQ(v["podlink_relay_bytes_total"], 10 << 20);
  EXPECT_EQ(v["podlink_relay_op_latency_seconds_count"], 10);
  EXPECT_EQ(v["podlink_relay_op_latency_seconds_bucket{le=\"+Inf\"}"], 10);
  EXPECT_GT(v["podlink_relay_op_latency_seconds_sum"], 0);
  EXPECT_EQ(v["podlink_gpus"], 0);

  // Bad requests get HTTP errors; a silent client does not block scrapes.
  EXPECT_EQ(HttpGet(d.metrics_port(), "/nope").status, 404);
  EXPECT_EQ(HttpRequest(d.metrics_port(), "POST /metrics HTTP/1.0\r\n\r\n").status, 405);
  EXPECT_EQ(HttpRequest(d.metrics_port(), "garbage\r\n\r\n").status, 400);
  EXPECT_EQ(HttpRequest(d.metrics_port(), std::string(20000, 'A')).status, 400);
  int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(d.metrics_port()));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  EXPECT_EQ(HttpGet(d.metrics_port(), "/healthz").status, 200);
  ::close(silent);
}

}  // namespace
}  // namespace podlink::testing
