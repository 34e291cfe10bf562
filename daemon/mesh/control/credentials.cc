// Certificates: the current PEMs and their reload.
#include "daemon/mesh/engine_internal.h"

namespace podlink::mesh {

MeshEngine::Pems MeshEngine::CurrentPems() const {
  absl::MutexLock l(&pem_mu_);
  return pems_;
}

void MeshEngine::ReloadPems() {
  {
    absl::MutexLock l(&pem_mu_);
    if (absl::Now() - pems_read_ < options_.cert_refresh) return;
    pems_read_ = absl::Now();
  }
  Pems p;
  absl::StatusOr<std::string> ca = ReadPem(options_.cert_dir, "ca.crt"), cert = ReadPem(options_.cert_dir, "tls.crt"),
                              key = ReadPem(options_.cert_dir, "tls.key");
  if (!ca.ok() || !cert.ok() || !key.ok()) {
    // Half-written or missing (a rotation in progress): keep what works.
    return;
  }
  p.ca = *std::move(ca);
  p.cert = *std::move(cert);
  p.key = *std::move(key);
  // The key must sign what the certificate vouches for, or claims made with
  // it would be refused everywhere: keep the old pair until both match.
  if (!SignWithKey(p.key, "podlink").ok() || !KeyMatchesCertificate(p.key, p.cert)) return;
  bool changed = false;
  {
    absl::MutexLock l(&pem_mu_);
    changed = p.ca != pems_.ca || p.cert != pems_.cert || p.key != pems_.key;
    if (changed) pems_ = std::move(p);
  }
  if (changed) Log()->info("event=mesh_certificates_reloaded dir={}", options_.cert_dir);
}

}  // namespace podlink::mesh
