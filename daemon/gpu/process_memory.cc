#include "daemon/gpu/process_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_util.h"

namespace podlink {

namespace {

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

class ProcessMemoryObject : public MemoryObject {
 public:
  ProcessMemoryObject(std::shared_ptr<const UniqueFd> mem, uint64_t address, uint64_t size, int pid)
      : mem_(std::move(mem)), address_(address), size_(size), pid_(pid) {}
  absl::StatusOr<RelayView> MapForRelay() override {
    return absl::FailedPreconditionError(
        "process memory (registered as it is: malloc, numpy, bytearray) is moved only by this node's relay "
        "between pods; it cannot back a relay ring, cross nodes or be registered with a NIC yet: use podlink's "
        "host allocator (alloc_host) for that");
  }
  absl::StatusOr<RelayView> CopyView() override {
    RelayView v;
    v.address = address_;
    v.size = size_;
    v.mem_fd = mem_->get();
    return v;
  }
  HandleKind kind() const override { return HandleKind::kProcessMemory; }
  absl::StatusOr<UniqueFd> Duplicate() const override {
    return absl::FailedPreconditionError(absl::StrCat(
        "process memory of pid ", pid_, " has no descriptor to share: only podlinkd's relay reaches it"));
  }

 private:
  const std::shared_ptr<const UniqueFd> mem_;  // shared by the session's exports
  const uint64_t address_, size_;
  const int pid_;
};

// One transfer of at most n bytes; -1 with errno, or the count moved.
template <typename Fn>
absl::Status Loop(Fn fn, uint64_t address, uint64_t n, const char* verb, absl::string_view what) {
  uint64_t done = 0;
  while (done < n) {
    ssize_t r = fn(done, n - done, static_cast<off_t>(address + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      // EOF: the address space is gone (exit, exec); EIO/EFAULT: the range
      // is no longer mapped, or not copyable.
      return absl::FailedPreconditionError(absl::StrCat(
          what, what.empty() ? "" : ": ", "podlinkd could not ", verb, " ", n - done, " bytes at ", Hex(address + done),
          " of the exporting process (", r == 0 ? "its address space is gone: it exited or exec'd"
                                                 : absl::StrCat(std::strerror(errno), ": the range was unmapped"),
          ")"));
    }
    done += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ProcessRead(int mem_fd, uint64_t address, void* dst, uint64_t n, absl::string_view what) {
  auto* out = static_cast<char*>(dst);
  return Loop([&](uint64_t at, uint64_t len, off_t off) { return ::pread(mem_fd, out + at, len, off); }, address,
              n, "read", what);
}

absl::Status ProcessWrite(int mem_fd, uint64_t address, const void* src, uint64_t n, absl::string_view what) {
  const auto* in = static_cast<const char*>(src);
  return Loop([&](uint64_t at, uint64_t len, off_t off) { return ::pwrite(mem_fd, in + at, len, off); }, address,
              n, "write", what);
}

absl::StatusOr<std::vector<MapsEntry>> ParseMaps(const std::string& text) {
  std::vector<MapsEntry> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    // start-end perms offset dev inode [path]
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(' ', 5));
    if (f.size() < 5) return absl::InvalidArgumentError(absl::StrCat("malformed maps line: ", line));
    std::pair<absl::string_view, absl::string_view> range = absl::StrSplit(f[0], absl::MaxSplits('-', 1));
    MapsEntry e;
    if (!absl::SimpleHexAtoi(range.first, &e.start) || !absl::SimpleHexAtoi(range.second, &e.end) ||
        e.end <= e.start || f[1].size() != 4) {
      return absl::InvalidArgumentError(absl::StrCat("malformed maps line: ", line));
    }
    e.read = f[1][0] == 'r';
    e.write = f[1][1] == 'w';
    e.shared = f[1][3] == 's';
    if (f.size() == 6) e.path = std::string(absl::StripLeadingAsciiWhitespace(f[5]));
    out.push_back(std::move(e));
  }
  return out;
}

absl::Status CheckRangeRegistrable(const std::vector<MapsEntry>& maps, uint64_t address, uint64_t size) {
  if (size == 0 || address == 0 || address + size < address) {
    return absl::InvalidArgumentError(absl::StrCat("process memory range [", Hex(address), ", +", size,
                                                   ") is empty, null or wraps around"));
  }
  uint64_t at = address;
  const uint64_t end = address + size;
  for (const MapsEntry& e : maps) {  // the kernel lists mappings in address order
    if (e.end <= at) continue;
    if (e.start > at) break;  // a gap
    bool special = !e.path.empty() && e.path.front() == '[' && e.path != "[heap]" && e.path != "[stack]" &&
                   e.path.rfind("[anon", 0) != 0;
    if (!e.read || !e.write || special) {
      return absl::FailedPreconditionError(absl::StrCat(
          "process memory at ", Hex(at), " (", e.path.empty() ? "anonymous" : e.path, ") is not memory the process "
          "can read and write: register buffers it allocated (malloc, numpy, bytearray, a tensor)"));
    }
    at = e.end;
    if (at >= end) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat("process memory range [", Hex(address), ", +", size,
                                                    ") is not mapped at ", Hex(at),
                                                    ": register only memory the process has allocated"));
}

absl::StatusOr<std::shared_ptr<const UniqueFd>> ProcessMemoryBackend::MemoryOf(const ExportClaim& claim) {
  absl::MutexLock l(&mu_);
  if (claim.session != 0) {
    if (auto it = by_session_.find(claim.session); it != by_session_.end()) {
      if (std::shared_ptr<const UniqueFd> held = it->second.lock()) return held;
    }
  }
  const std::string path = absl::StrCat(proc_root_, "/", claim.pid, "/mem");
  int raw = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (raw < 0) return ErrnoStatus(errno, absl::StrCat("open ", path, " (podlinkd needs CAP_SYS_PTRACE)"));
  auto mem = std::make_shared<const UniqueFd>(raw);
  if (claim.session != 0) {
    for (auto it = by_session_.begin(); it != by_session_.end();) {  // sessions whose exports all went
      if (it->second.expired()) {
        it = by_session_.erase(it);
      } else {
        ++it;
      }
    }
    by_session_[claim.session] = mem;
  }
  return mem;
}

size_t ProcessMemoryBackend::open_descriptors() const {
  absl::MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [session, mem] : by_session_) n += !mem.expired();
  return n;
}

absl::StatusOr<std::shared_ptr<MemoryObject>> ProcessMemoryBackend::Adopt(const ExportClaim& claim, UniqueFd fd,
                                                                          const std::string& fabric_handle) {
  if (fd.valid() || !fabric_handle.empty() || !claim.gpu_uuid.empty()) {
    return absl::InvalidArgumentError("a process memory export carries no descriptor, fabric handle or GPU");
  }
  if (claim.pid <= 0 || claim.pidfd < 0) {
    return absl::FailedPreconditionError(
        "process memory needs the exporter pinned by a pidfd (Linux 5.3 or later): register podlink host memory");
  }
  const std::string dir = absl::StrCat(proc_root_, "/", claim.pid);
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<const UniqueFd> mem, MemoryOf(claim));
  std::ifstream in(dir + "/maps");
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", dir, "/maps"));
  PODLINK_ASSIGN_OR_RETURN(std::vector<MapsEntry> maps, ParseMaps(text.str()));
  PODLINK_RETURN_IF_ERROR(CheckRangeRegistrable(maps, claim.address, claim.size));
  // One byte of each mapping in the range, read as a copy would: a driver's
  // mapping (VM_PFNMAP, e.g. cudaHostAlloc's) fails now, with its name.
  const uint64_t end = claim.address + claim.size;
  for (const MapsEntry& e : maps) {
    if (e.end <= claim.address || e.start >= end) continue;
    uint64_t probe = std::max(e.start, claim.address);
    char byte;
    if (absl::Status st = ProcessRead(mem->get(), probe, &byte, 1, "registration");
        !st.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "process memory at ", Hex(probe), " (", e.path.empty() ? "anonymous" : e.path,
          ") cannot be copied by podlinkd (", st.message(), "); a driver's mapping (cudaHostAlloc) is not "
          "supported: register malloc'd memory pinned with cudaHostRegister, or podlink host memory"));
    }
  }
  return std::shared_ptr<MemoryObject>(
      std::make_shared<ProcessMemoryObject>(std::move(mem), claim.address, claim.size, claim.pid));
}

}  // namespace podlink
