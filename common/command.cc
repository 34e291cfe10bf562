#include "common/command.h"

#include <sys/wait.h>

#include <cstdio>

namespace podlink {

CommandOutput RunCommand(const std::string& cmd) {
  CommandOutput o;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) o.text.append(buf, n);
  int st = ::pclose(p);
  o.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

}  // namespace podlink
