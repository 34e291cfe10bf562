// The keys and ciphers of a sealed route (docs/design/mesh.md §8.1).
//
// A region opened through relays is sealed end to end between the importing
// daemon and the owner's: each side makes an ephemeral X25519 key for the one
// open, the origin's public half rides in its signed OriginClaim and the
// owner's in its signed OwnerAnswer, so a relay sees both public halves and
// can change neither. Both derive, with HKDF-SHA256 over the shared secret
// (salt: the claim's nonce; info: the two nodes and both public keys), one
// AES-256-GCM key per direction. The keys live with the grant (owner) and
// the handle (importer) and never leave either daemon.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

typedef struct evp_pkey_st EVP_PKEY;

namespace podlink::mesh::seal {

inline constexpr size_t kPublicKeyBytes = 32;  // X25519
inline constexpr size_t kKeyBytes = 32;        // AES-256
inline constexpr size_t kTagBytes = 16;        // GCM
inline constexpr size_t kNonceBytes = 12;      // GCM

using Key = std::array<uint8_t, kKeyBytes>;
using Tag = std::array<uint8_t, kTagBytes>;

// One key per direction: what the importer seals (write data, requests) and
// what the owner seals (read data, receipts).
struct SealKeys {
  Key to_owner{};
  Key to_importer{};
};

// An ephemeral X25519 key pair for one open.
class EphemeralKey {
 public:
  static absl::StatusOr<EphemeralKey> Generate();
  EphemeralKey(EphemeralKey&&) noexcept = default;
  EphemeralKey& operator=(EphemeralKey&&) noexcept = default;
  ~EphemeralKey();

  // The raw 32-byte public key.
  const std::string& public_key() const { return public_key_; }
  // The X25519 shared secret with the peer's raw public key; PERMISSION_DENIED
  // for a key that is not 32 bytes or a point of small order (an all-zero
  // secret).
  absl::StatusOr<Key> Agree(absl::string_view peer_public) const;

 private:
  EphemeralKey() = default;
  struct Free {
    void operator()(EVP_PKEY* p) const;
  };
  std::unique_ptr<EVP_PKEY, Free> key_;
  std::string public_key_;
};

// The route's two keys from the shared secret. `origin` and `owner` name the
// nodes; the public keys are the origin's and the owner's.
absl::StatusOr<SealKeys> DeriveSealKeys(const Key& shared, uint64_t claim_nonce, absl::string_view origin,
                                        absl::string_view owner, absl::string_view origin_public,
                                        absl::string_view owner_public);

// The 12-byte GCM nonce of record `index` of sequence number `seq`.
std::array<uint8_t, kNonceBytes> Nonce(uint64_t seq, uint32_t index);

// AES-256-GCM over `n` bytes (in == out allowed; n may be 0, authenticating
// only `aad`). Seal writes the tag; Open checks it and returns DATA_LOSS when
// it does not match (out then holds nothing the caller may use).
absl::Status GcmSeal(const Key& key, const std::array<uint8_t, kNonceBytes>& nonce, absl::string_view aad,
                     const void* in, void* out, size_t n, Tag* tag);
absl::Status GcmOpen(const Key& key, const std::array<uint8_t, kNonceBytes>& nonce, absl::string_view aad,
                     const void* in, void* out, size_t n, const Tag& tag);

}  // namespace podlink::mesh::seal
