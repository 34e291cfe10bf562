// Process memory exports (daemon/gpu/process_memory.h): the maps check, and
// reads and writes through /proc/<pid>/mem of a child process that exits,
// execs, unmaps the range or forks while registered.
#include "daemon/gpu/process_memory.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace podlink {
namespace {

constexpr size_t kSize = 1 << 20;

uint8_t Pattern(size_t i, uint8_t seed) { return static_cast<uint8_t>(i * 31 + seed); }

// A child holding kSize bytes of private anonymous memory filled with
// Pattern(·, 1), driven by one-byte commands: 'c' checks Pattern(·, 2) and
// answers '1'/'0'; 'u' unmaps the range; 'r' makes its second half
// read-only; 'f' forks a grandchild that overwrites its copy and lives on;
// 'e' execs sleep. Every command is answered with one byte.
class Child {
 public:
  Child() {
    int to[2], from[2];
    EXPECT_EQ(::pipe(to), 0);
    EXPECT_EQ(::pipe(from), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(to[1]);
      ::close(from[0]);
      Serve(to[0], from[1]);
    }
    ::close(to[0]);
    ::close(from[1]);
    cmd_ = to[1];
    ans_ = from[0];
    EXPECT_EQ(::read(ans_, &address_, sizeof(address_)), static_cast<ssize_t>(sizeof(address_)));
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    EXPECT_GE(pidfd_, 0);
  }
  ~Child() {
    if (grandchild_ > 0) ::kill(grandchild_, SIGKILL);
    Kill();
    ::close(cmd_);
    ::close(ans_);
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  char Send(char c) {
    EXPECT_EQ(::write(cmd_, &c, 1), 1);
    char a = 0;
    EXPECT_EQ(::read(ans_, &a, 1), 1);
    if (c == 'f') EXPECT_EQ(::read(ans_, &grandchild_, sizeof(grandchild_)), static_cast<ssize_t>(sizeof(pid_t)));
    return a;
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  ExportClaim Claim(uint64_t offset = 0, uint64_t size = kSize) const {
    ExportClaim c;
    c.kind = HandleKind::kProcessMemory;
    c.size = size;
    c.address = address_ + offset;
    c.pid = pid_;
    c.pidfd = pidfd_;
    return c;
  }
  uint64_t address() const { return address_; }

 private:
  [[noreturn]] static void Serve(int in, int out) {
    auto* p = static_cast<uint8_t*>(
        ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    for (size_t i = 0; i < kSize; ++i) p[i] = Pattern(i, 1);
    uint64_t a = reinterpret_cast<uint64_t>(p);
    (void)!::write(out, &a, sizeof(a));
    char c;
    while (::read(in, &c, 1) == 1) {
      char ok = '1';
      if (c == 'c') {
        for (size_t i = 0; i < kSize; ++i) {
          if (p[i] != Pattern(i, 2)) ok = '0';
        }
      } else if (c == 'u') {
        ::munmap(p, kSize);
      } else if (c == 'r') {
        ::mprotect(p + kSize / 2, kSize / 2, PROT_READ);
      } else if (c == 'f') {
        pid_t g = ::fork();
        if (g == 0) {
          std::memset(p, 0xee, kSize);  // its own copy
          for (;;) ::pause();
        }
        (void)!::write(out, &ok, 1);
        (void)!::write(out, &g, sizeof(g));
        continue;
      } else if (c == 'e') {
        (void)!::write(out, &ok, 1);
        ::execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
        ::_exit(127);
      }
      (void)!::write(out, &ok, 1);
    }
    ::_exit(0);
  }

  pid_t pid_ = -1;
  pid_t grandchild_ = -1;
  int pidfd_ = -1;
  int cmd_ = -1, ans_ = -1;
  uint64_t address_ = 0;
};

int MemFd(const std::shared_ptr<MemoryObject>& m) { return (*m->CopyView()).mem_fd; }

TEST(ProcessMemoryMaps, ParsesAndChecksRanges) {
  auto maps = ParseMaps(
      "1000-3000 rw-p 00000000 00:00 0 \n"
      "3000-4000 rw-p 00000000 00:00 0                          [heap]\n"
      "5000-6000 r--p 00000000 08:01 12 /usr/lib/libc.so.6\n"
      "6000-7000 rw-s 00000000 00:01 99 /memfd:x (deleted)\n"
      "7000-8000 rw-p 00000000 00:00 0 [vvar]\n");
  ASSERT_TRUE(maps.ok()) << maps.status();
  ASSERT_EQ(maps->size(), 5u);
  EXPECT_EQ((*maps)[1].path, "[heap]");
  EXPECT_EQ((*maps)[3].path, "/memfd:x (deleted)");
  EXPECT_TRUE((*maps)[3].shared);
  EXPECT_TRUE(CheckRangeRegistrable(*maps, 0x1000, 0x3000).ok());  // across two adjacent mappings
  EXPECT_TRUE(CheckRangeRegistrable(*maps, 0x6000, 0x1000).ok());  // a shared mapping the process writes
  EXPECT_EQ(CheckRangeRegistrable(*maps, 0x3800, 0x1000).code(), absl::StatusCode::kFailedPrecondition);  // gap
  EXPECT_EQ(CheckRangeRegistrable(*maps, 0x5000, 16).code(), absl::StatusCode::kFailedPrecondition);  // read-only
  EXPECT_EQ(CheckRangeRegistrable(*maps, 0x7000, 16).code(), absl::StatusCode::kFailedPrecondition);  // kernel's
  EXPECT_EQ(CheckRangeRegistrable(*maps, 0x8000, 16).code(), absl::StatusCode::kFailedPrecondition);  // unmapped
  EXPECT_EQ(CheckRangeRegistrable(*maps, 0, 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRangeRegistrable(*maps, ~0ull - 8, 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRangeRegistrable(*maps, 0x1000, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseMaps("zz-10 rw-p 0 0 0\n").ok());
  EXPECT_FALSE(ParseMaps("2000-1000 rw-p 0 0 0\n").ok());
}

TEST(ProcessMemory, ReadsAndWritesTheChildsRangeAndNothingElse) {
  Child child;
  ProcessMemoryBackend b;
  auto m = b.Adopt(child.Claim(), UniqueFd(), "");
  ASSERT_TRUE(m.ok()) << m.status();
  // Never a daemon pointer, never a descriptor for an importer.
  EXPECT_EQ((*m)->MapForRelay().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*m)->Duplicate().status().code(), absl::StatusCode::kFailedPrecondition);
  auto v = (*m)->CopyView();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->address, child.address());
  EXPECT_FALSE(v->on_gpu);
  std::vector<uint8_t> buf(kSize);
  ASSERT_TRUE(ProcessRead(v->mem_fd, v->address, buf.data(), kSize, "t").ok());
  for (size_t i = 0; i < kSize; ++i) ASSERT_EQ(buf[i], Pattern(i, 1)) << i;
  for (size_t i = 0; i < kSize; ++i) buf[i] = Pattern(i, 2);
  ASSERT_TRUE(ProcessWrite(v->mem_fd, v->address, buf.data(), kSize, "t").ok());
  EXPECT_EQ(child.Send('c'), '1');
}

int OpenFds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

// A NIXL agent registers thousands of buffers: one descriptor per session,
// not per export, closed with the session's last export.
TEST(ProcessMemory, ASessionsExportsShareOneDescriptor) {
  Child child;
  ProcessMemoryBackend b;
  const int before = OpenFds();
  std::vector<std::shared_ptr<MemoryObject>> mine;
  ExportClaim c = child.Claim(0, 4096);
  c.session = 7;
  for (int i = 0; i < 100; ++i) {
    c.address = child.address() + static_cast<uint64_t>(i) * 4096;
    auto m = b.Adopt(c, UniqueFd(), "");
    ASSERT_TRUE(m.ok()) << m.status();
    mine.push_back(*m);
  }
  EXPECT_EQ(OpenFds(), before + 1);
  for (const auto& m : mine) EXPECT_EQ(MemFd(m), MemFd(mine.front()));
  EXPECT_EQ(b.open_descriptors(), 1u);
  ExportClaim other = child.Claim();
  other.session = 8;
  auto o = b.Adopt(other, UniqueFd(), "");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_NE(MemFd(*o), MemFd(mine.front()));
  EXPECT_EQ(b.open_descriptors(), 2u);
  mine.clear();
  EXPECT_EQ(b.open_descriptors(), 1u);
  EXPECT_EQ(OpenFds(), before + 1);
}

TEST(ProcessMemory, RefusesWhatTheProcessCannotWriteOrDoesNotHave) {
  Child child;
  ProcessMemoryBackend b;
  // Far past the mapping: through the gaps of the address space (memory next to it may be the process's too).
  EXPECT_EQ(b.Adopt(child.Claim(0, 1ull << 40), UniqueFd(), "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExportClaim gpu = child.Claim();
  gpu.gpu_uuid = "GPU-0";
  EXPECT_EQ(b.Adopt(gpu, UniqueFd(), "").status().code(), absl::StatusCode::kInvalidArgument);
  ExportClaim no_pidfd = child.Claim();
  no_pidfd.pidfd = -1;
  EXPECT_EQ(b.Adopt(no_pidfd, UniqueFd(), "").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(child.Send('r'), '1');  // the second half read-only: writes through /proc would bypass that
  auto ro = b.Adopt(child.Claim(), UniqueFd(), "");
  EXPECT_EQ(ro.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ro.status().message().find("read and write"), std::string::npos) << ro.status();
  EXPECT_TRUE(b.Adopt(child.Claim(0, kSize / 2), UniqueFd(), "").ok());
}

TEST(ProcessMemory, AnExitedProcessFailsClearly) {
  Child child;
  ProcessMemoryBackend b;
  auto m = b.Adopt(child.Claim(), UniqueFd(), "");
  ASSERT_TRUE(m.ok()) << m.status();
  child.Kill();
  char c;
  absl::Status st = ProcessRead(MemFd(*m), child.address(), &c, 1, "export 7");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("export 7"), std::string::npos) << st;
  EXPECT_NE(st.message().find("exited"), std::string::npos) << st;
  EXPECT_EQ(ProcessWrite(MemFd(*m), child.address(), &c, 1, "export 7").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ProcessMemory, AfterExecTheNewProgramIsNeverTouched) {
  Child child;
  ProcessMemoryBackend b;
  auto m = b.Adopt(child.Claim(), UniqueFd(), "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(child.Send('e'), '1');
  // The same pid now runs sleep; the descriptor names the address space that was registered, which is gone.
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    char c = 0;
    gone = !ProcessWrite(MemFd(*m), child.address(), &c, 1, "t").ok();
    if (!gone) ::usleep(10000);
  }
  EXPECT_TRUE(gone);
}

TEST(ProcessMemory, AnUnmappedRangeFailsAndTheDaemonIsUnharmed) {
  Child child;
  ProcessMemoryBackend b;
  auto m = b.Adopt(child.Claim(), UniqueFd(), "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(child.Send('u'), '1');
  std::vector<uint8_t> buf(kSize);
  absl::Status st = ProcessRead(MemFd(*m), child.address(), buf.data(), kSize, "t");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("unmapped"), std::string::npos) << st;
  EXPECT_FALSE(ProcessWrite(MemFd(*m), child.address(), buf.data(), kSize, "t").ok());
  // Registering it again is refused at once.
  EXPECT_EQ(b.Adopt(child.Claim(), UniqueFd(), "").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ProcessMemory, AfterForkTheRegisteringProcessKeepsItsRange) {
  Child child;
  ProcessMemoryBackend b;
  auto m = b.Adopt(child.Claim(), UniqueFd(), "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(child.Send('f'), '1');  // the grandchild scribbles over its own copy
  ::usleep(50000);
  std::vector<uint8_t> buf(kSize);
  ASSERT_TRUE(ProcessRead(MemFd(*m), child.address(), buf.data(), kSize, "t").ok());
  for (size_t i = 0; i < kSize; ++i) ASSERT_EQ(buf[i], Pattern(i, 1)) << i;
  for (size_t i = 0; i < kSize; ++i) buf[i] = Pattern(i, 2);
  ASSERT_TRUE(ProcessWrite(MemFd(*m), child.address(), buf.data(), kSize, "t").ok());  // copy-on-write is the kernel's
  EXPECT_EQ(child.Send('c'), '1');
}

}  // namespace
}  // namespace podlink
