// The standard Prometheus process metrics (process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_start_time_seconds) of this
// process, read from /proc/self.
#pragma once

#include <string>

namespace podlink {

std::string RenderProcessMetrics();

}  // namespace podlink
