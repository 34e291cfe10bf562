// Command-line options of podlink's programs: flags defined with ABSL_FLAG
// next to main(), parsed here so every program behaves the same way:
//
//   --flag=value and --flag value; dashes or underscores in names
//   (--socket-dir is the flag socket_dir); a bool as --flag or --flag=false;
//   "--" ends the options; anything else is a positional argument.
//   --help / -h: the usage text and every flag of the program on stdout, exit 0.
//   --version: "<program> <version>" on stdout, exit 0.
//   An unknown option or a value that does not parse: the reason on stderr,
//   exit 2.
#pragma once

#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"

namespace podlink::cli {

struct Program {
  const char* name;     // "podlinkd"
  const char* version;  // PODLINK_VERSION
  const char* usage;    // synopsis and description, printed before the flags
  const char* main_file;  // __FILE__ of the file that defines the program's flags (shown by --help)
};

// Parses argv into the registered flags and returns the positional
// arguments (argv[0] excluded). Exits on --help, --version and errors.
std::vector<std::string> Parse(int argc, char** argv, const Program& program);

// The flags defined in the program's main file, sorted by name.
std::vector<absl::CommandLineFlag*> OwnFlags(const Program& program);

}  // namespace podlink::cli
