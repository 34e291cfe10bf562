// kubectl-podlink's -o yaml: the layout kubectl prints, quoting where a YAML
// reader would otherwise change the value, and a round trip through PyYAML
// (a YAML 1.1 reader, the stricter kind) of values chosen to break emitters.
#include "client-lib/tools/yaml_output.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/command.h"
#include "gtest/gtest.h"

namespace podlink {
namespace {

using nlohmann::json;
using namespace std::string_literals;

TEST(YamlOutput, BlockLayoutLikeKubectl) {
  json doc = {{"pod", "ml/decode-0"},
              {"ok", false},
              {"checks", {{{"check", "phase"}, {"ok", true}}, {{"check", "GPU"}, {"ok", false}}}},
              {"stats", {{"sessions", 2}, {"relay", {{"rings", 0}}}}},
              {"empty_map", json::object()},
              {"empty_list", json::array()},
              {"nested", {{1, 2}, json::array(), {{"a", nullptr}}}}};
  EXPECT_EQ(ToYaml(doc),
            "checks:\n"
            "- check: phase\n"
            "  ok: true\n"
            "- check: GPU\n"
            "  ok: false\n"
            "empty_list: []\n"
            "empty_map: {}\n"
            "nested:\n"
            "- - 1\n"
            "  - 2\n"
            "- []\n"
            "- a: null\n"
            "ok: false\n"
            "pod: ml/decode-0\n"
            "stats:\n"
            "  relay:\n"
            "    rings: 0\n"
            "  sessions: 2\n");
}

TEST(YamlOutput, TopLevelScalarsAndEmptyContainers) {
  EXPECT_EQ(ToYaml(json::object()), "{}\n");
  EXPECT_EQ(ToYaml(json::array()), "[]\n");
  EXPECT_EQ(ToYaml(nullptr), "null\n");
  EXPECT_EQ(ToYaml(7), "7\n");
  EXPECT_EQ(ToYaml("GPU-1234"), "GPU-1234\n");
}

TEST(YamlOutput, QuotesStringsAReaderWouldRetype) {
  for (const char* plain : {"ml/decode-0", "GPU-8b1c", "/dev/nvidia0", "podlink.io/peer-group", "_x", "Running",
                            "yesterday", "nonce", "e5", "inf"}) {
    EXPECT_EQ(ToYaml(plain), std::string(plain) + "\n") << plain;
  }
  for (const char* quoted : {"", "yes", "No", "ON", "off", "y", "N", "true", "False", "null", "NULL", "~", "123",
                             "0x1f", "1e3", "1_000", ".inf", "-.5", "12:30", "2001-12-14", "0000:18:00.0", "- a",
                             "a: b", "a #b", "#c", "&a", "*a", "!t", "|", ">", "%x", "@x", "`x", "{a}", "[a]", "<<",
                             "=", "?", "-", "---", "...", "a,b", " lead", "trail ", "two words"}) {
    std::string out = ToYaml(quoted);
    EXPECT_EQ(out.front(), '"') << quoted;
    EXPECT_EQ(out, "\"" + std::string(quoted) + "\"\n") << quoted;
  }
  EXPECT_EQ(ToYaml(json{{"yes", 1}}), "\"yes\": 1\n");
}

TEST(YamlOutput, EscapesWhatCannotAppearAsItIs) {
  EXPECT_EQ(ToYaml("say \"hi\"\\"), "\"say \\\"hi\\\"\\\\\"\n");
  EXPECT_EQ(ToYaml("a\nb\tc\rd"), "\"a\\nb\\tc\\rd\"\n");
  EXPECT_EQ(ToYaml("nul\0bel\a del\x7f"s), "\"nul\\u0000bel\\u0007 del\\u007f\"\n");
  EXPECT_EQ(ToYaml("nel\xc2\x85 ls\xe2\x80\xa8 ps\xe2\x80\xa9 bom\xef\xbb\xbf"),
            "\"nel\\u0085 ls\\u2028 ps\\u2029 bom\\ufeff\"\n");
  EXPECT_EQ(ToYaml("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"), "\"caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80\"\n");
}

TEST(YamlOutput, FloatsKeepADot) {
  EXPECT_EQ(ToYaml(1.5), "1.5\n");
  EXPECT_EQ(ToYaml(3.0), "3.0\n");
  EXPECT_EQ(ToYaml(1e20), "1.0e+20\n");
  EXPECT_EQ(ToYaml(-2.5e-7), "-2.5e-07\n");
  EXPECT_EQ(ToYaml(std::nan("")), "null\n");
}

// Writes `text` to a fresh file under /tmp and returns its path.
std::string TempFile(const std::string& text) {
  char path[] = "/tmp/podlink-yaml-XXXXXX";
  int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(YamlOutput, PyYamlReadsBackTheSameValue) {
  json strings = json::array();
  for (const char* s : {"", "yes", "No", "ON", "y", "~", "null", "NULL", "123", "0x1f", "1e3", "1_000", "0o17", ".inf",
                        "-.inf", ".nan", "12:30", "190:20:30", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "- a",
                        "a: b", "a #b", "#c", "&a", "*a", "!t", "!!str", "|", "> x", "%x", "@x", "`x", "{a}", "[a]",
                        "'q'", "\"q\"", "back\\slash", "tab\there", "line\nbreak", "cr\r", "\x7f", "nel\xc2\x85",
                        "ls\xe2\x80\xa8", "\xef\xbb\xbf" "bom", "caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac",
                        "\xf0\x9f\x98\x80", " lead", "trail ", "=", "<<", "?", "?x", "-", "---", "...", "a,b",
                        "ml/decode-0", "GPU-abc", "/dev/nvidia0", "_x", "on the node", "x: y\n- z"}) {
    strings.push_back(s);
  }
  strings.push_back("nul\0x"s);
  json doc = {
      {"strings", strings},
      {"numbers", {0, -1, 18446744073709551615ull, -9223372036854775807ll, 1.5, 3.0, 1e20, -2.5e-7, 0.1, 1e-300}},
      {"others", {true, false, nullptr, json::object(), json::array()}},
      {"keys", {{"yes", 1}, {"1", 2}, {"", 3}, {"a b", 4}, {"<<", 5}, {"null", 6}, {"on", 7}}},
      {"deep", json::parse(R"([{"a": [{"b": [1, [2, [3]]]}], "c": {"d": {"e": []}}}])")},
  };
  std::string json_path = TempFile(doc.dump());
  std::string yaml_path = TempFile(ToYaml(doc));
  // Equal values of equal types (Python's == holds for True and 1, and for 1.0 and 1).
  CommandOutput r = RunCommand(
      "python3 -c '\n"
      "import json, sys, yaml\n"
      "def same(a, b):\n"
      "    if type(a) is not type(b): return False\n"
      "    if isinstance(a, dict): return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)\n"
      "    if isinstance(a, list): return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))\n"
      "    return a == b\n"
      "j = json.load(open(sys.argv[1], encoding=\"utf-8\"))\n"
      "y = yaml.safe_load(open(sys.argv[2], encoding=\"utf-8\"))\n"
      "sys.exit(0 if same(j, y) else \"differ:\\n%r\\n%r\" % (j, y))\n"
      "' " + json_path + " " + yaml_path);
  EXPECT_EQ(r.code, 0) << r.text << "\n" << ToYaml(doc);
  std::remove(json_path.c_str());
  std::remove(yaml_path.c_str());
}

}  // namespace
}  // namespace podlink
