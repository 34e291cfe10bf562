// JSON values printed as YAML, in the block layout `kubectl -o yaml` uses
// (keys in the JSON's order, sequences under a key not indented further).
//
// What reads it back gets the same JSON value, with YAML 1.1 parsers
// (PyYAML, go-yaml v2) as with YAML 1.2 ones: a string is left unquoted only
// when it starts with a letter, '/' or '_', holds nothing but letters, digits
// and . _ / -, and is not a word YAML 1.1 reads as a boolean or null (yes, no,
// on, off, y, n, true, false, null, in any case); every other string is
// double-quoted with escapes (control characters, line and paragraph
// separators, the byte order mark). Floats always carry a '.', which YAML 1.1
// needs to read them as floats (1e+20 is printed 1.0e+20).
#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace podlink {

// `value` as one YAML document, ending in a newline.
std::string ToYaml(const nlohmann::json& value);

}  // namespace podlink
