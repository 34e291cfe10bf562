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

#define PODLINK_ABI_VERSION 1

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

#ifdef __cplusplus
}
#endif

#endif /* PODLINK_PODLINK_H_ */
