// This node's certificate files: the current PEMs and their reload.
#include "daemon/mesh/control/credentials.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/trust/origin_sign.h"

namespace podlink::mesh {
namespace {

const ComponentLog CredentialsLog("mesh");

absl::StatusOr<std::string> ReadPem(const std::string& dir, const char* name) {
  std::string path = dir + "/" + name;
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("mesh certificate file ", path, " cannot be read: ",
                                                      std::strerror(errno),
                                                      " (mesh.cert_dir needs ca.crt, tls.crt, tls.key)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN") == std::string::npos) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not PEM"));
  }
  return ss.str();
}

}  // namespace

absl::Status NodeCredentials::ReadAll(Pems* out) const {
  PODLINK_ASSIGN_OR_RETURN(out->ca, ReadPem(dir_, "ca.crt"));
  PODLINK_ASSIGN_OR_RETURN(out->cert, ReadPem(dir_, "tls.crt"));
  PODLINK_ASSIGN_OR_RETURN(out->key, ReadPem(dir_, "tls.key"));
  return absl::OkStatus();
}

absl::Status NodeCredentials::Load() {
  Pems p;
  PODLINK_RETURN_IF_ERROR(ReadAll(&p));
  absl::MutexLock l(&mu_);
  pems_ = std::move(p);
  read_ = absl::Now();
  return absl::OkStatus();
}

NodeCredentials::Pems NodeCredentials::Current() const {
  absl::MutexLock l(&mu_);
  return pems_;
}

bool NodeCredentials::Refresh() {
  {
    absl::MutexLock l(&mu_);
    if (absl::Now() - read_ < refresh_) return false;
    read_ = absl::Now();
  }
  Pems p;
  // Half-written or missing (a rotation in progress): keep what works.
  if (!ReadAll(&p).ok()) return false;
  // The key must sign what the certificate vouches for, or claims made with
  // it would be refused everywhere: keep the old pair until both match.
  if (!SignWithKey(p.key, "podlink").ok() || !KeyMatchesCertificate(p.key, p.cert)) return false;
  bool changed = false;
  {
    absl::MutexLock l(&mu_);
    changed = p.ca != pems_.ca || p.cert != pems_.cert || p.key != pems_.key;
    if (changed) pems_ = std::move(p);
  }
  if (changed) CredentialsLog()->info("event=mesh_certificates_reloaded dir={}", dir_);
  return changed;
}

}  // namespace podlink::mesh
