#include "daemon/broker/grpc_service.h"

#include <deque>

#include "common/status_util.h"

namespace podlink {
namespace {

absl::StatusOr<std::shared_ptr<Session>> SessionOf(Broker* broker, grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kSessionMetadataKey);
  absl::string_view cred = it == md.end() ? absl::string_view() : absl::string_view(it->second.data(), it->second.size());
  return broker->Authenticate(cred);
}

// Runs `fn(session)` and finishes the call with its status.
template <typename Fn>
grpc::ServerUnaryReactor* Unary(Broker* broker, grpc::CallbackServerContext* ctx, Fn fn) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  absl::StatusOr<std::shared_ptr<Session>> s = SessionOf(broker, ctx);
  r->Finish(ToGrpcStatus(s.ok() ? fn(**s) : s.status()));
  return r;
}

template <typename T>
absl::Status Assign(absl::StatusOr<T> v, T* out) {
  if (!v.ok()) return v.status();
  *out = *std::move(v);
  return absl::OkStatus();
}

// A Watch stream: events queue up and are written one at a time. StartWrite
// and Finish are always called with mu_ released, since gRPC may run
// reactions inline.
class WatchReactor : public grpc::ServerWriteReactor<v1::Event>, public EventSink {
 public:
  static constexpr size_t kMaxQueued = 4096;

  void Begin(std::shared_ptr<WatchReactor> self) {
    absl::MutexLock l(&mu_);
    self_ = std::move(self);
  }

  void Push(const v1::Event& e) override {
    Action a;
    {
      absl::MutexLock l(&mu_);
      if (finishing_ || done_) return;
      if (queue_.size() >= kMaxQueued) {
        // A client that never reads its stream loses the stream, not the
        // daemon's memory.
        finishing_ = true;
        final_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                     "watch stream not drained; events dropped");
        DropQueuedLocked();
        a = NextLocked();
      } else {
        queue_.push_back(e);
        a = NextLocked();
      }
    }
    Run(a);
  }

  void Close(const v1::Event& final_event) override {
    Action a;
    {
      absl::MutexLock l(&mu_);
      if (finishing_ || done_) return;
      queue_.push_back(final_event);
      finishing_ = true;
      a = NextLocked();
    }
    Run(a);
  }

  bool done() const override {
    absl::MutexLock l(&mu_);
    return done_ || finishing_;
  }

  void OnWriteDone(bool ok) override {
    Action a;
    {
      absl::MutexLock l(&mu_);
      writing_ = false;
      if (!queue_.empty()) queue_.pop_front();
      if (!ok) {
        finishing_ = true;
        queue_.clear();
        final_status_ = grpc::Status::CANCELLED;
      }
      a = NextLocked();
    }
    Run(a);
  }

  void OnCancel() override {
    Action a;
    {
      absl::MutexLock l(&mu_);
      finishing_ = true;
      DropQueuedLocked();
      final_status_ = grpc::Status::CANCELLED;
      a = NextLocked();
    }
    Run(a);
  }

  void OnDone() override {
    std::shared_ptr<WatchReactor> keep;
    {
      absl::MutexLock l(&mu_);
      done_ = true;
      keep = std::move(self_);
    }
    // `keep` may hold the last reference; this object can die on return.
  }

  // Ends the stream at once with `st` (used when Watch is refused).
  void FinishNow(const grpc::Status& st) {
    {
      absl::MutexLock l(&mu_);
      finishing_ = true;
      finished_ = true;
    }
    Finish(st);
  }

 private:
  struct Action {
    const v1::Event* write = nullptr;
    bool finish = false;
    grpc::Status status;
  };

  // Drops queued events, except the one being written.
  void DropQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_) {
      queue_.erase(queue_.begin() + 1, queue_.end());
    } else {
      queue_.clear();
    }
  }

  Action NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Action a;
    if (writing_ || finished_) return a;
    if (!queue_.empty()) {
      writing_ = true;
      a.write = &queue_.front();  // stable: deque front is not popped while writing_
    } else if (finishing_) {
      finished_ = true;
      a.finish = true;
      a.status = final_status_;
    }
    return a;
  }

  void Run(const Action& a) {
    if (a.write != nullptr) StartWrite(a.write);
    if (a.finish) Finish(a.status);
  }

  mutable absl::Mutex mu_;
  std::deque<v1::Event> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // no more events accepted
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Finish called
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
  std::shared_ptr<WatchReactor> self_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerUnaryReactor* BrokerService::GetNodeInfo(grpc::CallbackServerContext* ctx,
                                                     const v1::GetNodeInfoRequest*, v1::NodeInfo* resp) {
  return Unary(broker_, ctx, [&](Session&) {
    *resp = broker_->GetNodeInfo();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* BrokerService::WhoAmI(grpc::CallbackServerContext* ctx, const v1::WhoAmIRequest*,
                                                v1::WhoAmIResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) {
    *resp = broker_->WhoAmI(s);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* BrokerService::Export(grpc::CallbackServerContext* ctx, const v1::ExportRequest* req,
                                                v1::ExportResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->Export(s, *req), resp); });
}

grpc::ServerUnaryReactor* BrokerService::Import(grpc::CallbackServerContext* ctx, const v1::ImportRequest* req,
                                                v1::ImportResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->Import(s, *req), resp); });
}

grpc::ServerUnaryReactor* BrokerService::Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest* req,
                                                 v1::ReleaseResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->Release(s, *req), resp); });
}

grpc::ServerUnaryReactor* BrokerService::List(grpc::CallbackServerContext* ctx, const v1::ListRequest*,
                                              v1::ListResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) {
    *resp = broker_->List(s);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* BrokerService::OpenRelay(grpc::CallbackServerContext* ctx, const v1::OpenRelayRequest* req,
                                                   v1::OpenRelayResponse* resp) {
  return Unary(broker_, ctx, [&](Session& s) { return Assign(broker_->OpenRelay(s, *req), resp); });
}

grpc::ServerWriteReactor<v1::Event>* BrokerService::Watch(grpc::CallbackServerContext* ctx,
                                                          const v1::WatchRequest*) {
  auto reactor = std::make_shared<WatchReactor>();
  reactor->Begin(reactor);
  absl::StatusOr<std::shared_ptr<Session>> s = SessionOf(broker_, ctx);
  absl::Status st = s.ok() ? broker_->AddWatcher(**s, reactor) : s.status();
  if (!st.ok()) reactor->FinishNow(ToGrpcStatus(st));
  return reactor.get();
}

}  // namespace podlink
