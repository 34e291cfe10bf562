#include "daemon/policy/policy.h"

#include "absl/strings/str_cat.h"

namespace podlink {

absl::Status CheckImport(const ExportPolicyView& exp, const PodInfo& importer, const char** reason) {
  const char* unused;
  if (reason == nullptr) reason = &unused;
  const PodInfo& owner = *exp.owner;
  if (owner.key == importer.key) return absl::OkStatus();
  for (const PodName& p : *exp.allowed_importers) {
    if (p.namespace_ == importer.namespace_ && p.name == importer.name) return absl::OkStatus();
  }
  std::string what = exp.export_name.empty()
                         ? absl::StrCat("export ", exp.export_id)
                         : absl::StrCat("export ", exp.export_id, " ('", exp.export_name, "')");
  std::string owner_group = owner.PeerGroup();
  std::string importer_group = importer.PeerGroup();
  if (!owner_group.empty() && owner_group == importer_group) {
    if (owner.namespace_ == importer.namespace_) return absl::OkStatus();
    *reason = "namespace_mismatch";
    return absl::PermissionDeniedError(absl::StrCat(
        "pod ", importer.Ref(), " may not import ", what, " of pod ", owner.Ref(),
        ": peer group '", owner_group, "' only joins pods of one namespace (", owner.namespace_,
        " vs ", importer.namespace_, "); have the exporter name ", importer.Ref(),
        " in allowed_importers instead"));
  }
  if (owner_group.empty()) {
    *reason = "exporter_not_in_group";
    return absl::PermissionDeniedError(absl::StrCat(
        "pod ", importer.Ref(), " may not import ", what, " of pod ", owner.Ref(),
        ": the exporting pod has no ", kPeerGroupAnnotation,
        " annotation and did not name this pod; annotate both pods with the same ",
        kPeerGroupAnnotation, " or have the exporter allow ", importer.Ref()));
  }
  if (importer_group.empty()) {
    *reason = "importer_not_in_group";
    return absl::PermissionDeniedError(absl::StrCat(
        "pod ", importer.Ref(), " may not import ", what, " of pod ", owner.Ref(), ": pod ",
        importer.Ref(), " has no ", kPeerGroupAnnotation, " annotation; add ",
        kPeerGroupAnnotation, "=", owner_group, " to it"));
  }
  *reason = "group_mismatch";
  return absl::PermissionDeniedError(absl::StrCat(
      "pod ", importer.Ref(), " may not import ", what, " of pod ", owner.Ref(), ": pod ",
      importer.Ref(), " is in peer group '", importer_group, "', the exporter in '", owner_group,
      "'; set ", kPeerGroupAnnotation, "=", owner_group, " on ", importer.Ref(),
      " or have the exporter allow it"));
}

}  // namespace podlink
