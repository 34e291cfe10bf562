#include "daemon/registry/registry.h"

#include "absl/strings/str_cat.h"

namespace podlink {
namespace {
std::string NameKey(const std::string& ns, const std::string& name) {
  return absl::StrCat(ns, std::string(1, '\0'), name);
}
}  // namespace

absl::StatusOr<uint64_t> Registry::Add(ExportRecord rec) {
  absl::MutexLock l(&mu_);
  size_t& mine = per_session_[rec.owner_session];
  if (mine >= limits_.max_exports_per_session) {
    if (mine == 0) per_session_.erase(rec.owner_session);
    return absl::ResourceExhaustedError(absl::StrCat(
        "this session already holds ", limits_.max_exports_per_session,
        " exports (the per-session limit); release some first"));
  }
  if (exports_.size() >= limits_.max_exports_total) {
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
  ++mine;
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

absl::Status Registry::AddImporter(uint64_t id, uint64_t session) {
  absl::MutexLock l(&mu_);
  auto it = exports_.find(id);
  if (it == exports_.end()) return absl::NotFoundError(absl::StrCat("export ", id, " is gone"));
  it->second.importers.insert(session);
  ++it->second.imports_total;
  imports_by_session_[session].insert(id);
  return absl::OkStatus();
}

absl::StatusOr<Registry::Released> Registry::Release(uint64_t id, uint64_t session,
                                                     RemovedExport* removed) {
  absl::MutexLock l(&mu_);
  auto it = exports_.find(id);
  if (it == exports_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "nothing to release: export ", id, " does not exist (already released, or its owner exited)"));
  }
  Slot& slot = it->second;
  if (slot.record->owner_session == session) {
    for (uint64_t imp : slot.importers) {
      auto s = imports_by_session_.find(imp);
      if (s != imports_by_session_.end()) {
        s->second.erase(id);
        if (s->second.empty()) imports_by_session_.erase(s);
      }
    }
    if (!slot.record->name.empty()) {
      names_.erase(NameKey(slot.record->owner.namespace_, slot.record->name));
    }
    if (--per_session_[session] == 0) per_session_.erase(session);
    removed->record = std::move(slot.record);
    removed->importers = std::move(slot.importers);
    exports_.erase(it);
    return Released::kExport;
  }
  if (slot.importers.erase(session) > 0) {
    auto s = imports_by_session_.find(session);
    if (s != imports_by_session_.end()) {
      s->second.erase(id);
      if (s->second.empty()) imports_by_session_.erase(s);
    }
    return Released::kImport;
  }
  return absl::NotFoundError(absl::StrCat(
      "nothing to release: this session neither owns nor imported export ", id,
      " (already released?)"));
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
    if (it->second.record->owner_session != session) {
      ++it;
      continue;
    }
    Slot& slot = it->second;
    for (uint64_t imp : slot.importers) {
      auto s = imports_by_session_.find(imp);
      if (s != imports_by_session_.end()) {
        s->second.erase(it->first);
        if (s->second.empty()) imports_by_session_.erase(s);
      }
    }
    if (!slot.record->name.empty()) {
      names_.erase(NameKey(slot.record->owner.namespace_, slot.record->name));
    }
    out.push_back({std::move(slot.record), std::move(slot.importers)});
    it = exports_.erase(it);
  }
  per_session_.erase(session);
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
