// TCP mesh frames sent without a copy (MSG_ZEROCOPY: wire.h ZeroCopySends,
// PeerLinks with zero_copy) over loopback TCP, where the kernel always ends
// up copying: every byte arrives, completions are taken off the error queue,
// a COPIED completion makes the socket stop asking, a locked-memory limit
// makes a send fall back to a copy, only the pod's own export goes without a
// copy, and the receiving thread of a link is neither blocked nor kept
// spinning by completions waiting on its socket.

#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "daemon/mesh/tcp/tcp_link.h"
#include "daemon/mesh/links/wire.h"

namespace podlink::mesh {
namespace {

// A connected loopback TCP pair (first: the sender's end).
std::pair<UniqueFd, UniqueFd> TcpPair() {
  UniqueFd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  EXPECT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(l.get(), 1), 0);
  EXPECT_EQ(::getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &n), 0);
  UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  UniqueFd s(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  return {std::move(c), std::move(s)};
}

std::vector<char> Pattern(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& ch : v) {
    x = x * 1664525u + 1013904223u;
    ch = static_cast<char>(x >> 24);
  }
  return v;
}

FrameHeader WriteHeader(uint64_t tag, uint64_t offset, size_t len) {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = static_cast<uint16_t>(FrameType::kWrite);
  h.length = static_cast<uint32_t>(len);
  h.tag = tag;
  h.grant = 9;
  h.offset = offset;
  return h;
}

// Reads `frames` frames off `fd`, checking each header's tag and each
// payload against what `expect(tag)` says it must be.
void ReadFrames(int fd, int frames, const std::function<std::vector<char>(uint64_t)>& expect) {
  for (int i = 0; i < frames; ++i) {
    FrameHeader h;
    ASSERT_TRUE(ReadFull(fd, &h, sizeof(h)).ok());
    ASSERT_EQ(h.magic, kFrameMagic);
    ASSERT_EQ(h.tag, static_cast<uint64_t>(i));
    std::vector<char> got(h.length);
    ASSERT_TRUE(ReadFull(fd, got.data(), got.size()).ok());
    ASSERT_TRUE(got == expect(h.tag)) << "frame " << i << " differs";
  }
}

// Joins a thread however the test leaves its scope (a failed ASSERT too).
struct Joined {
  std::thread t;
  template <typename F>
  explicit Joined(F f) : t(std::move(f)) {}
  ~Joined() {
    if (t.joinable()) t.join();
  }
};

// Reaps until `done()` or 5 s pass.
bool ReapUntil(ZeroCopySends& zc, int fd, const std::function<bool()>& done) {
  for (int i = 0; i < 500 && !done(); ++i) {
    pollfd p{fd, 0, 0};
    ::poll(&p, 1, 10);
    zc.Reap(fd);
  }
  return done();
}

TEST(ZeroCopy, FramesArriveWholeAndALoopbackCopyTurnsTheSocketOff) {
  auto [tx, rx] = TcpPair();
  ZeroCopyCounters c;
  ZeroCopySends zc(&c);
  if (!zc.Enable(tx.get())) GTEST_SKIP() << "this kernel refuses SO_ZEROCOPY: " << std::strerror(errno);
  constexpr size_t kLen = 256 << 10;
  constexpr int kFrames = 8;
  std::vector<std::vector<char>> data;
  for (int i = 0; i < kFrames + 1; ++i) data.push_back(Pattern(kLen, i));
  Joined reader([&, fd = rx.get()] { ReadFrames(fd, kFrames + 1, [&](uint64_t t) { return data[t]; }); });
  for (int i = 0; i < kFrames; ++i) {
    ASSERT_TRUE(zc.WriteFrame(tx.get(), WriteHeader(i, 0, kLen), data[i].data(), kLen).ok());
  }
  // Loopback delivers by copying the pages after all: the kernel says so and
  // the socket stops asking.
  EXPECT_TRUE(ReapUntil(zc, tx.get(), [&] { return !zc.on(); })) << "no COPIED completion within 5 s";
  EXPECT_GE(c.bytes.load(), kLen);
  EXPECT_GE(c.completed.load(), 1u);
  EXPECT_GE(c.copied.load(), 1u);
  EXPECT_LE(c.copied.load(), c.completed.load());
  const uint64_t before = c.bytes.load();
  ASSERT_TRUE(zc.WriteFrame(tx.get(), WriteHeader(kFrames, 0, kLen), data[kFrames].data(), kLen).ok());
  EXPECT_EQ(c.bytes.load(), before) << "sent without a copy after the kernel said it copies";
}

TEST(ZeroCopy, SmallPayloadsAreCopied) {
  auto [tx, rx] = TcpPair();
  ZeroCopyCounters c;
  ZeroCopySends zc(&c);
  if (!zc.Enable(tx.get())) GTEST_SKIP() << "this kernel refuses SO_ZEROCOPY";
  const size_t small = ZeroCopySends::kMinPayload - 1;
  std::vector<char> a = Pattern(small, 1);
  {
    Joined reader([&, fd = rx.get()] {
      ReadFrames(fd, 2, [&](uint64_t t) { return t == 0 ? a : std::vector<char>(); });
    });
    ASSERT_TRUE(zc.WriteFrame(tx.get(), WriteHeader(0, 0, small), a.data(), small).ok());
    ASSERT_TRUE(zc.WriteFrame(tx.get(), WriteHeader(1, 0, 0), nullptr, 0).ok());
  }
  EXPECT_EQ(c.bytes.load(), 0u);
  EXPECT_TRUE(zc.on());
}

TEST(ZeroCopy, ALockedMemoryLimitMakesTheSendACopy) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the sender as another user without CAP_IPC_LOCK";
  auto [tx, rx] = TcpPair();
  constexpr size_t kLen = 1 << 20;
  std::vector<char> data = Pattern(kLen, 5);
  // A sender without CAP_IPC_LOCK (uid 65534) whose limit is far below one
  // frame: the kernel refuses to pin (ENOBUFS) and the frame is copied.
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit lim{64 << 10, 64 << 10};
    if (::setrlimit(RLIMIT_MEMLOCK, &lim) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0) {
      ::_exit(10);
    }
    ZeroCopyCounters c;
    ZeroCopySends zc(&c);
    if (!zc.Enable(tx.get())) ::_exit(11);
    if (!zc.WriteFrame(tx.get(), WriteHeader(0, 0, kLen), data.data(), kLen).ok()) ::_exit(12);
    ::_exit(c.fell_back.load() >= 1 && c.bytes.load() == 0 ? 0 : 13);
  }
  // The child holds the only sending end now: if it gives up early, the read
  // below ends at once; either way it ends within 30 s.
  tx.Reset();
  timeval limit{30, 0};
  ::setsockopt(rx.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  FrameHeader h;
  std::vector<char> got(kLen);
  const bool read = ReadFull(rx.get(), &h, sizeof(h)).ok() && h.length == kLen &&
                    ReadFull(rx.get(), got.data(), got.size()).ok();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 11) GTEST_SKIP() << "this kernel refuses SO_ZEROCOPY";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: could not drop privileges, 12: send failed, 13: no fallback counted";
  ASSERT_TRUE(read) << "the frame did not arrive whole";
  EXPECT_TRUE(got == data) << "the copied frame differs";
}

// A peer's end that reads WRITE frames into `memory` and, while `answer`,
// acknowledges each.
struct FakeOwner {
  UniqueFd fd;
  std::vector<char> memory;
  std::atomic<bool> answer{true};
  std::atomic<int> frames{0};
  std::thread t;
  FakeOwner(UniqueFd f, size_t size) : fd(std::move(f)), memory(size) {
    t = std::thread([this] {
      for (;;) {
        FrameHeader h;
        if (!ReadFull(fd.get(), &h, sizeof(h)).ok()) return;
        if (h.type != static_cast<uint16_t>(FrameType::kWrite) || h.offset + h.length > memory.size()) return;
        if (!ReadFull(fd.get(), memory.data() + h.offset, h.length).ok()) return;
        ++frames;
        if (!answer) continue;
        FrameHeader a{};
        a.magic = kFrameMagic;
        a.type = static_cast<uint16_t>(FrameType::kAck);
        a.tag = h.tag;
        if (!WriteFrame(fd.get(), a, nullptr, 0).ok()) return;
      }
    });
  }
  ~FakeOwner() {
    ::shutdown(fd.get(), SHUT_RDWR);
    t.join();
  }
};

double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::future<absl::Status> SubmitWrite(PeerLinks& links, std::vector<char>& src, bool from_export) {
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = done->get_future();
  LinkOp op;
  op.type = FrameType::kWrite;
  op.grant = 9;
  op.length = src.size();
  op.local = src.data();
  op.local_is_export = from_export;
  op.done = [done](const absl::Status& st) { done->set_value(st); };
  EXPECT_TRUE(links.Submit(std::move(op)).ok());
  return f;
}

TEST(ZeroCopy, ALinksWriteFromAnExportArrivesAndItsCompletionsNeitherBlockNorSpin) {
  auto [tx, rx] = TcpPair();
  constexpr size_t kLen = 8 << 20;
  FakeOwner owner(std::move(rx), kLen);
  PeerLinks links("owner", 512 << 10, 4, absl::Seconds(30), /*zero_copy=*/true);
  links.AddConnection(std::move(tx), "lo");
  // Slices of anything but the pod's own export (staging reused for others'
  // bytes, another pod's export) are always copied: first, while the
  // connection would still send without a copy.
  std::vector<char> staging = Pattern(kLen, 4);
  std::future<absl::Status> f = SubmitWrite(links, staging, false);
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_TRUE(f.get().ok());
  EXPECT_TRUE(owner.memory == staging);
  EXPECT_EQ(links.Stats().tcp_zero_copy_bytes, 0u);
  std::vector<char> src = Pattern(kLen, 3);
  f = SubmitWrite(links, src, true);
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_TRUE(f.get().ok());
  EXPECT_TRUE(owner.memory == src);
  LinkStats s = links.Stats();
  EXPECT_GE(s.tcp_zero_copy_bytes, 512u << 10);
  // The completions, COPIED ones on loopback, are taken off the socket by the
  // link's own threads: nothing stays queued to keep its receiver awake.
  for (int i = 0; i < 500 && links.Stats().tcp_zero_copy_copied == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(links.Stats().tcp_zero_copy_copied, 1u);
  const double cpu = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LT(CpuSeconds() - cpu, 0.5) << "a link thread spins on its socket's error queue";
}

TEST(ZeroCopy, APeerThatStopsAnsweringIsStillCaughtWithCompletionsPending) {
  auto [tx, rx] = TcpPair();
  constexpr size_t kLen = 4 << 20;
  FakeOwner owner(std::move(rx), kLen);
  owner.answer = false;  // reads everything (TCP stays healthy), answers nothing
  PeerLinks links("owner", 512 << 10, 4, absl::Seconds(1), /*zero_copy=*/true);
  links.AddConnection(std::move(tx), "lo");
  std::vector<char> src = Pattern(kLen, 6);
  std::future<absl::Status> f = SubmitWrite(links, src, true);
  // The receiving thread, woken by completions on the error queue, must go on
  // watching for unanswered requests instead of blocking in a read.
  ASSERT_EQ(f.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "the link hangs";
  absl::Status st = f.get();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("unanswered"), std::string::npos) << st;
  EXPECT_GE(links.Stats().tcp_zero_copy_bytes, 512u << 10);
}

}  // namespace
}  // namespace podlink::mesh
