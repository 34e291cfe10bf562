// The C API over podlink::Client. No exception crosses this boundary.
#include "podlink/podlink.h"

#include <memory>
#include <string>

#include "absl/strings/str_split.h"
#include "podlink/client.h"

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

}  // extern "C"
