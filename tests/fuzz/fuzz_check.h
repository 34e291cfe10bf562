// FUZZ_CHECK: a property every fuzz target asserts. A violation prints the
// condition and a printf-style explanation, then aborts, which libFuzzer
// reports as a crash and saves the input.
#pragma once

#include <dirent.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define FUZZ_CHECK(cond, ...)                                             \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "%s: check failed: %s: ", __FILE__, #cond);    \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fputc('\n', stderr);                                           \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

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
