// FUZZ_CHECK: a property every fuzz target asserts. A violation prints the
// condition and a printf-style explanation, then aborts, which libFuzzer
// reports as a crash and saves the input.
#pragma once

#include <dirent.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>

#define FUZZ_CHECK(cond, ...)                                             \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "%s: check failed: %s: ", __FILE__, #cond);    \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fputc('\n', stderr);                                           \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

// A harness's own checking loops, which libFuzzer need not steer: no
// coverage callbacks on their comparisons (clang; elsewhere nothing).
#if defined(__clang__)
#define PODLINK_FUZZ_HARNESS_ONLY __attribute__((no_sanitize("coverage")))
#else
#define PODLINK_FUZZ_HARNESS_ONLY
#endif

// Descriptors open in this process (entries of /proc/self/fd), for
// leak checks around one input.
inline int OpenFdCount() {
  DIR* d = ::opendir("/proc/self/fd");
  FUZZ_CHECK(d != nullptr, "opendir /proc/self/fd: %s", std::strerror(errno));
  int n = 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// A fuzz input read front to back; past its end every byte is 0. Integers are
// big-endian, so a committed corpus keeps its meaning.
struct FuzzInput {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  bool more() const { return n > 0; }
  uint8_t Byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | Byte();
    return v;
  }
  // A string of at most `cap` bytes: its length byte (mod cap + 1), then the bytes.
  std::string Str(size_t cap) {
    const size_t len = Byte() % (cap + 1);
    std::string s;
    for (size_t i = 0; i < len; ++i) s.push_back(static_cast<char>(Byte()));
    return s;
  }
};
