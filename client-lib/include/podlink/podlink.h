/* libpodlink C API: for the NCCL plugin and foreign languages.
 *
 * Opaque handles, integer status codes (the canonical gRPC / absl codes:
 * 0 OK, 3 INVALID_ARGUMENT, 5 NOT_FOUND, 7 PERMISSION_DENIED, 9
 * FAILED_PRECONDITION, 14 UNAVAILABLE, ...), and podlink_last_error() for the
 * message of the calling thread's last failure. Functions are only ever added
 * at the end; podlink_abi_version() tells which exist. */
#ifndef PODLINK_PODLINK_H_
#define PODLINK_PODLINK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1: the broker calls (connect ... release). 2: the transfer engine (podlink_engine_*: register, describe, open,
 * write/read, notifications with values or bytes). */
#define PODLINK_ABI_VERSION 2

/* libpodlink is built with hidden visibility; this marks its public API. */
#ifndef PODLINK_API
#define PODLINK_API __attribute__((visibility("default")))
#endif

typedef struct podlink_client podlink_client_t;
typedef struct podlink_buffer podlink_buffer_t;
typedef struct podlink_mapping podlink_mapping_t;

PODLINK_API int podlink_abi_version(void);
/* Message of this thread's last failed call ("" if none). Valid until the next call. */
PODLINK_API const char* podlink_last_error(void);

/* socket_dir: NULL for $PODLINK_SOCKET_DIR or /run/podlink. */
PODLINK_API int podlink_connect(const char* socket_dir, podlink_client_t** out);
PODLINK_API void podlink_disconnect(podlink_client_t* client);

/* Allocates exportable memory: device < 0 for host memory (memfd), else GPU
 * memory on that CUDA ordinal. The buffer belongs to the caller. */
PODLINK_API int podlink_alloc(podlink_client_t* client, int device, size_t size, podlink_buffer_t** out);
PODLINK_API void* podlink_buffer_host_ptr(const podlink_buffer_t* buf);     /* NULL for GPU memory */
PODLINK_API uint64_t podlink_buffer_device_ptr(const podlink_buffer_t* buf); /* 0 for host memory */
PODLINK_API size_t podlink_buffer_size(const podlink_buffer_t* buf);
PODLINK_API void podlink_free(podlink_buffer_t* buf);

/* name may be NULL; allowed_importers is a comma-separated "ns/name" list or NULL. */
PODLINK_API int podlink_export(podlink_client_t* client, const podlink_buffer_t* buf, const char* name,
                   const char* allowed_importers, uint64_t* export_id);

/* Imports by id (name NULL) or by name, and maps it. access_device < 0: the
 * GPU holding the memory. */
PODLINK_API int podlink_import_map(podlink_client_t* client, uint64_t export_id, const char* name, int access_device,
                       podlink_mapping_t** out);
PODLINK_API void* podlink_mapping_host_ptr(const podlink_mapping_t* m);
PODLINK_API uint64_t podlink_mapping_device_ptr(const podlink_mapping_t* m);
PODLINK_API size_t podlink_mapping_size(const podlink_mapping_t* m);
PODLINK_API void podlink_unmap(podlink_mapping_t* m);

PODLINK_API int podlink_release(podlink_client_t* client, uint64_t export_id);

/* ---- ABI version 2: one-sided transfers (podlink::TransferEngine) ---- */

typedef struct podlink_engine podlink_engine_t;
typedef struct podlink_region podlink_region_t; /* memory of this process, registered */
typedef struct podlink_remote podlink_remote_t; /* a peer's region, opened */

/* Every transfer through podlinkd's relay, even where this process could map the peer's memory. */
#define PODLINK_ENGINE_FORCE_RELAY 1u
/* The most bytes a notification carries. */
#define PODLINK_MAX_NOTIFY_BYTES 4096

/* One engine per client (a session has one relay ring); the client must outlive it. */
PODLINK_API int podlink_engine_create(podlink_client_t* client, uint32_t flags, podlink_engine_t** out);
PODLINK_API void podlink_engine_destroy(podlink_engine_t* engine);

/* Host memory of this process by address: a range of podlink host memory or of a sealed memfd (peers map it), or
 * any memory the process can read and write, malloc'd included (podlinkd's relay copies it). *offset (may be NULL)
 * receives where `addr` lies in the region: use it as the local offset of transfers. name may be NULL. */
PODLINK_API int podlink_register_host(podlink_engine_t* engine, void* addr, size_t size, const char* name,
                                      podlink_region_t** out, uint64_t* offset);
/* Memory from podlink_alloc (host or GPU), the whole buffer. */
PODLINK_API int podlink_register_buffer(podlink_engine_t* engine, const podlink_buffer_t* buf, const char* name,
                                        podlink_region_t** out);
/* Withdraws the region's export and frees the handle. */
PODLINK_API int podlink_unregister(podlink_engine_t* engine, podlink_region_t* region);

/* The region's descriptor for a peer, NUL-terminated in buf (cap bytes); *len (may be NULL) receives its length
 * without the NUL. OUT_OF_RANGE (11) when cap is too small, with *len set. */
PODLINK_API int podlink_describe(podlink_engine_t* engine, const podlink_region_t* region, char* buf, size_t cap,
                                 size_t* len);
PODLINK_API int podlink_open(podlink_engine_t* engine, const char* descriptor, podlink_remote_t** out);
PODLINK_API int podlink_close_remote(podlink_engine_t* engine, podlink_remote_t* remote);

/* Synchronous: on return the bytes are at their destination. */
PODLINK_API int podlink_write(podlink_engine_t* engine, const podlink_region_t* local, uint64_t local_offset,
                              const podlink_remote_t* remote, uint64_t remote_offset, size_t length);
PODLINK_API int podlink_read(podlink_engine_t* engine, const podlink_region_t* local, uint64_t local_offset,
                             const podlink_remote_t* remote, uint64_t remote_offset, size_t length);

/* A notification to the owner of `remote`, delivered after every earlier write and read of this engine: `value`
 * alone (message NULL), or `length` bytes of `message` (at most PODLINK_MAX_NOTIFY_BYTES; value unused). */
PODLINK_API int podlink_notify(podlink_engine_t* engine, const podlink_remote_t* remote, uint64_t value,
                               const void* message, size_t length);

typedef struct {
  uint64_t export_id;      /* which of this process's regions the peer named */
  uint64_t value;          /* a notification of a value */
  uint64_t from_session;   /* podlinkd's session of the sender (0: another node) */
  int has_message;         /* 1: bytes, in the caller's buffer */
  size_t message_length;
} podlink_notification_t;

/* The oldest notification not yet taken: 0 with *out filled (its bytes copied to message), NOT_FOUND (5) when there
 * is none, OUT_OF_RANGE (11) when its bytes do not fit in cap (out->message_length says how many; it stays next). */
PODLINK_API int podlink_next_notification(podlink_engine_t* engine, podlink_notification_t* out, void* message,
                                          size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* PODLINK_PODLINK_H_ */
