// Runs a shell command and captures what it prints (stdout and stderr).
#pragma once

#include <string>

namespace podlink {

struct CommandOutput {
  int code = -1;  // exit status; -1 if it could not run or was killed
  std::string text;
};

CommandOutput RunCommand(const std::string& cmd);

}  // namespace podlink
