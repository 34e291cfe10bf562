// RDMA devices: a NIC opened once, and the set of them.
#include "daemon/mesh/verbs/verbs_internal.h"

namespace podlink::mesh::verbs {
namespace {
const ComponentLog NicLog("mesh");
}  // namespace

// --- devices -----------------------------------------------------------------

Nic::Nic(const VerbsApi* api, ibv_context* ctx, std::string name, uint8_t port, ibv_mtu mtu, bool dmabuf)
    : api_(api), ctx_(ctx), name_(std::move(name)), port_(port), mtu_(mtu), dmabuf_(dmabuf) {
  SetNonBlocking(ctx_->async_fd);
  async_ = std::thread([this] { AsyncLoop(); });
}

Nic::~Nic() {
  stop_.store(true, std::memory_order_release);
  if (async_.joinable()) async_.join();
  api_->close_device(ctx_);
}

absl::StatusOr<std::shared_ptr<Nic>> Nic::Open(const VerbsApi* api, const std::string& device, uint8_t port) {
  int n = 0;
  ibv_device** list = api->get_device_list(&n);
  if (list == nullptr) return Errno("ibv_get_device_list", errno);
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && ctx == nullptr; ++i) {
    if (device == api->get_device_name(list[i])) ctx = api->open_device(list[i]);
  }
  api->free_device_list(list);
  if (ctx == nullptr) {
    return absl::NotFoundError(absl::StrCat("RDMA device ", device, " cannot be opened (libibverbs lists ", n,
                                            " devices; is its provider installed?)"));
  }
  ibv_port_attr pa{};
  if (int rc = api->query_port(ctx, port, &pa)) {
    api->close_device(ctx);
    return Errno("ibv_query_port", rc);
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    api->close_device(ctx);
    return absl::UnavailableError(absl::StrCat("port ", int{port}, " of ", device, " is not active"));
  }
  bool dmabuf = false;
  if (api->reg_dmabuf_mr != nullptr) {
    ibv_pd* pd = api->alloc_pd(ctx);
    if (pd != nullptr) {
      errno = 0;
      ibv_mr* mr = api->reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
      dmabuf = errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
      if (mr != nullptr) api->dereg_mr(mr);
      api->dealloc_pd(pd);
    }
  }
  NicLog()->info("event=verbs_device device={} port={} mtu={} link_layer={} dmabuf={}", device, int{port},
              128 << pa.active_mtu, pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "ethernet" : "infiniband",
              api->reg_dmabuf_mr == nullptr ? "no (libibverbs lacks ibv_reg_dmabuf_mr)" : dmabuf ? "yes" : "no");
  return std::shared_ptr<Nic>(new Nic(api, ctx, device, port, pa.active_mtu, dmabuf));
}

void Nic::AsyncLoop() {
  while (!stop_.load(std::memory_order_acquire)) {
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    ibv_async_event ev{};
    while (api_->get_async_event(ctx_, &ev) == 0) {
      async_events_.fetch_add(1, std::memory_order_relaxed);
      // QP errors also surface as failed completions, where they are
      // handled; a port going down fails every QP on it the same way.
      NicLog()->warn("event=verbs_async device={} type={}", name_, api_->event_type_str(ev.event_type));
      api_->ack_async_event(&ev);
    }
  }
}

absl::StatusOr<std::shared_ptr<Nic>> Nics::Get(const GidChoice& gid) {
  absl::MutexLock l(&mu_);
  auto it = nics_.find(gid.device);
  if (it != nics_.end()) return it->second;
  PODLINK_ASSIGN_OR_RETURN(std::shared_ptr<Nic> nic, Nic::Open(api_, gid.device, gid.port));
  nics_[gid.device] = nic;
  return nic;
}

}  // namespace podlink::mesh::verbs
