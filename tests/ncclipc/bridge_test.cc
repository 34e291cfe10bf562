// The NCCL IPC bridge between network namespaces, with stand-in NCCL peers
// (nccl_ipc_peer) in namespaces of their own. Needs root (unshare, setns).
#include "daemon/ncclipc/bridge.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/ncclipc/shm_mount.h"
#include "daemon/ncclipc/unix_names.h"
#include "gtest/gtest.h"

namespace podlink::ncclipc {
namespace {

// A stand-in peer: its stdin and stdout, line by line.
class Peer {
 public:
  // nccl_ipc_peer ARGS, or (program given) the command ARGS as is.
  explicit Peer(std::vector<std::string> args, bool program = false) {
    int in[2], out[2];
    EXPECT_EQ(::pipe2(in, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    std::vector<std::string> full;
    if (!program) full.push_back(PEER_PATH);
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
    std::string r = Line();
    EXPECT_EQ(r.rfind("ready ", 0), 0u) << r;
    if (r.rfind("ready ", 0) == 0) pid_in_ns_ = std::stoi(r.substr(6));
  }
  ~Peer() {
    if (stdin_ >= 0) ::close(stdin_);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    ::close(stdout_);
  }
  void Send(const std::string& line) { ASSERT_EQ(::write(stdin_, (line + "\n").data(), line.size() + 1), ssize_t(line.size() + 1)); }
  // The next line, or "" after 10 s.
  std::string Line() {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      pollfd p{stdout_, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return "";
      char b[512];
      ssize_t n = ::read(stdout_, b, sizeof(b));
      if (n <= 0) return "";
      buf_.append(b, n);
    }
  }
  UniqueFd Netns() const { return UniqueFd(::open(absl::StrCat("/proc/", pid_, "/ns/net").c_str(), O_RDONLY | O_CLOEXEC)); }
  pid_t pid() const { return pid_; }
  pid_t pid_in_ns() const { return pid_in_ns_; }

 private:
  pid_t pid_ = -1, pid_in_ns_ = -1;
  int stdin_ = -1, stdout_ = -1;
  std::string buf_;
};

int OpenFds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

Bridge::Member M(uint64_t session, const std::string& group, const Peer& p) {
  Bridge::Member m;
  m.session = session;
  m.group = group;
  m.pod = absl::StrCat("ml/pod-", session);
  m.netns = p.Netns();
  return m;
}

const std::string kAnswer = "podlink-" + std::to_string(0xabcdef12);

class BridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces)";
    BridgeOptions o;
    o.rescan_interval = absl::Milliseconds(50);
    o.max_names_per_pod = 16;
    o.datagrams_per_second = 2000;
    auto b = Bridge::Start(o);
    ASSERT_TRUE(b.ok()) << b.status();
    bridge_ = *std::move(b);
  }
  std::unique_ptr<Bridge> bridge_;
};

TEST(NcclNames, OnlyNcclsAbstractNames) {
  std::string n("\0tmp/nccl-socket-3-1a2b", 23);
  EXPECT_TRUE(IsNcclIpcName(n));
  EXPECT_TRUE(IsNcclIpcName(n + std::string(85, '\0')));
  EXPECT_FALSE(IsNcclIpcName(n + std::string(86, '\0')));  // longer than sun_path
  EXPECT_FALSE(IsNcclIpcName(std::string("/tmp/nccl-socket-3-1a2b")));
  EXPECT_FALSE(IsNcclIpcName(std::string("\0tmp/nccl-socket--1a2b", 22)));
  EXPECT_FALSE(IsNcclIpcName(std::string("\0tmp/nccl-socket-3-", 19)));
  EXPECT_FALSE(IsNcclIpcName(std::string("\0tmp/nccl-socket-3-1A2B", 23)));
  EXPECT_FALSE(IsNcclIpcName(n + "x"));
  EXPECT_FALSE(IsNcclIpcName(std::string("\0tmp/other-3-1a2b", 17)));
  EXPECT_EQ(Printable(n + std::string(5, '\0')), "@tmp/nccl-socket-3-1a2b");
}

TEST_F(BridgeTest, RequestAndAnswerCrossNamespacesWithOnlyMemoryDescriptors) {
  int fds_before = OpenFds();
  {
    Peer proxy({"proxy", "1", "abcdef12"});
    Peer client({"client", "0", "1", "abcdef12"});
    // Without the bridge: what NCCL hits between pods.
    client.Send("go socket");
    EXPECT_EQ(client.Line(), absl::StrCat("error ", ECONNREFUSED));

    ASSERT_TRUE(bridge_->Join(M(1, "ml/job", proxy)).ok());
    ASSERT_TRUE(bridge_->Join(M(2, "ml/job", client)).ok());
    ASSERT_TRUE(bridge_->Sync(1).ok());
    EXPECT_GE(bridge_->mirrors(), 1u);

    // NCCL's request: its own socket as the placeholder descriptor. The proxy
    // gets an empty sealed memfd instead; the answer's memfd comes through.
    for (int i = 0; i < 3; ++i) {
      client.Send("go socket");
      EXPECT_EQ(proxy.Line(), "request rank=0 fd=placeholder");
      EXPECT_EQ(client.Line(), "answer " + kAnswer);
    }
    client.Send("go none");
    EXPECT_EQ(proxy.Line(), "request rank=0 fd=none");
    EXPECT_EQ(client.Line(), "answer " + kAnswer);

    // A pipe is no memory handle: dropped, counted, no answer.
    uint64_t refused = bridge_->Counters().refused_descriptor;
    client.Send("go pipe");
    EXPECT_EQ(client.Line(), absl::StrCat("error ", ETIMEDOUT));
    EXPECT_EQ(bridge_->Counters().refused_descriptor, refused + 1);

    // Over 4 KiB, and two descriptors: dropped and counted; the proxy sees neither (its next request is ours).
    client.Send("big");
    EXPECT_EQ(client.Line(), "sent 0");
    client.Send("twofds");
    EXPECT_EQ(client.Line(), "sent 0");
    for (int i = 0; i < 100 && (bridge_->Counters().refused_malformed == 0 ||
                                bridge_->Counters().refused_descriptor < refused + 2);
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(bridge_->Counters().refused_malformed, 1u);
    EXPECT_EQ(bridge_->Counters().refused_descriptor, refused + 2);
    client.Send("go none");
    EXPECT_EQ(proxy.Line(), "request rank=0 fd=none");
    EXPECT_EQ(client.Line(), "answer " + kAnswer);

    // The bridge counts a datagram just after passing it on: the client may have the answer first.
    for (int i = 0; i < 100 && bridge_->Counters().datagrams_forwarded < 10; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    BridgeCounters c = bridge_->Counters();
    EXPECT_EQ(c.descriptors_replaced, 3u);
    EXPECT_EQ(c.descriptors_forwarded, 5u);  // the five answers
    EXPECT_EQ(c.datagrams_forwarded, 10u);

    // The proxy's socket closes: its mirror goes with the next scan.
    proxy.Send("close");
    EXPECT_EQ(proxy.Line(), "closed");
    ASSERT_TRUE(bridge_->Sync(1).ok());
    client.Send("go socket");
    EXPECT_EQ(client.Line(), absl::StrCat("error ", ECONNREFUSED));

    bridge_->Leave(1);
    bridge_->Leave(2);
    EXPECT_EQ(bridge_->members(), 0u);
    EXPECT_EQ(bridge_->mirrors(), 0u);
    EXPECT_TRUE(bridge_->RenderMetrics().find("podlink_nccl_ipc_descriptors_replaced_total 3") != std::string::npos);
  }
  EXPECT_EQ(OpenFds(), fds_before) << "descriptors leaked";
}

TEST_F(BridgeTest, OtherGroupsAndTheHostNamespaceAreNotJoined) {
  Peer proxy({"proxy", "1", "abcdef12"});
  Peer other({"client", "0", "1", "abcdef12"});
  ASSERT_TRUE(bridge_->Join(M(1, "ml/job", proxy)).ok());
  ASSERT_TRUE(bridge_->Join(M(2, "ml/other-job", other)).ok());
  ASSERT_TRUE(bridge_->Sync(1).ok());
  other.Send("go socket");
  EXPECT_EQ(other.Line(), absl::StrCat("error ", ECONNREFUSED));
  EXPECT_EQ(bridge_->mirrors(), 0u);

  // One namespace, two groups: refused.
  absl::Status s = bridge_->Join(M(3, "ml/job", other));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;

  // podlinkd's own (the host's) namespace: refused.
  Bridge::Member host;
  host.session = 4;
  host.group = "ml/job";
  host.pod = "ml/host-net";
  host.netns = UniqueFd(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  s = bridge_->Join(std::move(host));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("hostNetwork"), std::string::npos) << s;
  EXPECT_EQ(bridge_->Sync(99).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(BridgeTest, NamesBoundAfterJoiningAreFoundByTheScan) {
  Peer client({"client", "0", "1", "abcdef12"});
  ASSERT_TRUE(bridge_->Join(M(2, "ml/job", client)).ok());
  Peer proxy({"proxy", "1", "abcdef12"});
  ASSERT_TRUE(bridge_->Join(M(1, "ml/job", proxy)).ok());  // bound before: mirrored at once
  client.Send("go socket");
  EXPECT_EQ(proxy.Line(), "request rank=0 fd=placeholder");
  EXPECT_EQ(client.Line(), "answer " + kAnswer);
}

TEST_F(BridgeTest, APodsMirrorsAndDatagramsAreBounded) {
  Peer many({"names", "5", "40"});  // 40 names, 16 mirrored
  Peer proxy({"proxy", "1", "abcdef12"});
  Peer client({"client", "0", "1", "abcdef12"});
  ASSERT_TRUE(bridge_->Join(M(1, "ml/job", proxy)).ok());
  ASSERT_TRUE(bridge_->Join(M(2, "ml/job", client)).ok());
  ASSERT_TRUE(bridge_->Join(M(3, "ml/job", many)).ok());
  EXPECT_GT(bridge_->Counters().mirror_limit, 0u);
  EXPECT_EQ(bridge_->mirrors(), 2u * 16u + 2u);  // 16 of many's into each other pod, proxy's into two

  // A flood: forwarded up to the rate, the rest dropped; the bridge serves on. However slowly this machine runs
  // (a sanitizer, other tests beside it), the bucket holds at most a second's worth (2000) and refills at 2000 a
  // second: the bound is taken from the time the flood has had, and the drops are waited for (10 s at most) while
  // the bridge works through what is queued.
  const auto flood_start = std::chrono::steady_clock::now();
  client.Send("flood 20000");
  std::string f = client.Line();
  ASSERT_EQ(f.rfind("flooded ", 0), 0u) << f;
  const double send_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_start).count();
  const double sent = std::strtod(f.c_str() + 8, nullptr);
  BridgeCounters c = bridge_->Counters();
  for (int i = 0; i < 100 && c.dropped_rate + c.dropped_undeliverable == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c = bridge_->Counters();
  }
  const double flood_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - flood_start).count();
  // Something is dropped unless the sender itself was too slow to go over the rate (a starved machine).
  if (sent > 2000 + 2000 * send_s) {
    EXPECT_GT(c.dropped_rate + c.dropped_undeliverable, 0u)
        << "nothing of " << sent << " sent in " << send_s << " s dropped (forwarded " << c.datagrams_forwarded << ")";
  } else {
    std::cerr << "the flood was too slow to go over the rate: " << sent << " in " << send_s << " s\n";
  }
  EXPECT_LE(static_cast<double>(c.datagrams_forwarded), 2 * (2000 + 2000 * flood_s) + 100) << flood_s << " s";
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the rate refills
  for (int i = 0; i < 3; ++i) {
    // The flood's answers and requests may still drain: wait for our answer.
    client.Send("go none");
    std::string a = client.Line();
    if (a == "answer " + kAnswer) break;
    EXPECT_LT(i, 2) << a;
  }
}

// A pod calling SyncNcclIpc in a flood: while the bridge's thread is busy,
// 64 calls of one session arrive. One scan is queued, 7 more calls wait for
// it (it starts after each of them, so it sees every name they bound), the
// other 56 are refused at once; all 8 get the one scan's answer. Then the
// group's datagrams still cross, and a call alone gets a scan of its own.
// (Each call queued a scan of its own before, on the bridge's only thread.)
TEST_F(BridgeTest, SyncCallsOfOneSessionCoalesceAndAreBounded) {
  Peer proxy({"proxy", "1", "abcdef12"});
  Peer client({"client", "0", "1", "abcdef12"});
  ASSERT_TRUE(bridge_->Join(M(1, "ml/job", proxy)).ok());
  ASSERT_TRUE(bridge_->Join(M(2, "ml/job", client)).ok());
  // Hold the bridge's thread until every call has either joined the queued
  // scan or been refused (at most 20 s).
  std::thread hold([&] {
    ASSERT_TRUE(bridge_
                    ->RunOnBridgeThread([&] {
                      for (int i = 0; i < 2000; ++i) {
                        BridgeCounters c = bridge_->Counters();
                        if (c.syncs_coalesced + c.syncs_refused >= 63) break;
                        std::this_thread::sleep_for(std::chrono::milliseconds(10));
                      }
                      return absl::OkStatus();
                    })
                    .ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the hold is on the thread
  std::atomic<int> ok{0}, refused{0}, other{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 64; ++t) {
    flood.emplace_back([&] {
      absl::Status st = bridge_->Sync(2);
      (st.ok() ? ok : absl::IsResourceExhausted(st) ? refused : other).fetch_add(1);
    });
  }
  for (std::thread& t : flood) t.join();
  hold.join();
  EXPECT_EQ(ok.load(), Bridge::kMaxSyncWaiters);
  EXPECT_EQ(refused.load(), 64 - Bridge::kMaxSyncWaiters);
  EXPECT_EQ(other.load(), 0);
  BridgeCounters c = bridge_->Counters();
  EXPECT_EQ(c.syncs_scanned, 1u) << "the calls that waited shared one scan";
  EXPECT_EQ(c.syncs_coalesced, static_cast<uint64_t>(Bridge::kMaxSyncWaiters - 1));
  EXPECT_EQ(c.syncs_refused, static_cast<uint64_t>(64 - Bridge::kMaxSyncWaiters));
  client.Send("go socket");
  EXPECT_EQ(proxy.Line(), "request rank=0 fd=placeholder");
  EXPECT_EQ(client.Line(), "answer " + kAnswer);
  ASSERT_TRUE(bridge_->Sync(2).ok());
  EXPECT_EQ(bridge_->Counters().syncs_scanned, 2u);
}

// A group's /dev/shm: one tmpfs, mounted over each member's own /dev/shm
// from podlinkd's mount namespace into the pod's.
TEST(GroupShm, MountedOverAPodsOwnDevShm) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (mount namespaces)";
  char tmpl[] = "/tmp/podlink-shm-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/group";
  auto dev = EnsureTmpfs(dir, 64 << 20);
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto again = EnsureTmpfs(dir, 64 << 20);  // mounted once
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *dev);
  {
    // A pod: its own mount namespace and its own /dev/shm.
    Peer pod({"/usr/bin/unshare", "--mount", "--propagation", "private", "sh", "-c",
              "mount -t tmpfs tmpfs /dev/shm && echo ready $$ && read x && cat /dev/shm/from-group"},
             true);
    pid_t pid = pod.pid();
    auto before = DeviceSeenBy(pid, "/dev/shm");
    ASSERT_TRUE(before.ok()) << before.status();
    EXPECT_NE(*before, *dev);
    ASSERT_TRUE(MountInto(pid, dir, "/dev/shm").ok());
    auto after = DeviceSeenBy(pid, "/dev/shm");
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(*after, *dev);
    // podlinkd's own /dev/shm is untouched.
    struct stat mine {};
    ASSERT_EQ(::stat("/dev/shm", &mine), 0);
    EXPECT_NE(mine.st_dev, *dev);
    // What one member writes the pod reads.
    FILE* f = std::fopen((dir + "/from-group").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("shared\n", f);
    std::fclose(f);
    pod.Send("go");
    EXPECT_EQ(pod.Line(), "shared");
    // A process that is gone: a clear error.
    EXPECT_FALSE(MountInto(999999999, dir, "/dev/shm").ok());
  }
  RemoveTmpfs(dir);
  struct stat st {};
  EXPECT_NE(::stat(dir.c_str(), &st), 0);
  ::rmdir(tmpl);
}

}  // namespace
}  // namespace podlink::ncclipc
