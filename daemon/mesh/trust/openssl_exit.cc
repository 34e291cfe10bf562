#include "daemon/mesh/trust/openssl_exit.h"

#include <openssl/crypto.h>

namespace podlink::mesh {

bool KeepOpenSslUntilExit() {
  // The option only counts in the first call that initialises OpenSSL: that
  // call decides whether the atexit handler is registered.
  return OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
}

}  // namespace podlink::mesh
