#include "daemon/relay/mesh_stager.h"

#include <algorithm>
#include <new>

namespace podlink {

struct MeshStager::Pool {
  explicit Pool(uint64_t keep) : keep_bytes(keep) {}
  const uint64_t keep_bytes;
  std::mutex mu;
  std::multimap<uint64_t, char*> free;  // by size
  uint64_t free_bytes = 0;

  ~Pool() {
    for (auto& [size, p] : free) delete[] p;
  }
  void Give(char* p, uint64_t size) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (free_bytes + size <= keep_bytes) {
        free.emplace(size, p);
        free_bytes += size;
        return;
      }
    }
    delete[] p;
  }
  char* Take(uint64_t size) {
    std::lock_guard<std::mutex> l(mu);
    auto it = free.find(size);
    if (it == free.end()) return nullptr;
    char* p = it->second;
    free.erase(it);
    free_bytes -= size;
    return p;
  }
};

MeshStager::MeshStager(size_t threads, uint64_t keep_bytes) : pool_(std::make_shared<Pool>(keep_bytes)) {
  for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i) threads_.emplace_back([this] { Run(); });
}

MeshStager::~MeshStager() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    jobs_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool MeshStager::Post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stop_) return false;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

uint64_t MeshStager::queued() const {
  std::lock_guard<std::mutex> l(mu_);
  return jobs_.size();
}

std::shared_ptr<char[]> MeshStager::Buffer(uint64_t n) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const uint64_t size = std::max<uint64_t>(kMiB, (n + kMiB - 1) / kMiB * kMiB);
  char* p = pool_->Take(size);
  if (p == nullptr) p = new (std::nothrow) char[size];
  if (p == nullptr) return nullptr;
  std::shared_ptr<Pool> pool = pool_;
  return std::shared_ptr<char[]>(p, [pool, size](char* q) { pool->Give(q, size); });
}

void MeshStager::Run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace podlink
