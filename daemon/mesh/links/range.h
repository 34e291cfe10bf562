// A byte range of a region, checked without overflow: every check of a peer's
// or a pod's offset and length against the size of what they address (a
// region, an export, a relay's grant, a sealed window) is this one.
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace podlink::mesh {

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;

  bool Within(uint64_t size) const { return offset <= size && length <= size - offset; }
  // OUT_OF_RANGE "range [offset, +length) exceeds <what> of <size> bytes"
  // unless it lies within `size` bytes.
  absl::Status CheckIn(uint64_t size, absl::string_view what = "the region") const {
    if (Within(size)) return absl::OkStatus();
    return Exceeds(size, what);
  }
  // The same for a range that must hold at least one byte (OUT_OF_RANGE too).
  absl::Status CheckNonEmptyIn(uint64_t size, absl::string_view what = "the region") const {
    if (length != 0 && Within(size)) return absl::OkStatus();
    return Exceeds(size, what);
  }

 private:
  absl::Status Exceeds(uint64_t size, absl::string_view what) const {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", +", length, ") exceeds ", what, " of ", size,
                                              " bytes"));
  }
};

}  // namespace podlink::mesh
