// A thread still in OpenSSL while the process exits — what gRPC's TLS
// handshakes to peer daemons do when podlinkd returns from main() — must not
// find OpenSSL's state freed (daemon/mesh/trust/openssl_exit.h).
#include <openssl/rand.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "daemon/mesh/trust/openssl_exit.h"
#include "gtest/gtest.h"

namespace {

using namespace std::chrono_literals;

constexpr uint64_t kDraws = 1000;
std::atomic<uint64_t> g_draws{0};

// Registered before OpenSSL registers its own handler, so it runs after that
// one (atexit runs handlers in reverse): the drawing thread goes on through
// OpenSSL's clean-up, had it run, for up to 5 s.
void LetTheThreadDrawAfterCleanup() {
  const uint64_t seen = g_draws.load(std::memory_order_acquire);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (g_draws.load(std::memory_order_acquire) < seen + kDraws && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  if (g_draws.load(std::memory_order_acquire) < seen + kDraws) _exit(3);
}

// The child's exit status: 0 when the thread drew through exit() unharmed.
[[noreturn]] void Child(bool keep) {
  rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  std::atexit(LetTheThreadDrawAfterCleanup);
  if (keep && !podlink::mesh::KeepOpenSslUntilExit()) _exit(2);
  std::thread([] {
    unsigned char bytes[16];
    for (;;) {
      if (RAND_bytes(bytes, sizeof(bytes)) != 1) _exit(4);
      g_draws.fetch_add(1, std::memory_order_acq_rel);
    }
  }).detach();
  while (g_draws.load(std::memory_order_acquire) < kDraws) std::this_thread::sleep_for(1ms);
  std::exit(0);
}

// How the child ended, as waitpid tells it; it is killed after 30 s.
int RunChild(bool keep) {
  const pid_t pid = fork();
  if (pid == 0) Child(keep);
  EXPECT_GT(pid, 0);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "the child did not exit in 30 s";
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  return status;
}

TEST(OpenSslExit, AThreadDrawingRandomBytesOutlivesExit) {
  const int status = RunChild(/*keep=*/true);
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The hazard itself, on this OpenSSL: without the call, the same child does
// not end well (the thread takes a freed lock, or OpenSSL refuses it). This
// keeps the test above able to fail.
TEST(OpenSslExit, WithoutItTheSameThreadFindsOpenSslGone) {
  const int status = RunChild(/*keep=*/false);
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
