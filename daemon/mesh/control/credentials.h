// This node's mesh certificate files (mesh.cert_dir: ca.crt, tls.crt,
// tls.key — a cert-manager Certificate secret's names) as last read: what
// signs and checks claims, owners' answers and adverts. gRPC's TLS watches
// the same files itself (mesh_engine.cc). Read again at most every `refresh`
// (a rotation in place); a half-written set, or a key that does not sign for
// its certificate, keeps the pair that works. Its own lock (a leaf).
#pragma once

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace podlink::mesh {

class NodeCredentials {
 public:
  struct Pems {
    std::string ca, cert, key;
  };

  NodeCredentials(std::string dir, absl::Duration refresh) : dir_(std::move(dir)), refresh_(refresh) {}

  // The first read: FAILED_PRECONDITION naming a file that cannot be read
  // or is not PEM.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);
  Pems Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // Reads the files again where `refresh` has passed since the last read;
  // true when what is current changed.
  bool Refresh() ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& dir() const { return dir_; }

 private:
  absl::Status ReadAll(Pems* out) const;

  const std::string dir_;
  const absl::Duration refresh_;
  mutable absl::Mutex mu_;
  Pems pems_ ABSL_GUARDED_BY(mu_);
  absl::Time read_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace podlink::mesh
