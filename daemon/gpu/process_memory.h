// Host memory a pod registered as it is (malloc, numpy, bytearray, a pinned
// tensor), with no descriptor to hand over: podlinkd opens the exporting
// process's /proc/<pid>/mem when the range is exported and its relay reads and
// writes the range through that descriptor.
//
// Why that descriptor and not process_vm_readv/writev by pid: the descriptor
// holds the address space the range was registered in. When the process
// exits or execs, that address space is gone and every access fails (EOF or
// EIO) instead of reaching whatever a reused pid or the new program keeps at
// the same address; after a fork it keeps naming the parent's. The kernel
// takes pages for a copy through it in the target's address space, so they are
// charged to the pod's memory cgroup, and a range the process unmapped fails
// the copy (EIO) instead of faulting in podlinkd. Writes through it bypass
// page protection on private mappings, so registration admits only ranges the
// process itself can read and write, checked against /proc/<pid>/maps.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/gpu/memory_object.h"

namespace podlink {

// One line of /proc/<pid>/maps.
struct MapsEntry {
  uint64_t start = 0, end = 0;
  bool read = false, write = false, shared = false;
  std::string path;  // "" for anonymous memory, "[heap]", a file's path...
};

// Parses /proc/<pid>/maps text; INVALID_ARGUMENT on a malformed line.
absl::StatusOr<std::vector<MapsEntry>> ParseMaps(const std::string& text);

// OK when [address, address + size) is covered without a gap by mappings the
// process may read and write, none of them a kernel-provided one ([vvar],
// [vdso], [vsyscall]); otherwise FAILED_PRECONDITION naming the first byte
// that is not (the caller can act: register memory it owns).
absl::Status CheckRangeRegistrable(const std::vector<MapsEntry>& maps, uint64_t address, uint64_t size);

class ProcessMemoryBackend : public MemoryBackend {
 public:
  explicit ProcessMemoryBackend(std::string proc_root = "/proc") : proc_root_(std::move(proc_root)) {}
  // How many sessions' memory descriptors are open (one each, however many
  // ranges a session exports: a NIXL agent registers thousands).
  size_t open_descriptors() const ABSL_LOCKS_EXCLUDED(mu_);
  bool Handles(HandleKind kind) const override { return kind == HandleKind::kProcessMemory; }
  // claim.address/size in process claim.pid (alive through claim.pidfd), of
  // session claim.session (whose exports share one descriptor, opened by the
  // first and closed with the last);
  // `fd` and `fabric_handle` must be empty. Opens the process's memory,
  // checks the range against its maps, reads its first byte of every mapping
  // (a driver's mapping that the kernel cannot copy from fails here, not in
  // a transfer), then checks through the pidfd that the process is still the
  // one named.
  absl::StatusOr<std::shared_ptr<MemoryObject>> Adopt(const ExportClaim& claim, UniqueFd fd,
                                                      const std::string& fabric_handle) override;

 private:
  absl::StatusOr<std::shared_ptr<const UniqueFd>> MemoryOf(const ExportClaim& claim) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string proc_root_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::weak_ptr<const UniqueFd>> by_session_ ABSL_GUARDED_BY(mu_);
};

// Moves n bytes between the daemon's memory and process memory (`mem_fd` at
// `address`), looping over short transfers; FAILED_PRECONDITION when the
// process's range is gone (exited, exec'd, unmapped): `what` (may be empty)
// names it. Nothing is formatted unless it fails (the relay's hot path).
absl::Status ProcessRead(int mem_fd, uint64_t address, void* dst, uint64_t n, absl::string_view what);
absl::Status ProcessWrite(int mem_fd, uint64_t address, const void* src, uint64_t n, absl::string_view what);

}  // namespace podlink
