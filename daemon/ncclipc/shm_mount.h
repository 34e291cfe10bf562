// One /dev/shm per peer group in NCCL native mode: NCCL chooses its P2P
// transport between two ranks of one host only when their /dev/shm is the
// same filesystem (it compares st_dev), so the group's pods share a tmpfs of
// its own, size-bounded, that podlinkd mounts over each member's /dev/shm.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace podlink::ncclipc {

// A tmpfs of `size_bytes` mounted at `dir` (made if missing) unless one is
// there already; returns its device number.
absl::StatusOr<dev_t> EnsureTmpfs(const std::string& dir, uint64_t size_bytes);

// Unmounts (lazily: members keep their mounts) and removes `dir`.
void RemoveTmpfs(const std::string& dir);

// Mounts `source_dir` (a mount point in podlinkd's mount namespace) over
// `target` in the mount namespace of process `pid`, from a child process
// (setns into a mount namespace needs a single-threaded caller). `target` is
// resolved inside that namespace and must be a directory there.
absl::Status MountInto(pid_t pid, const std::string& source_dir, const std::string& target);

// The device number of `path` as process `pid` sees it (/proc/<pid>/root).
absl::StatusOr<dev_t> DeviceSeenBy(pid_t pid, const std::string& path);

}  // namespace podlink::ncclipc
