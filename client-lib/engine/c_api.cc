// The C API over podlink::Client. No exception crosses this boundary.
#include "podlink/podlink.h"

#include <cstring>
#include <deque>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

struct podlink_client {
  std::unique_ptr<podlink::Client> client;
};
struct podlink_buffer {
  std::unique_ptr<podlink::HostBuffer> host;
  std::unique_ptr<podlink::GpuBuffer> gpu;
};
struct podlink_mapping {
  std::unique_ptr<podlink::Mapping> mapping;
};
struct podlink_engine {
  std::unique_ptr<podlink::TransferEngine> engine;
  std::deque<podlink::Notification> notifications;  // polled, not yet taken
};
struct podlink_region {
  podlink::LocalRegion region;
};
struct podlink_remote {
  podlink::RemoteRegion region;
};

namespace {

thread_local std::string g_last_error;

int Fail(const absl::Status& s) {
  g_last_error = std::string(s.message());
  return static_cast<int>(s.code());
}

template <typename Fn>
int Guard(Fn fn) {
  try {
    g_last_error.clear();
    return fn();
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return static_cast<int>(absl::StatusCode::kInternal);
  } catch (...) {
    g_last_error = "internal error";
    return static_cast<int>(absl::StatusCode::kInternal);
  }
}

absl::StatusOr<podlink::ExportOptions> ParseOptions(const char* name, const char* allowed) {
  podlink::ExportOptions o;
  if (name != nullptr) o.name = name;
  if (allowed != nullptr) {
    for (absl::string_view item : absl::StrSplit(allowed, ',', absl::SkipWhitespace())) {
      std::vector<std::string> parts = absl::StrSplit(item, '/');
      if (parts.size() != 2) {
        return absl::InvalidArgumentError(
            std::string("allowed importer '") + std::string(item) + "' is not namespace/name");
      }
      o.allowed_importers.push_back({parts[0], parts[1]});
    }
  }
  return o;
}

}  // namespace

extern "C" {

int podlink_abi_version(void) { return PODLINK_ABI_VERSION; }
const char* podlink_last_error(void) { return g_last_error.c_str(); }

int podlink_connect(const char* socket_dir, podlink_client_t** out) {
  return Guard([&] {
    if (out == nullptr) return Fail(absl::InvalidArgumentError("out is NULL"));
    podlink::ConnectOptions o;
    if (socket_dir != nullptr) o.socket_dir = socket_dir;
    auto c = podlink::Client::Connect(o);
    if (!c.ok()) return Fail(c.status());
    *out = new podlink_client{*std::move(c)};
    return 0;
  });
}

void podlink_disconnect(podlink_client_t* client) { delete client; }

int podlink_alloc(podlink_client_t* client, int device, size_t size, podlink_buffer_t** out) {
  return Guard([&] {
    if (client == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
    auto b = std::make_unique<podlink_buffer>();
    if (device < 0) {
      auto h = client->client->AllocateHost(size);
      if (!h.ok()) return Fail(h.status());
      b->host = *std::move(h);
    } else {
      auto g = client->client->AllocateGpu(size, device);
      if (!g.ok()) return Fail(g.status());
      b->gpu = *std::move(g);
    }
    *out = b.release();
    return 0;
  });
}

void* podlink_buffer_host_ptr(const podlink_buffer_t* b) { return b && b->host ? b->host->data() : nullptr; }
uint64_t podlink_buffer_device_ptr(const podlink_buffer_t* b) { return b && b->gpu ? b->gpu->device_ptr() : 0; }
size_t podlink_buffer_size(const podlink_buffer_t* b) {
  if (b == nullptr) return 0;
  return b->host ? b->host->size() : (b->gpu ? b->gpu->size() : 0);
}
void podlink_free(podlink_buffer_t* b) { delete b; }

int podlink_export(podlink_client_t* client, const podlink_buffer_t* buf, const char* name,
                   const char* allowed_importers, uint64_t* export_id) {
  return Guard([&] {
    if (client == nullptr || buf == nullptr || export_id == nullptr) {
      return Fail(absl::InvalidArgumentError("NULL argument"));
    }
    auto opts = ParseOptions(name, allowed_importers);
    if (!opts.ok()) return Fail(opts.status());
    auto id = buf->host ? client->client->Export(*buf->host, *opts) : client->client->Export(*buf->gpu, *opts);
    if (!id.ok()) return Fail(id.status());
    *export_id = *id;
    return 0;
  });
}

int podlink_import_map(podlink_client_t* client, uint64_t export_id, const char* name, int access_device,
                       podlink_mapping_t** out) {
  return Guard([&] {
    if (client == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
    auto imp = name != nullptr ? client->client->Import(std::string(name)) : client->client->Import(export_id);
    if (!imp.ok()) return Fail(imp.status());
    auto m = client->client->Map(*imp, access_device);
    if (!m.ok()) return Fail(m.status());
    *out = new podlink_mapping{*std::move(m)};
    return 0;
  });
}

void* podlink_mapping_host_ptr(const podlink_mapping_t* m) { return m ? m->mapping->host_ptr() : nullptr; }
uint64_t podlink_mapping_device_ptr(const podlink_mapping_t* m) { return m ? m->mapping->device_ptr() : 0; }
size_t podlink_mapping_size(const podlink_mapping_t* m) { return m ? m->mapping->size() : 0; }
void podlink_unmap(podlink_mapping_t* m) { delete m; }

int podlink_release(podlink_client_t* client, uint64_t export_id) {
  return Guard([&] {
    if (client == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
    absl::Status s = client->client->Release(export_id);
    return s.ok() ? 0 : Fail(s);
  });
}

int podlink_engine_create(podlink_client_t* client, uint32_t flags, podlink_engine_t** out) {
  return Guard([&] {
    if (client == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
    if ((flags & ~PODLINK_ENGINE_FORCE_RELAY) != 0) return Fail(absl::InvalidArgumentError("unknown flags"));
    podlink::TransferEngine::Options o;
    o.force_relay = (flags & PODLINK_ENGINE_FORCE_RELAY) != 0;
    auto e = podlink::TransferEngine::Create(*client->client, o);
    if (!e.ok()) return Fail(e.status());
    *out = new podlink_engine{*std::move(e), {}};
    return 0;
  });
}

void podlink_engine_destroy(podlink_engine_t* engine) { delete engine; }

int podlink_register_host(podlink_engine_t* engine, void* addr, size_t size, const char* name,
                          podlink_region_t** out, uint64_t* offset) {
  return Guard([&] {
    if (engine == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
    auto opts = ParseOptions(name, nullptr);
    if (!opts.ok()) return Fail(opts.status());
    auto r = engine->engine->RegisterHost(addr, size, *opts);
    if (!r.ok()) return Fail(r.status());
    if (offset != nullptr) *offset = r->offset;
    *out = new podlink_region{r->region};
    return 0;
  });
}

int podlink_register_buffer(podlink_engine_t* engine, const podlink_buffer_t* buf, const char* name,
                            podlink_region_t** out) {
  return Guard([&] {
    if (engine == nullptr || buf == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
    auto opts = ParseOptions(name, nullptr);
    if (!opts.ok()) return Fail(opts.status());
    auto r = buf->host ? engine->engine->Register(*buf->host, *opts) : engine->engine->Register(*buf->gpu, *opts);
    if (!r.ok()) return Fail(r.status());
    *out = new podlink_region{*r};
    return 0;
  });
}

int podlink_unregister(podlink_engine_t* engine, podlink_region_t* region) {
  return Guard([&] {
    if (engine == nullptr || region == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
    absl::Status s = engine->engine->Unregister(region->region);
    delete region;
    return s.ok() ? 0 : Fail(s);
  });
}

int podlink_describe(podlink_engine_t* engine, const podlink_region_t* region, char* buf, size_t cap, size_t* len) {
  return Guard([&] {
    if (engine == nullptr || region == nullptr || (buf == nullptr && cap != 0)) {
      return Fail(absl::InvalidArgumentError("NULL argument"));
    }
    auto d = engine->engine->Describe(region->region);
    if (!d.ok()) return Fail(d.status());
    std::string wire = d->Serialize();
    if (len != nullptr) *len = wire.size();
    if (wire.size() + 1 > cap) {
      return Fail(absl::OutOfRangeError(absl::StrCat("the descriptor needs ", wire.size() + 1, " bytes")));
    }
    std::memcpy(buf, wire.c_str(), wire.size() + 1);
    return 0;
  });
}

int podlink_open(podlink_engine_t* engine, const char* descriptor, podlink_remote_t** out) {
  return Guard([&] {
    if (engine == nullptr || descriptor == nullptr || out == nullptr) {
      return Fail(absl::InvalidArgumentError("NULL argument"));
    }
    auto d = podlink::RegionDescriptor::Parse(descriptor);
    if (!d.ok()) return Fail(d.status());
    auto r = engine->engine->Open(*d);
    if (!r.ok()) return Fail(r.status());
    *out = new podlink_remote{*r};
    return 0;
  });
}

int podlink_close_remote(podlink_engine_t* engine, podlink_remote_t* remote) {
  return Guard([&] {
    if (engine == nullptr || remote == nullptr) return Fail(absl::InvalidArgumentError("NULL argument"));
    absl::Status s = engine->engine->Close(remote->region);
    delete remote;
    return s.ok() ? 0 : Fail(s);
  });
}

namespace {
int Transfer(podlink_engine_t* engine, const podlink_region_t* local, uint64_t local_offset,
             const podlink_remote_t* remote, uint64_t remote_offset, size_t length, bool write) {
  return Guard([&] {
    if (engine == nullptr || local == nullptr || remote == nullptr) {
      return Fail(absl::InvalidArgumentError("NULL argument"));
    }
    podlink::TransferOp op{&local->region, local_offset, &remote->region, remote_offset, length};
    absl::Status s = write ? engine->engine->Write(op) : engine->engine->Read(op);
    return s.ok() ? 0 : Fail(s);
  });
}
}  // namespace

int podlink_write(podlink_engine_t* engine, const podlink_region_t* local, uint64_t local_offset,
                  const podlink_remote_t* remote, uint64_t remote_offset, size_t length) {
  return Transfer(engine, local, local_offset, remote, remote_offset, length, true);
}

int podlink_read(podlink_engine_t* engine, const podlink_region_t* local, uint64_t local_offset,
                 const podlink_remote_t* remote, uint64_t remote_offset, size_t length) {
  return Transfer(engine, local, local_offset, remote, remote_offset, length, false);
}

int podlink_notify(podlink_engine_t* engine, const podlink_remote_t* remote, uint64_t value, const void* message,
                   size_t length) {
  return Guard([&] {
    if (engine == nullptr || remote == nullptr || (message == nullptr && length != 0)) {
      return Fail(absl::InvalidArgumentError("NULL argument"));
    }
    absl::Status s =
        message == nullptr
            ? engine->engine->Notify(remote->region, value)
            : engine->engine->Notify(remote->region, 0,
                                     absl::string_view(static_cast<const char*>(message), length));
    return s.ok() ? 0 : Fail(s);
  });
}

int podlink_next_notification(podlink_engine_t* engine, podlink_notification_t* out, void* message, size_t cap) {
  return Guard([&] {
    if (engine == nullptr || out == nullptr || (message == nullptr && cap != 0)) {
      return Fail(absl::InvalidArgumentError("NULL argument"));
    }
    if (engine->notifications.empty()) {
      for (podlink::Notification& n : engine->engine->PollNotifications()) {
        engine->notifications.push_back(std::move(n));
      }
    }
    if (engine->notifications.empty()) return Fail(absl::NotFoundError("no notification"));
    const podlink::Notification& n = engine->notifications.front();
    out->export_id = n.export_id;
    out->value = n.value;
    out->from_session = n.from_session;
    out->has_message = n.has_message ? 1 : 0;
    out->message_length = n.message.size();
    if (n.message.size() > cap) {
      return Fail(absl::OutOfRangeError(absl::StrCat("the notification carries ", n.message.size(), " bytes")));
    }
    if (!n.message.empty()) std::memcpy(message, n.message.data(), n.message.size());
    engine->notifications.pop_front();
    return 0;
  });
}

}  // extern "C"
