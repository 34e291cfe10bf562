// Helpers and constants the mesh engine's files (daemon/mesh/mesh_engine.cc
// and the rooms beside it: control/, owner/, routing/, importer/, tcp/,
// verbs/, status.cc) share, and nothing else includes. Internal to the engine.
#pragma once

#include "daemon/mesh/mesh_engine.h"
#include "daemon/mesh/control/answer_once.h"
#include "daemon/mesh/links/random.h"
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/tcp_connect.h"
#include "daemon/mesh/tcp/sockets.h"
#include "common/status_util.h"
#include "daemon/mesh/origin_sign.h"
#include "daemon/mesh/owner_answer.h"
#include "daemon/mesh/routes.h"
#include "daemon/metrics/metrics.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

// The engine's logger (one for every room).
inline const ComponentLog Log("mesh");

}  // namespace podlink::mesh
