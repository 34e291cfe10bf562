// OpenSSL's lifetime in a process whose gRPC threads outlive main().
//
// OpenSSL frees its global locks in an atexit handler. gRPC's event-engine
// threads are not joined when podlinkd returns from main: a connection attempt
// to a peer daemon (a TLS handshake, which draws random bytes) can still be
// running while exit() runs that handler, and then it takes a lock that is
// gone (seen under TSan as a SEGV in RAND_bytes at the end of a mesh test).
#pragma once

namespace podlink::mesh {

// Keeps OpenSSL's state until the process ends: its atexit clean-up is not
// registered (the kernel reclaims the memory). Call first thing in main(),
// before anything uses OpenSSL (gRPC's TLS included); returns false when
// OpenSSL could not be initialised.
bool KeepOpenSslUntilExit();

}  // namespace podlink::mesh
