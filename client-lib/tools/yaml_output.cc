#include "client-lib/tools/yaml_output.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace podlink {
namespace {

using nlohmann::json;

// Words YAML 1.1 reads as a boolean or as null (compared in lower case).
bool IsYaml11Word(absl::string_view s) {
  const std::string lower = absl::AsciiStrToLower(s);
  for (absl::string_view word : {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}) {
    if (lower == word) return true;
  }
  return false;
}

// True when `s` reads back as this string without quotes, in YAML 1.1 and 1.2:
// it cannot start an indicator, a number, a date or a special float, and holds
// no character that ends or annotates a plain scalar.
bool CanBePlain(absl::string_view s) {
  if (s.empty()) return false;
  const unsigned char first = static_cast<unsigned char>(s[0]);
  if (!absl::ascii_isalpha(first) && first != '/' && first != '_') return false;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (!absl::ascii_isalnum(u) && c != '.' && c != '_' && c != '/' && c != '-') return false;
  }
  return !IsYaml11Word(s);
}

// The length of the UTF-8 sequence starting at s[at] and its code point in
// `*code`; 0 when the bytes there are not one.
size_t DecodeUtf8(absl::string_view s, size_t at, char32_t* code) {
  const unsigned char lead = static_cast<unsigned char>(s[at]);
  size_t len = 0;
  if (lead < 0x80) {
    len = 1;
  } else if ((lead & 0xe0) == 0xc0) {
    len = 2;
  } else if ((lead & 0xf0) == 0xe0) {
    len = 3;
  } else if ((lead & 0xf8) == 0xf0) {
    len = 4;
  }
  if (len == 0 || at + len > s.size()) return 0;
  char32_t value = len == 1 ? lead : lead & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) {
    const unsigned char next = static_cast<unsigned char>(s[at + k]);
    if ((next & 0xc0) != 0x80) return 0;
    value = (value << 6) | (next & 0x3f);
  }
  *code = value;
  return len;
}

// Characters a YAML reader refuses, folds or drops when they appear as they
// are: C0 and C1 controls (U+0085 is a line break), DEL, the line and
// paragraph separators, the byte order mark, and U+FFFE/U+FFFF.
bool MustEscape(char32_t c) {
  return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 || c == 0xfeff ||
         c == 0xfffe || c == 0xffff;
}

std::string DoubleQuoted(absl::string_view s) {
  std::string out = "\"";
  size_t at = 0;
  while (at < s.size()) {
    char32_t c = 0;
    const size_t len = DecodeUtf8(s, at, &c);
    if (len == 0) {  // not UTF-8: the byte as it is (JSON text could not hold it either)
      out += s[at++];
      continue;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (MustEscape(c)) {
      out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
    } else {
      out.append(s.data() + at, len);
    }
    at += len;
  }
  out += '"';
  return out;
}

std::string String(absl::string_view s) { return CanBePlain(s) ? std::string(s) : DoubleQuoted(s); }

// A value that fits on its key's (or its dash's) line.
std::string Scalar(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case json::value_t::string:
      return String(v.get_ref<const std::string&>());
    case json::value_t::number_float: {
      if (!std::isfinite(v.get<double>())) return "null";  // what the JSON output prints
      std::string text = v.dump();
      if (text.find('.') == std::string::npos) {
        const size_t exponent = text.find_first_of("eE");
        text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
      }
      return text;
    }
    case json::value_t::object:
      return "{}";  // only empty ones are written inline
    case json::value_t::array:
      return "[]";
    default:
      return v.dump();  // integers
  }
}

bool IsBlock(const json& v) { return (v.is_object() || v.is_array()) && !v.empty(); }

// The lines of a non-empty object or array, not yet indented.
void BlockLines(const json& v, std::vector<std::string>* out) {
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string key = String(it.key()) + ":";
      if (!IsBlock(*it)) {
        out->push_back(key + " " + Scalar(*it));
        continue;
      }
      out->push_back(key);
      std::vector<std::string> inner;
      BlockLines(*it, &inner);
      // kubectl's layout: a sequence's dashes line up with its key.
      const std::string pad = it->is_array() ? "" : "  ";
      for (const std::string& line : inner) out->push_back(pad + line);
    }
    return;
  }
  for (const json& item : v) {
    if (!IsBlock(item)) {
      out->push_back("- " + Scalar(item));
      continue;
    }
    std::vector<std::string> inner;
    BlockLines(item, &inner);
    for (size_t i = 0; i < inner.size(); ++i) out->push_back((i == 0 ? "- " : "  ") + inner[i]);
  }
}

}  // namespace

std::string ToYaml(const json& value) {
  if (!IsBlock(value)) return Scalar(value) + "\n";
  std::vector<std::string> lines;
  BlockLines(value, &lines);
  std::string out;
  for (const std::string& line : lines) {
    out += line;
    out += '\n';
  }
  return out;
}

}  // namespace podlink
