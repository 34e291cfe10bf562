// FUZZ_CHECK: a property every fuzz target asserts. A violation prints the
// condition and a printf-style explanation, then aborts, which libFuzzer
// reports as a crash and saves the input.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                             \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "%s: check failed: %s: ", __FILE__, #cond);    \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fputc('\n', stderr);                                           \
      std::abort();                                                       \
    }                                                                     \
  } while (0)
