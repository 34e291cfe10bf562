// GPU memory moving to or from another node passes through host staging in
// podlinkd (the mesh's links carry host memory). The copies between a GPU and
// its staging run here, on a few threads of their own, never on a relay
// worker (which serves other rings meanwhile) nor on a mesh link's thread
// (which carries other transfers). Each thread copies on its own default
// stream (cuda_driver.h: MemcpyHtoDPerThread), so copies run side by side.
//
// Staging buffers are reused (whole MiB sizes, up to `keep_bytes` kept
// free), so a transfer does not fault in fresh pages every time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/metrics/metrics.h"

namespace podlink {

class MeshStager {
 public:
  MeshStager(size_t threads, uint64_t keep_bytes);
  // Joins the threads; jobs still queued are dropped without running.
  ~MeshStager();
  MeshStager(const MeshStager&) = delete;
  MeshStager& operator=(const MeshStager&) = delete;

  // Runs `job` on a staging thread; false when stopping.
  bool Post(std::function<void()> job);
  // A buffer of at least `n` bytes (nullptr when out of memory); it returns
  // to the pool when the last reference goes, whenever that is.
  std::shared_ptr<char[]> Buffer(uint64_t n);
  // Time of each copy between a GPU and staging.
  LatencyHistogram& copy_latency() { return copy_latency_; }
  uint64_t queued() const;

 private:
  struct Pool;  // shared with the buffers' deleters, which may outlive this
  void Run();

  std::shared_ptr<Pool> pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
  LatencyHistogram copy_latency_;
};

}  // namespace podlink
