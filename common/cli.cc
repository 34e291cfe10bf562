#include "common/cli.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"

namespace podlink::cli {
namespace {

[[noreturn]] void Fail(const Program& p, const std::string& why) {
  std::cerr << p.name << ": " << why << " (--help lists the options)\n";
  std::exit(2);
}

std::string Dashed(absl::string_view name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }

void PrintHelp(const Program& p) {
  std::cout << p.usage;
  if (!absl::EndsWith(p.usage, "\n")) std::cout << "\n";
  std::cout << "\nOptions (--name=value or --name value):\n";
  for (absl::CommandLineFlag* f : OwnFlags(p)) {
    std::string def = f->DefaultValue();
    std::cout << "  --" << Dashed(f->Name());
    if (f->IsOfType<bool>()) {
      std::cout << (def == "true" ? "  (default on; --" + Dashed(f->Name()) + "=false turns it off)" : "");
    } else if (f->IsOfType<std::string>()) {
      std::cout << "  (default \"" << def << "\")";
    } else {
      std::cout << "  (default " << def << ")";
    }
    std::cout << "\n      " << absl::StrReplaceAll(f->Help(), {{"\n", "\n      "}}) << "\n";
  }
  std::cout << "  --help, -h\n      this text\n  --version\n      print the version\n";
}

}  // namespace

std::vector<absl::CommandLineFlag*> OwnFlags(const Program& p) {
  // absl records the file without its leading '/', so compare by suffix.
  absl::string_view main = p.main_file;
  while (absl::ConsumePrefix(&main, "/") || absl::ConsumePrefix(&main, "./")) {
  }
  std::vector<absl::CommandLineFlag*> out;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    std::string file = flag->Filename();
    if (!flag->IsRetired() && (absl::EndsWith(file, main) || absl::EndsWith(main, file))) out.push_back(flag);
  }
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->Name() < b->Name(); });
  return out;
}

std::vector<std::string> Parse(int argc, char** argv, const Program& p) {
  std::vector<std::string> positional;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (options_done || arg.size() < 2 || arg[0] != '-') {
      positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      options_done = true;
      continue;
    }
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      PrintHelp(p);
      std::exit(0);
    }
    if (arg == "--version") {
      std::cout << p.name << " " << p.version << "\n";
      std::exit(0);
    }
    absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    size_t eq = body.find('=');
    std::string name = absl::StrReplaceAll(body.substr(0, eq), {{"-", "_"}});
    absl::CommandLineFlag* flag = name.empty() ? nullptr : absl::FindCommandLineFlag(name);
    if (flag == nullptr || flag->IsRetired()) Fail(p, "unknown option " + std::string(arg));
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(body.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      Fail(p, "--" + Dashed(name) + " needs a value");
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      Fail(p, "bad value '" + value + "' for --" + Dashed(name) + ": " + error);
    }
  }
  return positional;
}

}  // namespace podlink::cli
