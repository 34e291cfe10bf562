// Import authorization, deny by default.
//
// A pod may import an export when
//   1. it is the exporting pod itself, or
//   2. the exporter named it in allowed_importers ("namespace/name"), or
//   3. both pods carry the same non-empty podlink.io/peer-group annotation
//      and live in the same namespace.
// Anything else is PERMISSION_DENIED with a reason that says what to change.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/identity/pod_source.h"

namespace podlink {

struct PodName {
  std::string namespace_;
  std::string name;
  bool operator==(const PodName&) const = default;
};

struct ExportPolicyView {
  uint64_t export_id = 0;
  std::string export_name;
  const PodInfo* owner = nullptr;
  const std::vector<PodName>* allowed_importers = nullptr;
};

// Every label CheckImport gives a denial (metrics list them all from the start).
inline constexpr const char* kDenialReasons[] = {"namespace_mismatch", "exporter_not_in_group",
                                                 "importer_not_in_group", "group_mismatch"};

// `reason`, when given, receives one of kDenialReasons on denial.
absl::Status CheckImport(const ExportPolicyView& exp, const PodInfo& importer, const char** reason = nullptr);

}  // namespace podlink
