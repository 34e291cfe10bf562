#include "daemon/registry/registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace podlink {
namespace {
std::string NameKey(const std::string& ns, const std::string& name) {
  return absl::StrCat(ns, std::string(1, '\0'), name);
}
}  // namespace

absl::StatusOr<uint64_t> Registry::Add(ExportRecord rec) {
  absl::MutexLock l(&mu_);
  const size_t w = std::max<size_t>(rec.weight, 1);
  size_t& mine = per_session_[rec.owner_session];
  if (mine + w > limits_.max_exports_per_session) {
    if (mine == 0) per_session_.erase(rec.owner_session);
    return absl::ResourceExhaustedError(absl::StrCat(
        "this session already holds ", mine, " of its ", limits_.max_exports_per_session,
        " exports (the per-session limit; a GPU export of several cuMem allocations counts each); release some "
        "first"));
  }
  auto pod = per_pod_.find(rec.owner.key);
  if ((pod == per_pod_.end() ? 0 : pod->second) + w > limits_.max_exports_per_pod) {
    if (mine == 0) per_session_.erase(rec.owner_session);
    return absl::ResourceExhaustedError(absl::StrCat("pod ", rec.owner.Ref(), " already holds ",
                                                     limits_.max_exports_per_pod,
                                                     " exports (the per-pod limit); release some first"));
  }
  if (weight_total_ + w > limits_.max_exports_total) {
    if (mine == 0) per_session_.erase(rec.owner_session);
    return absl::ResourceExhaustedError(
        absl::StrCat("the node holds ", limits_.max_exports_total, " exports (the daemon's limit)"));
  }
  if (!rec.name.empty()) {
    std::string key = NameKey(rec.owner.namespace_, rec.name);
    if (names_.contains(key)) {
      if (mine == 0) per_session_.erase(rec.owner_session);
      return absl::AlreadyExistsError(absl::StrCat("an export named '", rec.name,
                                                   "' already exists in namespace ",
                                                   rec.owner.namespace_, "; choose another name"));
    }
    names_[key] = next_id_;
  }
  rec.id = next_id_++;
  rec.weight = w;
  mine += w;
  per_pod_[rec.owner.key] += w;
  weight_total_ += w;
  uint64_t id = rec.id;
  exports_[id].record = std::make_shared<const ExportRecord>(std::move(rec));
  return id;
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> Registry::Get(uint64_t id) const {
  absl::MutexLock l(&mu_);
  auto it = exports_.find(id);
  if (it == exports_.end()) {
    return absl::NotFoundError(absl::StrCat("no export with id ", id, " (never existed or already gone)"));
  }
  return it->second.record;
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> Registry::FindByName(const std::string& ns,
                                                                         const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = names_.find(NameKey(ns, name));
  if (it == names_.end()) {
    return absl::NotFoundError(absl::StrCat("no export named '", name, "' in namespace ", ns));
  }
  return exports_.at(it->second).record;
}

absl::StatusOr<std::shared_ptr<const ExportRecord>> Registry::GetUsable(uint64_t id, uint64_t session) const {
  absl::MutexLock l(&mu_);
  auto it = exports_.find(id);
  if (it == exports_.end()) {
    return absl::NotFoundError(absl::StrCat("no export with id ", id, " (never existed or already gone)"));
  }
  if (it->second.record->owner_session != session && !it->second.importers.contains(session)) {
    return absl::PermissionDeniedError(
        absl::StrCat("export ", id, " is neither this session's nor imported by it: Import it first"));
  }
  return it->second.record;
}

absl::StatusOr<bool> Registry::AddImporter(uint64_t id, uint64_t session) {
  absl::MutexLock l(&mu_);
  auto it = exports_.find(id);
  if (it == exports_.end()) return absl::NotFoundError(absl::StrCat("export ", id, " is gone"));
  bool added = it->second.importers.insert(session).second;
  ++it->second.imports_total;
  imports_by_session_[session].insert(id);
  return added;
}

RemovedExport Registry::UnlinkLocked(std::map<uint64_t, Slot>::iterator it) {
  Slot& slot = it->second;
  for (uint64_t imp : slot.importers) {
    auto s = imports_by_session_.find(imp);
    if (s != imports_by_session_.end()) {
      s->second.erase(it->first);
      if (s->second.empty()) imports_by_session_.erase(s);
    }
  }
  const ExportRecord& rec = *slot.record;
  if (!rec.name.empty()) names_.erase(NameKey(rec.owner.namespace_, rec.name));
  if ((per_session_[rec.owner_session] -= rec.weight) == 0) per_session_.erase(rec.owner_session);
  if ((per_pod_[rec.owner.key] -= rec.weight) == 0) per_pod_.erase(rec.owner.key);
  weight_total_ -= rec.weight;
  RemovedExport out{std::move(slot.record), std::move(slot.importers)};
  exports_.erase(it);
  return out;
}

absl::StatusOr<RemovedExport> Registry::ReleaseExport(uint64_t id, uint64_t owner_session) {
  absl::MutexLock l(&mu_);
  auto it = exports_.find(id);
  if (it == exports_.end() || it->second.record->owner_session != owner_session) {
    return absl::NotFoundError(absl::StrCat(
        "nothing to release: this session owns no export ", id, " (already released, or not its own)"));
  }
  return UnlinkLocked(it);
}

absl::Status Registry::DropImport(uint64_t id, uint64_t session) {
  absl::MutexLock l(&mu_);
  auto it = exports_.find(id);
  if (it == exports_.end() || it->second.importers.erase(session) == 0) {
    return absl::NotFoundError(
        absl::StrCat("nothing to drop: this session holds no import of export ", id, " (already dropped?)"));
  }
  auto s = imports_by_session_.find(session);
  if (s != imports_by_session_.end()) {
    s->second.erase(id);
    if (s->second.empty()) imports_by_session_.erase(s);
  }
  return absl::OkStatus();
}

std::vector<RemovedExport> Registry::RemoveSession(uint64_t session) {
  absl::MutexLock l(&mu_);
  std::vector<RemovedExport> out;
  if (auto s = imports_by_session_.find(session); s != imports_by_session_.end()) {
    for (uint64_t id : s->second) {
      auto it = exports_.find(id);
      if (it != exports_.end()) it->second.importers.erase(session);
    }
    imports_by_session_.erase(s);
  }
  if (!per_session_.contains(session)) return out;
  for (auto it = exports_.begin(); it != exports_.end();) {
    auto next = std::next(it);
    if (it->second.record->owner_session == session) out.push_back(UnlinkLocked(it));
    it = next;
  }
  return out;
}

std::vector<Registry::Entry> Registry::Snapshot() const {
  absl::MutexLock l(&mu_);
  std::vector<Entry> out;
  out.reserve(exports_.size());
  for (const auto& [id, slot] : exports_) out.push_back({slot.record, slot.importers.size(), slot.imports_total});
  return out;
}

size_t Registry::size() const {
  absl::MutexLock l(&mu_);
  return exports_.size();
}

}  // namespace podlink
