#include "daemon/ncclipc/shm_mount.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "common/unique_fd.h"

// From <linux/mount.h> (not included: it clashes with <sys/mount.h> on glibc 2.36).
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif

namespace podlink::ncclipc {

absl::StatusOr<dev_t> EnsureTmpfs(const std::string& dir, uint64_t size_bytes) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoStatus(errno, absl::StrCat("mkdir ", dir));
  struct stat here {}, parent {};
  if (::stat(dir.c_str(), &here) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
  if (::stat((dir + "/..").c_str(), &parent) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir, "/.."));
  if (here.st_dev != parent.st_dev) return here.st_dev;  // mounted already
  std::string opts = absl::StrCat("size=", size_bytes, ",mode=1777");
  if (::mount("podlink-nccl-shm", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("mount tmpfs on ", dir));
  }
  if (::stat(dir.c_str(), &here) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
  return here.st_dev;
}

void RemoveTmpfs(const std::string& dir) {
  ::umount2(dir.c_str(), MNT_DETACH);
  ::rmdir(dir.c_str());
}

absl::Status MountInto(pid_t pid, const std::string& source_dir, const std::string& target) {
  int tree = static_cast<int>(::syscall(SYS_open_tree, AT_FDCWD, source_dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  if (tree < 0) return ErrnoStatus(errno, absl::StrCat("open_tree ", source_dir));
  UniqueFd tree_fd(tree);
  UniqueFd mntns(::open(absl::StrCat("/proc/", pid, "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC));
  if (!mntns) return ErrnoStatus(errno, "open the pod's mount namespace");
  const char* where = target.c_str();
  pid_t child = ::fork();
  if (child < 0) return ErrnoStatus(errno, "fork");
  if (child == 0) {
    // Only system calls from here on (the parent has other threads).
    if (::setns(mntns.get(), CLONE_NEWNS) != 0) ::_exit(100 + (errno & 0x7f) % 100);
    if (::syscall(SYS_move_mount, tree_fd.get(), "", AT_FDCWD, where, MOVE_MOUNT_F_EMPTY_PATH) != 0) {
      ::_exit(errno & 0x7f);
    }
    ::_exit(0);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status)) return absl::InternalError("mount helper died");
  int code = WEXITSTATUS(status);
  if (code == 0) return absl::OkStatus();
  if (code >= 100) return ErrnoStatus(code - 100, "setns into the pod's mount namespace");
  return ErrnoStatus(code, absl::StrCat("mount over ", target, " in the pod"));
}

absl::StatusOr<dev_t> DeviceSeenBy(pid_t pid, const std::string& path) {
  struct stat st {};
  std::string p = absl::StrCat("/proc/", pid, "/root", path);
  if (::stat(p.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path, " in the pod"));
  return st.st_dev;
}

}  // namespace podlink::ncclipc
