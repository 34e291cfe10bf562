// libibverbs, loaded with dlopen (as the CUDA driver is: common/cuda_driver.h)
// so podlinkd builds, starts and runs its TCP mesh on nodes without
// rdma-core, and tests can stand a fake table in for the library.
//
// The data-path calls (post_send, post_recv, poll_cq, req_notify_cq) are
// inline functions of verbs.h that jump through the device context's ops;
// they are in the table too, so a fake can replace them as well.
#pragma once

#include <infiniband/verbs.h>

#include "absl/status/statusor.h"

namespace podlink::mesh::verbs {

struct VerbsApi {
  ibv_device** (*get_device_list)(int*) = nullptr;
  void (*free_device_list)(ibv_device**) = nullptr;
  const char* (*get_device_name)(ibv_device*) = nullptr;
  ibv_context* (*open_device)(ibv_device*) = nullptr;
  int (*close_device)(ibv_context*) = nullptr;
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
  ibv_pd* (*alloc_pd)(ibv_context*) = nullptr;
  int (*dealloc_pd)(ibv_pd*) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int) = nullptr;
  int (*dereg_mr)(ibv_mr*) = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context*) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel*) = nullptr;
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int) = nullptr;
  int (*destroy_cq)(ibv_cq*) = nullptr;
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**) = nullptr;
  void (*ack_cq_events)(ibv_cq*, unsigned) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*) = nullptr;
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int) = nullptr;
  int (*destroy_qp)(ibv_qp*) = nullptr;
  int (*get_async_event)(ibv_context*, ibv_async_event*) = nullptr;
  void (*ack_async_event)(ibv_async_event*) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status) = nullptr;
  const char* (*event_type_str)(ibv_event_type) = nullptr;
  // Inline in verbs.h.
  int (*post_send)(ibv_qp*, ibv_send_wr*, ibv_send_wr**) = nullptr;
  int (*post_recv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**) = nullptr;
  int (*poll_cq)(ibv_cq*, int, ibv_wc*) = nullptr;
  int (*req_notify_cq)(ibv_cq*, int) = nullptr;
  // Optional (rdma-core 34 and later): null where the library lacks it.
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t offset, size_t length, uint64_t iova, int fd, int access) = nullptr;
};

// The process's libibverbs.so.1 (loaded once); FAILED_PRECONDITION when the
// node has no rdma-core.
absl::StatusOr<const VerbsApi*> LoadVerbs();

}  // namespace podlink::mesh::verbs
