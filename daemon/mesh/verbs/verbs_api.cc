#include "daemon/mesh/verbs/verbs_api.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace podlink::mesh::verbs {
namespace {

int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) { return ibv_post_send(qp, wr, bad); }
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); }
int PollCq(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }
int ReqNotifyCq(ibv_cq* cq, int solicited) { return ibv_req_notify_cq(cq, solicited); }

absl::StatusOr<VerbsApi> Load() {
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RDMA verbs not available (dlopen libibverbs.so.1: ", dlerror(), "); install rdma-core / ibverbs-providers"));
  }
  VerbsApi v;
  absl::Status missing;
  auto get = [&](auto& out, const char* name) {
    out = reinterpret_cast<std::remove_reference_t<decltype(out)>>(dlsym(lib, name));
    if (out == nullptr && missing.ok()) {
      missing = absl::FailedPreconditionError(absl::StrCat("libibverbs.so.1 lacks ", name));
    }
  };
  get(v.get_device_list, "ibv_get_device_list");
  get(v.free_device_list, "ibv_free_device_list");
  get(v.get_device_name, "ibv_get_device_name");
  get(v.open_device, "ibv_open_device");
  get(v.close_device, "ibv_close_device");
  get(v.query_port, "ibv_query_port");
  get(v.alloc_pd, "ibv_alloc_pd");
  get(v.dealloc_pd, "ibv_dealloc_pd");
  get(v.reg_mr, "ibv_reg_mr");
  get(v.dereg_mr, "ibv_dereg_mr");
  get(v.create_comp_channel, "ibv_create_comp_channel");
  get(v.destroy_comp_channel, "ibv_destroy_comp_channel");
  get(v.create_cq, "ibv_create_cq");
  get(v.destroy_cq, "ibv_destroy_cq");
  get(v.get_cq_event, "ibv_get_cq_event");
  get(v.ack_cq_events, "ibv_ack_cq_events");
  get(v.create_qp, "ibv_create_qp");
  get(v.modify_qp, "ibv_modify_qp");
  get(v.destroy_qp, "ibv_destroy_qp");
  get(v.get_async_event, "ibv_get_async_event");
  get(v.ack_async_event, "ibv_ack_async_event");
  get(v.wc_status_str, "ibv_wc_status_str");
  get(v.event_type_str, "ibv_event_type_str");
  if (!missing.ok()) return missing;
  v.reg_dmabuf_mr = reinterpret_cast<decltype(v.reg_dmabuf_mr)>(dlsym(lib, "ibv_reg_dmabuf_mr"));
  v.post_send = PostSend;
  v.post_recv = PostRecv;
  v.poll_cq = PollCq;
  v.req_notify_cq = ReqNotifyCq;
  return v;
}

}  // namespace

absl::StatusOr<const VerbsApi*> LoadVerbs() {
  static const absl::StatusOr<VerbsApi>* loaded = new absl::StatusOr<VerbsApi>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace podlink::mesh::verbs
