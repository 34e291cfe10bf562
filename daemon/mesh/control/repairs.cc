// Repairs: failed paths of peers' link sets, dialed again with backoff.
#include "daemon/mesh/control/repairs.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/log.h"

namespace podlink::mesh {
namespace {
const ComponentLog RepairLog("mesh");
}  // namespace

Repairs::~Repairs() {
  Stop();
  Join();
}

void Repairs::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Repairs::Stop() {
  absl::MutexLock l(&mu_);
  stopping_ = true;
  jobs_.clear();
}

void Repairs::Join() {
  if (thread_.joinable()) thread_.join();
}

size_t Repairs::queued() const {
  absl::MutexLock l(&mu_);
  return jobs_.size();
}

std::function<void(const std::string&)> Repairs::OnDown(const std::shared_ptr<DataLinks>& links, Redo redo,
                                                        const std::vector<Path>& paths) {
  std::map<std::string, Path> by_name;
  for (const Path& path : paths) by_name[PathName(path)] = path;
  std::weak_ptr<DataLinks> weak = links;
  auto shared_redo = std::make_shared<const Redo>(std::move(redo));
  return [this, weak, shared_redo, by_name = std::move(by_name)](const std::string& name) {
    auto it = by_name.find(name);
    if (it == by_name.end()) return;
    Schedule(Job{.links = weak,
                 .redo = shared_redo,
                 .path = it->second,
                 .name = name,
                 .next = absl::Now() + timing_.first,
                 .backoff = timing_.first});
  };
}

void Repairs::Schedule(Job job) {
  // Checked before the lock: a link set's own lock may be held by its caller,
  // and this lock is a leaf.
  std::shared_ptr<DataLinks> links = job.links.lock();
  const bool whole_path = links != nullptr && links->RepairsWholePath();
  links.reset();
  absl::MutexLock l(&mu_);
  if (stopping_ || jobs_.size() >= timing_.max_queued) return;
  // A repair that replaces every part of its path that failed by then (verbs:
  // the path's QPs) is queued once per path; a TCP repair is one connection
  // each.
  if (whole_path) {
    for (const Job& other : jobs_) {
      if (other.name == job.name && !other.links.owner_before(job.links) && !job.links.owner_before(other.links)) {
        return;
      }
    }
  }
  jobs_.push_back(std::move(job));
}

void Repairs::Loop() {
  for (;;) {
    std::vector<Job> due;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_) return true;
        absl::Time now = absl::Now();
        return std::any_of(jobs_.begin(), jobs_.end(), [now](const Job& j) { return j.next <= now; });
      };
      // Wakes for new work (the lock released), for the next due repair, and to look at stopping_.
      mu_.AwaitWithTimeout(absl::Condition(&ready), timing_.tick);
      if (stopping_) return;
      absl::Time now = absl::Now();
      for (auto it = jobs_.begin(); it != jobs_.end();) {
        if (it->next <= now) {
          due.push_back(std::move(*it));
          it = jobs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Job& job : due) {
      std::shared_ptr<DataLinks> links = job.links.lock();
      // Gone, or the whole peer is down (the next open dials it again).
      if (links == nullptr || links->live() == 0) continue;
      absl::Status st = (*job.redo)(job.path, job.name);
      if (st.ok()) {
        RepairLog()->info("event=mesh_connection_repaired path={} connections={}", job.name, links->live());
        repaired_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      job.backoff = std::min(job.backoff * 2, timing_.most);
      job.next = absl::Now() + job.backoff;
      links.reset();
      Schedule(std::move(job));
    }
  }
}

}  // namespace podlink::mesh
