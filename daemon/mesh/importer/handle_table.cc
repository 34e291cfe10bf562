#include "daemon/mesh/importer/handle_table.h"

#include "absl/strings/str_cat.h"
#include "daemon/relay/mesh_port.h"

namespace podlink::mesh {

absl::StatusOr<uint64_t> HandleTable::Add(Handle h) {
  absl::MutexLock l(&mu_);
  if (closed_) return absl::UnavailableError("podlinkd is stopping");
  uint32_t& held = per_session_held_[h.session];
  if (held >= per_session_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this session holds ", per_session_, " remote regions (the limit)"));
  }
  ++held;
  const uint64_t id = kRemoteHandleBit | next_++;
  handles_.emplace(id, std::move(h));
  return id;
}

std::optional<Handle> HandleTable::Find(uint64_t session, uint64_t handle) const {
  absl::MutexLock l(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.session != session) return std::nullopt;
  return it->second;
}

std::optional<Handle> HandleTable::Remove(uint64_t session, uint64_t handle) {
  absl::MutexLock l(&mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end() || it->second.session != session) return std::nullopt;
  if (auto c = per_session_held_.find(session); c != per_session_held_.end() && --c->second == 0) {
    per_session_held_.erase(c);
  }
  return std::move(handles_.extract(it).mapped());
}

std::vector<uint64_t> HandleTable::OfSession(uint64_t session) const {
  absl::MutexLock l(&mu_);
  std::vector<uint64_t> out;
  for (const auto& [id, h] : handles_) {
    if (h.session == session) out.push_back(id);
  }
  return out;
}

bool HandleTable::AttachTwoHop(uint64_t session, uint64_t handle, std::shared_ptr<TwoHop> route) {
  absl::MutexLock l(&mu_);
  auto it = handles_.find(handle);
  if (closed_ || it == handles_.end() || it->second.session != session || it->second.two_hop != nullptr) {
    return false;
  }
  it->second.two_hop = std::move(route);
  return true;
}

std::vector<std::shared_ptr<Peer>> HandleTable::Peers() const {
  absl::MutexLock l(&mu_);
  std::vector<std::shared_ptr<Peer>> out;
  for (const auto& [id, h] : handles_) {
    out.push_back(h.peer);
    if (h.two_hop != nullptr) out.push_back(h.two_hop->peer);
  }
  return out;
}

std::vector<Handle> HandleTable::All() const {
  absl::MutexLock l(&mu_);
  std::vector<Handle> out;
  out.reserve(handles_.size());
  for (const auto& [id, h] : handles_) out.push_back(h);
  return out;
}

size_t HandleTable::size() const {
  absl::MutexLock l(&mu_);
  return handles_.size();
}

std::map<uint64_t, Handle> HandleTable::Close() {
  absl::MutexLock l(&mu_);
  closed_ = true;
  std::map<uint64_t, Handle> all;
  all.swap(handles_);
  per_session_held_.clear();
  return all;
}

}  // namespace podlink::mesh
