#include "daemon/gpu/host_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/string_view.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status_util.h"

namespace podlink {

namespace {

class MemfdObject : public MemoryObject {
 public:
  MemfdObject(UniqueFd fd, uint64_t size, std::shared_ptr<HostPinner> pinner,
             std::shared_ptr<MappingBudget> mappings)
      : fd_(std::move(fd)), size_(size), pinner_(std::move(pinner)), mappings_(std::move(mappings)) {}
  ~MemfdObject() override {
    if (map_ == nullptr) return;
    if (pinned_) pinner_->Unpin(map_);  // before the pages go
    ::munmap(map_, size_);
    if (mappings_ != nullptr) mappings_->Give(size_);
  }
  absl::StatusOr<RelayView> MapForRelay() override {
    absl::MutexLock l(&mu_);
    if (map_ == nullptr) {
      // Pinning faults in every page: holes punched since the export would
      // be allocated on podlinkd's account.
      PODLINK_RETURN_IF_ERROR(CheckPopulated(0, size_));
      if (mappings_ != nullptr) PODLINK_RETURN_IF_ERROR(mappings_->Take(size_));
      void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_.get(), 0);
      if (p == MAP_FAILED) {
        int err = errno;
        if (mappings_ != nullptr) mappings_->Give(size_);
        return ErrnoStatus(err, "mmap export for relay");
      }
      map_ = p;
      if (pinner_ != nullptr) {
        absl::Status st = pinner_->Pin(map_, size_);
        pinned_ = st.ok();
        if (!st.ok()) {
          spdlog::default_logger()->warn(
              "event=host_pin_failed bytes={} error={} msg=\"relay copies use pageable memory\"", size_,
              LogQuoted(st.ToString()));
        }
      }
    }
    return RelayView{false, -1, reinterpret_cast<uint64_t>(map_), size_};
  }
  HandleKind kind() const override { return HandleKind::kHostMemfd; }
  absl::Status CheckPopulated(uint64_t offset, uint64_t length) const override {
    return CheckFullyAllocated(fd_.get());
  }
  absl::StatusOr<UniqueFd> Duplicate() const override {
    int d = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
    if (d < 0) return ErrnoStatus(errno, "dup memfd");
    return UniqueFd(d);
  }

 private:
  UniqueFd fd_;
  const uint64_t size_;
  absl::Mutex mu_;
  void* map_ ABSL_GUARDED_BY(mu_) = nullptr;
  const std::shared_ptr<HostPinner> pinner_;
  const std::shared_ptr<MappingBudget> mappings_;
  bool pinned_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::Status CheckFullyAllocated(int fd) {
  // tmpfs reports fallocated-but-unwritten pages as holes to SEEK_HOLE, so
  // the block count is what tells allocated memory apart: the whole file must
  // be backed (pages swapped out still count).
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "fstat export");
  uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t needed = (size + page - 1) / page * page;
  uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  if (allocated < needed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "host export is not fully allocated (", allocated, " of ", needed,
        " bytes backed: sparse, or pages punched out): podlinkd does not allocate memory on a pod's behalf; "
        "populate the whole memfd (fallocate) and keep it populated"));
  }
  return absl::OkStatus();
}

absl::Status MappingBudget::Take(uint64_t bytes) {
  absl::MutexLock l(&mu_);
  if (bytes > max_bytes_ - used_) {
    return absl::ResourceExhaustedError(absl::StrCat("mapping ", bytes, " more bytes for the relay would pass podlinkd's ",
                                                     "limit of ", max_bytes_, " mapped bytes (", used_, " in use)"));
  }
  used_ += bytes;
  return absl::OkStatus();
}

void MappingBudget::Give(uint64_t bytes) {
  absl::MutexLock l(&mu_);
  used_ -= std::min(used_, bytes);
}

uint64_t MappingBudget::used() const {
  absl::MutexLock l(&mu_);
  return used_;
}

absl::Status BudgetedPinner::Pin(void* p, uint64_t size) {
  {
    absl::MutexLock l(&mu_);
    if (size > max_bytes_ - pinned_) {  // pinned_ <= max_bytes_ always
      return absl::ResourceExhaustedError(absl::StrCat("pinning ", size, " more bytes would pass podlinkd's limit of ",
                                                       max_bytes_, " page-locked bytes (", pinned_, " in use)"));
    }
    pinned_ += size;  // reserved before the slow call, so concurrent pins cannot overshoot
  }
  absl::Status st = inner_->Pin(p, size);
  absl::MutexLock l(&mu_);
  if (st.ok()) {
    sizes_[p] = size;
  } else {
    pinned_ -= size;
  }
  return st;
}

void BudgetedPinner::Unpin(void* p) {
  inner_->Unpin(p);
  absl::MutexLock l(&mu_);
  auto it = sizes_.find(p);
  if (it == sizes_.end()) return;
  pinned_ -= it->second;
  sizes_.erase(it);
}

uint64_t BudgetedPinner::pinned_bytes() const {
  absl::MutexLock l(&mu_);
  return pinned_;
}

absl::StatusOr<std::shared_ptr<MemoryObject>> HostMemfdBackend::Adopt(
    const ExportClaim& claim, UniqueFd fd, const std::string& fabric_handle) {
  if (!claim.gpu_uuid.empty()) {
    return absl::InvalidArgumentError("host-memory export must not name a GPU");
  }
  if (!fd.valid()) return absl::InvalidArgumentError("host-memory export needs a descriptor");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat exported descriptor");
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        "exported descriptor is not a memfd (not a regular file); host exports must be memfds");
  }
  char link[64];
  std::string path = absl::StrCat("/proc/self/fd/", fd.get());
  ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  if (n < 0 || !absl::StartsWith(absl::string_view(link, n), "/memfd:")) {
    return absl::InvalidArgumentError(
        "exported descriptor is not a memfd; host exports must be created with memfd_create");
  }
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (seals < 0 || (seals & kNeeded) != kNeeded) {
    return absl::InvalidArgumentError(
        "memfd is not sealed: seal it with F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL before export "
        "(libpodlink's AllocateHost does) so importers' mappings cannot be truncated");
  }
  if (claim.size == 0) return absl::InvalidArgumentError("export size must be > 0");
  if (static_cast<uint64_t>(st.st_size) < claim.size) {
    return absl::InvalidArgumentError(absl::StrCat("export claims ", claim.size,
                                                   " bytes but the memfd holds only ", st.st_size));
  }
  if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
    return absl::InvalidArgumentError(
        "memfd is sealed against writes (F_SEAL_WRITE or F_SEAL_FUTURE_WRITE): importers and the relay could "
        "not write it; export a writable memfd");
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError("memfd must be open read-write");
  }
  if (absl::Status st = CheckFullyAllocated(fd.get()); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        st.message(), " (libpodlink's AllocateHost populates with fallocate; a sparse export would make podlinkd pay "
        "for the pages)"));
  }
  return std::make_shared<MemfdObject>(std::move(fd), claim.size, pinner_, mappings_);
}

}  // namespace podlink
