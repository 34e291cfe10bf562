// A client of a test's podlinkd with a transfer engine and podlink host
// memory registered: the peer the relay and transfer tests move bytes with.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "gtest/gtest.h"
#include "podlink/client.h"
#include "podlink/transfer.h"
#include "tests/integration/harness.h"

namespace podlink::testing {

struct HostPeer {
  std::unique_ptr<Client> client;
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<HostBuffer> buf;
  LocalRegion region;
};

// `size` bytes filled with `fill`, registered; every transfer through the
// relay when `force_relay`. Transports print no line.
inline HostPeer MakeHostPeer(const Daemon& d, size_t size, bool force_relay, uint8_t fill = 0) {
  HostPeer p;
  p.client = *Client::Connect({.socket_dir = d.dir()});
  TransferEngine::Options o;
  o.force_relay = force_relay;
  o.log_transport = false;
  auto e = TransferEngine::Create(*p.client, o);
  EXPECT_TRUE(e.ok()) << e.status();
  p.engine = *std::move(e);
  p.buf = *p.client->AllocateHost(size);
  std::memset(p.buf->data(), fill, size);
  p.region = *p.engine->Register(*p.buf);
  return p;
}

}  // namespace podlink::testing
