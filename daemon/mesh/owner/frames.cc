// The owner's side of the transports' requests on grants this node gave: the
// TCP data server's frames (tcp/data_server.h) and the verbs server's staged
// slices and notifications (verbs/verbs_link.h VerbsServer's sinks). What
// each does to the grant: an export's memory, a relay's onward grant
// (ServeForward), a sealed route's window (ServeSealed).
#include "daemon/mesh/owner/region_owner.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/links/range.h"
#include "daemon/mesh/tcp/conn_writer.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

namespace {
const ComponentLog FrameLog("mesh");
}  // namespace

absl::Status RegionOwner::ServeForward(const std::shared_ptr<ConnWriter>& writer, int fd, const FrameHeader& h,
                                       const std::string& node, uint64_t link_instance, const Forward& fwd) {
  const auto type = static_cast<FrameType>(h.type);
  const LateCopies::Key key{node, link_instance, TransferOfTag(h.tag)};
  const uint64_t n = type == FrameType::kNotify ? 0 : h.length;
  // A write was registered by the caller (BeginWrite); whatever happens, it
  // ends once, here or in its completion.
  auto end = [this, key, type] {
    if (type == FrameType::kWrite) late_copies_.EndWrite(key);
  };
  absl::Status st =
      type == FrameType::kNotify ? absl::OkStatus() : ByteRange{h.offset, h.length}.CheckNonEmptyIn(fwd.size);
  if (!st.ok()) {
    // answered below
  } else if (absl::StatusOr<std::shared_ptr<DataLinks>> onward = fwd.OnwardLinks(); !onward.ok()) {
    st = onward.status();
  } else if (n > 0) {
    // The staging this node's earlier answers hold is released once this
    // thread has written them (ConnWriter): write them while waiting.
    const absl::Time until = absl::Now() + options_.answer_timeout;
    bool reserved = false;
    while (!(reserved = relay_staging_.Take(node, n, absl::Milliseconds(20))) && absl::Now() < until &&
           !stopping_.load(std::memory_order_acquire)) {
      if (absl::Status io = writer->Flush(); !io.ok()) {
        end();
        return io;
      }
    }
    if (!reserved) st = absl::ResourceExhaustedError("the relay's staging stayed full");
  }
  if (!st.ok()) {
    absl::Status io = type == FrameType::kWrite ? Discard(fd, h.length) : absl::OkStatus();
    end();
    return io.ok() ? writer->Ack(h.tag, st) : io;
  }
  std::shared_ptr<char[]> buf(n > 0 ? new char[n] : nullptr);
  if (type == FrameType::kWrite) {
    if (absl::Status io = ReadFull(fd, buf.get(), n); !io.ok()) {
      relay_staging_.Give(node, n);
      end();
      return io;
    }
  }
  LinkOp op;
  op.type = type;
  op.grant = fwd.grant;
  op.offset = h.offset;
  op.length = n;
  op.local = buf.get();
  op.keep = buf;
  const uint64_t tag = h.tag;
  // On the link thread that completed it: the answer is queued for this
  // connection's serving thread (ConnWriter), and the staging it holds goes
  // once that thread has written it or dropped it.
  op.done = [this, writer, buf, tag, type, n, node, key, end](const absl::Status& result) {
    if (type == FrameType::kNotify && result.ok()) late_copies_.Finish(key);
    if (result.ok()) counters_.relay_forwarded_bytes += n;
    end();
    const bool data = type == FrameType::kRead && result.ok();
    writer->Post(tag, data ? buf : nullptr, data ? n : 0, result, [this, node, n] {
      if (n > 0) relay_staging_.Give(node, n);
    });
  };
  std::shared_ptr<DataLinks> links = fwd.peer->links();
  absl::Status submitted = links == nullptr ? absl::UnavailableError("the relay's link went down") : absl::OkStatus();
  auto failed = op.done;
  if (submitted.ok()) submitted = links->Submit(std::move(op));
  if (!submitted.ok()) failed(submitted);  // Submit calls `done` only when it queued the request
  return absl::OkStatus();
}


// A WRITE, READ or NOTIFY of `node`'s data connection on a grant this node
// gave (TcpDataServer::Owner::serve): one look at the grant decides — a
// relay's goes on to the next node, a sealed route's through its window, an
// export's lands in (or is read from) the export's memory here.
absl::Status RegionOwner::ServeGrantFrame(const std::shared_ptr<ConnWriter>& writer, int fd, const FrameHeader& h,
                                          const std::string& node, uint64_t link_instance) {
  const auto type = static_cast<FrameType>(h.type);
  const LateCopies::Key key{node, link_instance, TransferOfTag(h.tag)};
  absl::StatusOr<Granted> granted = LookupGrant(node, h.grant);
  if (granted.ok() && granted->forward != nullptr) {
    return ServeForward(writer, fd, h, node, link_instance, *granted->forward);
  }
  struct EndWriteOnExit {
    LateCopies& late;
    const LateCopies::Key& key;
    bool active;
    ~EndWriteOnExit() {
      if (active) late.EndWrite(key);
    }
  } end_write{late_copies_, key, type == FrameType::kWrite};
  if (granted.ok() && granted->sealed != nullptr) return ServeSealed(*writer, fd, h, h.grant, *granted);
  const bool fenceable = granted.ok() && granted->fenceable;
  absl::StatusOr<std::shared_ptr<const ExportRecord>> rec =
      granted.ok() ? absl::StatusOr<std::shared_ptr<const ExportRecord>>(granted->record) : granted.status();
  absl::StatusOr<RelayView> view = rec.ok() ? (*rec)->memory->MapForRelay() : rec.status();
  absl::Status st = view.status();
  if (st.ok() && type != FrameType::kNotify) {
    if (h.length == 0) {
      st = absl::InvalidArgumentError("length must be > 0");
    } else if (!ByteRange{h.offset, h.length}.Within((*rec)->size)) {
      st = ByteRange{h.offset, h.length}.CheckIn((*rec)->size, absl::StrCat("export ", (*rec)->id));
    } else if (view->on_gpu && h.length > kMaxGpuFrame) {
      st = absl::InvalidArgumentError(absl::StrCat("a frame for GPU memory carries at most ", kMaxGpuFrame, " bytes"));
    } else if (!view->on_gpu) {
      // As the local relay does per copy: a range whose pages the owner
      // punched out is refused, never faulted in at podlinkd's expense.
      st = (*rec)->memory->CheckPopulated(h.offset, h.length);
    }
  }
  absl::Status io;
  switch (type) {
    case FrameType::kWrite:
      if (!st.ok()) {
        io = Discard(fd, h.length);
        if (io.ok()) io = writer->Ack(h.tag, st);
        break;
      }
      if (view->on_gpu) {
        // Through this thread's staging buffer, a chunk at a time, copied
        // to the GPU by its copy engine; a failed copy still reads the frame.
        // A fenceable grant's chunk is copied only while the grant is open.
        absl::Status copy;
        for (uint64_t done = 0; done < h.length && io.ok();) {
          uint64_t n = std::min<uint64_t>(kGpuChunk, h.length - done);
          char* buf = ChunkBuffer();
          io = ReadFull(fd, buf, n);
          if (io.ok() && copy.ok() && fenceable && !grants_.BeginLanding(h.grant)) {
            copy = absl::FailedPreconditionError("the route was fenced");
          } else if (io.ok() && copy.ok()) {
            copy = TimedGpuCopy([&] { return (*rec)->memory->CopyIn(h.offset + done, buf, n); });
            if (fenceable) grants_.EndLanding(h.grant);
          }
          done += n;
        }
        if (io.ok()) io = writer->Ack(h.tag, copy);
        if (!copy.ok()) break;
      } else if (fenceable) {
        absl::Status landed;
        io = LandFenceable(fd, h.grant, reinterpret_cast<char*>(view->address) + h.offset, h.length, &landed);
        if (io.ok()) io = writer->Ack(h.tag, landed);
        if (!landed.ok()) break;
      } else {
        io = ReadFull(fd, reinterpret_cast<char*>(view->address) + h.offset, h.length);
        if (io.ok()) io = writer->Ack(h.tag, absl::OkStatus());
      }
      if (io.ok()) {
        counters_.bytes_written_in += h.length;
        ++counters_.frames_served;
      }
      break;
    case FrameType::kRead: {
      if (!st.ok()) {
        io = writer->Ack(h.tag, st);
        break;
      }
      FrameHeader d{};
      d.magic = kFrameMagic;
      d.type = static_cast<uint16_t>(FrameType::kData);
      d.length = h.length;
      d.tag = h.tag;
      if (view->on_gpu) {
        // The first chunk is copied before the header goes, so an export
        // that cannot be copied is refused instead of cut off.
        uint64_t n = std::min<uint64_t>(kGpuChunk, h.length);
        char* buf = ChunkBuffer();
        if (absl::Status c = TimedGpuCopy([&] { return (*rec)->memory->CopyOut(h.offset, buf, n); }); !c.ok()) {
          io = writer->Ack(h.tag, c);
          break;
        }
        absl::MutexLock whole_frame(&writer->mu());
        io = WriteFull(fd, &d, sizeof(d));
        for (uint64_t done = 0; io.ok();) {
          io = WriteFull(fd, buf, n);
          done += n;
          if (!io.ok() || done == h.length) break;
          n = std::min<uint64_t>(kGpuChunk, h.length - done);
          if (absl::Status c = TimedGpuCopy([&] { return (*rec)->memory->CopyOut(h.offset + done, buf, n); });
              !c.ok()) {
            io = c;  // the peer sees the connection end and sends the slice again elsewhere
          }
        }
      } else {
        // Copied into the kernel, never sent from the pages themselves: a
        // zero-copy answer still queued when the grant ends would carry
        // whatever the owning pod writes there afterwards.
        io = writer->Frame(d, reinterpret_cast<const char*>(view->address) + h.offset, h.length);
      }
      if (io.ok()) {
        counters_.bytes_read_out += h.length;
        ++counters_.frames_served;
      }
      break;
    }
    default:  // kNotify
      if (st.ok()) st = host_->NotifyOwner(**rec, h.offset);
      if (st.ok()) late_copies_.Finish(key);
      io = writer->Ack(h.tag, st);
      break;
  }
  return io;
}


absl::Status RegionOwner::ServeSealed(ConnWriter& writer, int fd, const FrameHeader& h, uint64_t grant,
                                      const Granted& g) {
  const auto type = static_cast<FrameType>(h.type);
  if (type == FrameType::kNotify) {
    return writer.Ack(h.tag, absl::FailedPreconditionError("a sealed route's notifications go sealed through its window"));
  }
  if (h.length == 0 || h.length > seal::kSlotStride) {
    absl::Status io = type == FrameType::kWrite ? Discard(fd, h.length) : absl::OkStatus();
    if (!io.ok()) return io;
    return writer.Ack(h.tag, absl::OutOfRangeError(absl::StrCat("a sealed route's frame carries 1 to ",
                                                                seal::kSlotStride, " bytes")));
  }
  std::unique_ptr<char[]> buf(new char[h.length]);
  if (type == FrameType::kWrite) {
    PODLINK_RETURN_IF_ERROR(ReadFull(fd, buf.get(), h.length));
    return writer.Ack(h.tag, g.sealed->Write(h.offset, buf.get(), h.length));
  }
  std::unique_ptr<seal::Lander> lander = LanderFor(grant, g);
  if (absl::Status st = g.sealed->Read(h.offset, buf.get(), h.length, *lander); !st.ok()) return writer.Ack(h.tag, st);
  FrameHeader d{};
  d.magic = kFrameMagic;
  d.type = static_cast<uint16_t>(FrameType::kData);
  d.length = h.length;
  d.tag = h.tag;
  return writer.Frame(d, buf.get(), h.length);
}

// --- staged slices and notifications over verbs (verbs::VerbsServer's sinks) ---

void RegionOwner::StagedSlice(const std::string& node, uint64_t grant, bool write, uint64_t offset, char* buf,
                              uint64_t length, std::shared_ptr<const void> keep,
                              std::function<void(absl::Status)> done) {
  absl::StatusOr<Granted> granted = LookupGrant(node, grant);
  if (!granted.ok()) return done(granted.status());
  if (granted->sealed != nullptr) {
    // A sealed route's slice goes to its window (seal/window.h).
    if (write) return done(granted->sealed->Write(offset, buf, length));
    std::unique_ptr<seal::Lander> lander = LanderFor(grant, *granted);
    return done(granted->sealed->Read(offset, buf, length, *lander));
  }
  if (granted->forward == nullptr) {
    const bool landing = write && granted->fenceable;
    if (landing && !grants_.BeginLanding(grant)) return done(absl::FailedPreconditionError("the route was fenced"));
    absl::Status copied = StagedCopy(*granted->record, write, offset, buf, length);
    if (landing) grants_.EndLanding(grant);
    return done(copied);
  }
  // A relay's grant: the slice goes on to the next node from (or into) the
  // bounce slot, which stays taken until then — the upstream node's bounce
  // slots here are the relay's staging for it, bounded per peer and device.
  const Forward& fwd = *granted->forward;
  if (absl::Status range = ByteRange{offset, length}.CheckNonEmptyIn(fwd.size); !range.ok()) return done(range);
  absl::StatusOr<std::shared_ptr<DataLinks>> onward = fwd.OnwardLinks();
  if (!onward.ok()) return done(onward.status());
  std::shared_ptr<DataLinks> links = *std::move(onward);
  LinkOp op;
  op.type = write ? FrameType::kWrite : FrameType::kRead;
  op.grant = fwd.grant;
  op.offset = offset;
  op.length = length;
  op.local = buf;
  op.keep = std::move(keep);
  op.done = [this, length, done](const absl::Status& result) {
    if (result.ok()) counters_.relay_forwarded_bytes += length;
    done(result);
  };
  auto failed = op.done;
  if (absl::Status submitted = links->Submit(std::move(op)); !submitted.ok()) failed(submitted);
}

absl::Status RegionOwner::StagedCopy(const ExportRecord& export_record, bool write, uint64_t offset, char* buf,
                                     uint64_t length) {
  // The same checks as a TCP frame's: the range inside the export, and for
  // host memory every page still there (the grant was checked by the caller).
  const ExportRecord* rec = &export_record;
  PODLINK_ASSIGN_OR_RETURN(RelayView view, rec->memory->MapForRelay());
  PODLINK_RETURN_IF_ERROR((ByteRange{offset, length}.CheckNonEmptyIn(rec->size, absl::StrCat("export ", rec->id))));
  if (view.on_gpu) {
    PODLINK_RETURN_IF_ERROR(TimedGpuCopy(
        [&] { return write ? rec->memory->CopyIn(offset, buf, length) : rec->memory->CopyOut(offset, buf, length); }));
  } else {
    PODLINK_RETURN_IF_ERROR(rec->memory->CheckPopulated(offset, length));
    char* at = reinterpret_cast<char*>(view.address) + offset;
    write ? std::memcpy(at, buf, length) : std::memcpy(buf, at, length);
  }
  (write ? counters_.bytes_written_in : counters_.bytes_read_out) += length;
  ++counters_.frames_served;
  return absl::OkStatus();
}

void RegionOwner::DeliverVerbsNotify(const std::string& node, uint64_t grant, uint64_t value) {
  absl::StatusOr<Granted> granted = LookupGrant(node, grant);
  absl::StatusOr<std::shared_ptr<DataLinks>> onward = absl::NotFoundError("");
  if (granted.ok() && granted->forward != nullptr) {
    onward = granted->forward->OnwardLinks();
    if (!onward.ok()) granted = onward.status();
  }
  if (granted.ok() && granted->forward != nullptr) {
    // A relay's grant: on to the next node (the writes before it were
    // answered only once they had landed there). As a notification over
    // verbs to an owner, it is not answered: a failure onward is logged and
    // counted here.
    std::shared_ptr<DataLinks> links = *std::move(onward);
    LinkOp op;
    op.type = FrameType::kNotify;
    op.grant = granted->forward->grant;
    op.offset = value;
    op.done = [this, node](const absl::Status& st) {
      if (st.ok()) return;
      FrameLog()->warn("event=mesh_notify_refused peer={} transport=verbs relayed=true why=\"{}\"", node, st.message());
      ++counters_.refused_notifies;
    };
    auto failed = op.done;
    absl::Status submitted = links->Submit(std::move(op));
    if (!submitted.ok()) failed(submitted);
    return;
  }
  if (granted.ok() && granted->sealed != nullptr) {
    granted = absl::FailedPreconditionError("a sealed route's notifications go sealed through its window");
  }
  absl::Status st = granted.ok() ? host_->NotifyOwner(*granted->record, value) : granted.status();
  if (!st.ok()) {
    FrameLog()->warn("event=mesh_notify_refused peer={} transport=verbs why=\"{}\"", node, st.message());
    ++counters_.refused_notifies;
  }
}

}  // namespace podlink::mesh
