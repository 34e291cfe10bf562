#include "daemon/mesh/routing/advert_book.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "common/log.h"
#include "daemon/mesh/trust/origin_sign.h"
#include "daemon/mesh/routing/routes.h"

namespace podlink::mesh {
namespace {
const ComponentLog Log("mesh");
}  // namespace

namespace pb = podlink::mesh::v1;

void AdvertBook::SawNeighbour(const std::string& node, const std::string& address) {
  absl::MutexLock l(&mu_);
  if (!neighbours_.contains(node)) {
    if (neighbours_.size() >= kMaxNeighbours) return;
    Log()->info("event=mesh_neighbour node={} address={}", node, address);
    // Said in this node's advert, and traded, at the next housekeeping.
    own_signed_ = absl::InfinitePast();
    traded_ = absl::InfinitePast();
  }
  neighbours_[node] = absl::Now();
}

bool AdvertBook::OwnDue() {
  absl::MutexLock l(&mu_);
  if (absl::Now() - own_signed_ < interval_) return false;
  own_signed_ = absl::Now();
  return true;
}

pb::AdvertEntry AdvertBook::OwnEntry() {
  pb::AdvertEntry entry;
  absl::MutexLock l(&mu_);
  const absl::Time recent = absl::Now() - kLifetimes * interval_;
  for (auto it = neighbours_.begin(); it != neighbours_.end();) {
    if (it->second < recent) {
      it = neighbours_.erase(it);
      continue;
    }
    if (entry.neighbours_size() < static_cast<int>(kMaxNeighbours)) entry.add_neighbours(it->first);
    ++it;
  }
  entry.set_issued_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  return entry;
}

void AdvertBook::SetOwn(pb::NodeAdvert signed_advert, const pb::AdvertEntry& entry) {
  Stored own;
  own.advert = std::move(signed_advert);
  own.issued = entry.issued_unix_seconds();
  own.neighbours.insert(entry.neighbours().begin(), entry.neighbours().end());
  const int64_t oldest = Oldest(own.issued);
  absl::MutexLock l(&mu_);
  adverts_[self_] = std::move(own);
  for (auto it = adverts_.begin(); it != adverts_.end();) {
    it = it->second.issued < oldest ? adverts_.erase(it) : std::next(it);  // stale: its node went quiet
  }
}

bool AdvertBook::TradeDue() {
  absl::MutexLock l(&mu_);
  if (absl::Now() - traded_ < interval_) return false;
  traded_ = absl::Now();
  return true;
}

std::vector<AdvertBook::Learned> AdvertBook::Accept(const std::string& from,
                                                    const google::protobuf::RepeatedPtrField<pb::NodeAdvert>& adverts,
                                                    const Verify& verify) {
  std::vector<Learned> learned;
  if (adverts.empty()) return learned;
  const absl::Time now = absl::Now();
  const int64_t now_s = absl::ToUnixSeconds(now);
  const int64_t oldest = Oldest(now_s);
  {
    // Verifying costs a signature check per advert: one batch per sender a second.
    absl::MutexLock l(&mu_);
    auto it = from_.find(from);
    if (it != from_.end() && now - it->second < absl::Seconds(1)) return learned;
    if (it == from_.end() && from_.size() >= kMaxSenders) return learned;
    from_[from] = now;
  }
  uint64_t refused = 0;
  int n = 0;
  for (const pb::NodeAdvert& a : adverts) {
    if (++n > static_cast<int>(kMaxAdvertsPerMessage)) break;
    pb::AdvertEntry entry;
    if (a.entry().size() > kMaxAdvertEntry || a.cert().size() > kMaxCertPem || a.signature().size() > kMaxSignature ||
        !entry.ParseFromString(a.entry())) {
      ++refused;
      continue;
    }
    const std::string& node = entry.node().node();
    const int64_t issued = entry.issued_unix_seconds();
    if (!ValidNodeName(node) || issued < oldest || issued > now_s + 60) {
      refused += ValidNodeName(node) ? 0 : 1;  // stale or early: simply not new
      continue;
    }
    if (node == self_) continue;  // this node's word about itself is its own
    {
      absl::MutexLock l(&mu_);
      auto it = adverts_.find(node);
      if (it != adverts_.end() && it->second.issued >= issued) continue;  // known already: no check again
      if (it == adverts_.end() && adverts_.size() >= kMaxAdverts) continue;
    }
    if (absl::Status st = verify(a, node); !st.ok()) {
      Log()->warn("event=mesh_advert_refused from={} node={} why={}", from, node, LogQuoted(st.message()));
      ++refused;
      continue;
    }
    bool first = false;
    {
      absl::MutexLock l(&mu_);
      auto [it, fresh] = adverts_.try_emplace(node);
      if (!fresh && it->second.issued >= issued) continue;  // a newer one came in meanwhile
      if (fresh && adverts_.size() > kMaxAdverts) {  // others filled the book meanwhile
        adverts_.erase(it);
        continue;
      }
      Stored& s = it->second;
      first = s.issued == 0;
      s.advert = a;
      s.issued = issued;
      std::set<std::string> said;
      for (const std::string& nb : entry.neighbours()) {
        if (said.size() >= kMaxNeighbours) break;
        if (ValidNodeName(nb)) said.insert(nb);
      }
      if (said != s.neighbours) {
        Log()->info("event=mesh_node_neighbours node={} neighbours={}", node, LogQuoted(absl::StrJoin(said, ",")));
        s.neighbours = std::move(said);
      }
    }
    // Said by the node itself, whoever passed it on: routes may go through it.
    learned.push_back(Learned{node, {entry.node().addresses().begin(), entry.node().addresses().end()},
                              entry.node().port(), first});
  }
  if (refused > 0) {
    absl::MutexLock l(&mu_);
    refused_ += refused;
  }
  return learned;
}

void AdvertBook::AddTo(google::protobuf::RepeatedPtrField<pb::NodeAdvert>* out) const {
  const int64_t oldest = Oldest(absl::ToUnixSeconds(absl::Now()));
  absl::MutexLock l(&mu_);
  std::vector<const Stored*> others;
  for (const auto& [node, s] : adverts_) {
    if (node == self_) continue;
    if (s.issued >= oldest) others.push_back(&s);
  }
  std::sort(others.begin(), others.end(), [](const Stored* a, const Stored* b) { return a->issued > b->issued; });
  if (auto own = adverts_.find(self_); own != adverts_.end()) *out->Add() = own->second.advert;
  for (const Stored* s : others) {
    if (static_cast<size_t>(out->size()) >= kMaxAdvertsPerMessage) break;
    *out->Add() = s->advert;
  }
}

std::set<std::pair<std::string, std::string>> AdvertBook::Confirmed() const {
  std::set<std::pair<std::string, std::string>> out;
  absl::MutexLock l(&mu_);
  for (const auto& [node, s] : adverts_) {
    for (const std::string& nb : s.neighbours) {
      auto other = adverts_.find(nb);
      if (nb != node && other != adverts_.end() && other->second.neighbours.contains(node)) {
        out.insert(node < nb ? std::make_pair(node, nb) : std::make_pair(nb, node));
      }
    }
  }
  return out;
}

int64_t AdvertBook::IssuedOf(const std::string& node) const {
  absl::MutexLock l(&mu_);
  auto it = adverts_.find(node);
  return it == adverts_.end() ? -1 : it->second.issued;
}

size_t AdvertBook::size() const {
  absl::MutexLock l(&mu_);
  return adverts_.size();
}

uint64_t AdvertBook::refused() const {
  absl::MutexLock l(&mu_);
  return refused_;
}

}  // namespace podlink::mesh
