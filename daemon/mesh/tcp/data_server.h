// The TCP transport's data server (wire.h): the data port, each connection
// admitted through the gate (tcp/admission.h) and authenticated by its AUTH
// cookie, then its frames: header checked (magic, flags, type, length cap),
// idle connections closed, DONE records and the late-copy guard
// (links/late_copies.h), answers written by the connection's own thread
// (tcp/conn_writer.h). What a WRITE, READ or NOTIFY does to a grant is the
// owner's (Owner::serve: owner/frames.cc). A connection's thread of its own,
// detached, counted by the gate (which shuts them all at stop).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/mesh/links/late_copies.h"
#include "daemon/mesh/tcp/admission.h"
#include "daemon/mesh/tcp/conn_writer.h"
#include "daemon/mesh/links/wire.h"

namespace podlink::mesh {

class TcpDataServer {
 public:
  struct Options {
    absl::Duration io_timeout = absl::Seconds(5);      // TCP_USER_TIMEOUT, SO_SNDTIMEO; DONE waits twice this
    absl::Duration idle_timeout = absl::Minutes(10);   // a connection that brings no frame this long is closed
  };
  // What the owner does with a connection's frames.
  struct Owner {
    // WRITE, READ or NOTIFY `h` (its header checked; a WRITE's payload still
    // on `fd`, and registered with the late-copy guard, which `serve` ends,
    // LateCopies::EndWrite, once its bytes landed or failed) on a grant
    // `node` holds. An error ends the connection.
    std::function<absl::Status(const std::shared_ptr<ConnWriter>& writer, int fd, const FrameHeader& h,
                               const std::string& node, uint64_t link_instance)>
        serve;
    // `node`'s authenticated connection ended (before the gate stops counting it).
    std::function<void(const std::string& node)> ended;
  };
  struct Counts {
    uint64_t refused_frames = 0;       // connections closed for a malformed frame
    uint64_t idle_closed = 0;          // connections closed for bringing no frame
    uint64_t late_slices_dropped = 0;  // late copies of a finished transfer's slices
    uint64_t duplicate_notifies = 0;   // notifications received again and not delivered twice
  };

  // `admission` and `late` outlive the server.
  TcpDataServer(Options options, DataAdmission& admission, LateCopies& late, Owner owner);
  ~TcpDataServer();  // Stop()s

  // Binds and listens on `port` (0: any), every address, IPv4 and IPv6.
  absl::Status Listen(uint32_t port);
  uint32_t port() const { return port_; }
  // The accept thread.
  void Start();
  // No connection is accepted from now on; returns once the accept thread
  // ended. The connections being served are the gate's to shut
  // (DataAdmission::ShutdownAndWait).
  void Stop();

  // The frames of a connection authenticated for `node` (whose AUTH said
  // `link_instance`), until EOF, a protocol error or the idle timeout, on the
  // caller's thread (tests and tools/fuzz call it directly).
  void ServeFrames(int fd, const std::string& node, uint64_t link_instance);

  Counts counts() const;

 private:
  void AcceptLoop();
  void ServeConnection(int fd, const DataAdmission::Pending& pending);

  const Options options_;
  DataAdmission& admission_;
  LateCopies& late_copies_;
  const Owner owner_;
  UniqueFd listen_fd_;
  uint32_t port_ = 0;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> refused_frames_{0}, idle_closed_{0}, late_slices_dropped_{0}, duplicate_notifies_{0};
};

}  // namespace podlink::mesh
