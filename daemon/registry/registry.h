// The node's exports: who owns each, who imported it, and the daemon's
// reference to the memory. Thread-safe; all state behind one mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/gpu/memory_object.h"
#include "daemon/identity/pod_source.h"
#include "daemon/policy/policy.h"

namespace podlink {

struct ExportRecord {
  uint64_t id = 0;  // assigned by the registry
  std::string name;
  uint64_t size = 0;
  std::string gpu_uuid;
  std::string mesh_affinity;  // host memory: the PCI bus id it is used with (ExportRequest.mesh_affinity)
  HandleKind kind = HandleKind::kHostMemfd;
  uint64_t owner_session = 0;
  PodInfo owner;
  std::vector<PodName> allowed_importers;
  std::shared_ptr<MemoryObject> memory;
  // What the export counts against the limits below: the descriptors
  // podlinkd holds for it (one per cuMem allocation of a chunked export).
  size_t weight = 1;
};

// Counted in export weights (ExportRecord::weight): one per export, one per
// allocation of a chunked GPU export, so the limits bound the descriptors a
// pod makes podlinkd hold.
struct RegistryLimits {
  size_t max_exports_per_session = 16384;  // as many as a pod: NIXL agents register thousands of buffers
  size_t max_exports_per_pod = 16384;  // summed over the pod's sessions (identity key)
  size_t max_exports_total = 65536;
};

// An export that went away, and the sessions that had imported it.
struct RemovedExport {
  std::shared_ptr<const ExportRecord> record;
  std::set<uint64_t> importers;
};

class Registry {
 public:
  explicit Registry(RegistryLimits limits = {}) : limits_(limits) {}

  // Assigns an id. ALREADY_EXISTS when the name is taken in the owner's
  // namespace; RESOURCE_EXHAUSTED past a limit.
  absl::StatusOr<uint64_t> Add(ExportRecord rec) ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<std::shared_ptr<const ExportRecord>> Get(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<const ExportRecord>> FindByName(const std::string& ns,
                                                                 const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The export if `session` owns it or holds an import of it (the relay's
  // check for every request).
  absl::StatusOr<std::shared_ptr<const ExportRecord>> GetUsable(uint64_t id, uint64_t session) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Records that `session` imported export `id`; NOT_FOUND if it is gone.
  // True when the record is new (false: the session had imported it before).
  absl::StatusOr<bool> AddImporter(uint64_t id, uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);

  // The owner withdraws its export; the sessions that had imported it are
  // returned. NOT_FOUND when `owner_session` does not own a live export `id`.
  absl::StatusOr<RemovedExport> ReleaseExport(uint64_t id, uint64_t owner_session) ABSL_LOCKS_EXCLUDED(mu_);
  // `session` drops its record of an import; the export itself is never
  // touched, even when `session` owns it. NOT_FOUND when there is no record.
  absl::Status DropImport(uint64_t id, uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);

  // Everything a closing session owned, and its import records elsewhere.
  std::vector<RemovedExport> RemoveSession(uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);

  struct Entry {
    std::shared_ptr<const ExportRecord> record;
    size_t import_count = 0;
    uint64_t imports_total = 0;
  };
  std::vector<Entry> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Slot {
    std::shared_ptr<const ExportRecord> record;
    std::set<uint64_t> importers;
    uint64_t imports_total = 0;
  };
  // Unlinks an export from every index (names, counts, importers' lists).
  RemovedExport UnlinkLocked(std::map<uint64_t, Slot>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const RegistryLimits limits_;
  mutable absl::Mutex mu_;  // protects everything below
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Slot> exports_ ABSL_GUARDED_BY(mu_);
  // namespace + '\0' + name -> id
  absl::flat_hash_map<std::string, uint64_t> names_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, size_t> per_session_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> per_pod_ ABSL_GUARDED_BY(mu_);  // owner identity key -> exports
  size_t weight_total_ ABSL_GUARDED_BY(mu_) = 0;  // summed weights of every export
  absl::flat_hash_map<uint64_t, std::set<uint64_t>> imports_by_session_ ABSL_GUARDED_BY(mu_);
};

}  // namespace podlink
