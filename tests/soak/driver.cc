#include "tests/soak/driver.h"

#include <poll.h>
#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <list>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "tests/soak/daemon_process.h"
#include "tests/soak/pattern.h"
#include "tests/soak/pods.h"

namespace podlink::soak {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One line of output, flushed (the log is read while the soak runs).
template <typename... Args>
void Say(const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  std::string s = absl::StrFormat(fmt, args...);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// What each cycle does, decided by (seed, cycle number) alone.

enum class Fault {
  kNone,
  kKillExporter,        // SIGKILL the exporter (phase: export, import or release)
  kKillImporter,        // SIGKILL the importer during its import
  kCloseExporter,       // close the exporter's session mid-call (export or release)
  kCloseImporter,       // close the importer's session mid-call
  kExitOffersExporter,  // exporter exits with offers, its export and relay ring outstanding
  kExitOffersImporter,  // importer exits with offers outstanding after its import
};
constexpr int kFaultKinds = 6;

const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kNone:
      return "none";
    case Fault::kKillExporter:
      return "kill-exporter";
    case Fault::kKillImporter:
      return "kill-importer";
    case Fault::kCloseExporter:
      return "close-exporter-mid-call";
    case Fault::kCloseImporter:
      return "close-importer-mid-call";
    case Fault::kExitOffersExporter:
      return "exporter-exits-with-offers";
    case Fault::kExitOffersImporter:
      return "importer-exits-with-offers";
  }
  return "?";
}

enum Stage { kExport = 0, kImport = 1, kRelease = 2 };
const char* StageName(int s) { return s == kExport ? "export" : s == kImport ? "import" : "release"; }

struct Op {
  char type;  // 'w' or 'r'
  uint64_t off, len, loff, seed;
};

struct Plan {
  uint64_t cycle = 0;
  int slot = 0;
  uint64_t size = 0;
  bool fresh = false;
  uint64_t base = 0;
  std::vector<Op> ops;
  bool drop = false;
  Fault fault = Fault::kNone;
  int phase = -1;
  int delay_us = 0;
  int offers = 0;
  bool offer_ack = false;
};

uint64_t LogUniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)), std::log(static_cast<double>(hi) + 1));
  uint64_t v = static_cast<uint64_t>(std::exp(u(rng)));
  return std::clamp(v, lo, hi);
}

std::vector<uint64_t> SlotSizes(const SoakOptions& o) {
  std::mt19937_64 rng(Mix(o.seed ^ 0x51075));
  std::vector<uint64_t> s;
  for (int i = 0; i < o.slots; ++i) s.push_back(LogUniform(rng, o.min_region, o.max_region));
  // The extremes always take part.
  s[0] = o.max_region;
  if (o.slots > 1) s[1] = o.min_region;
  return s;
}

Plan MakePlan(const SoakOptions& o, const std::vector<uint64_t>& sizes, uint64_t cycle) {
  std::mt19937_64 rng(Mix(o.seed ^ Mix(cycle + 1)));
  std::uniform_real_distribution<double> u(0, 1);
  Plan p;
  p.cycle = cycle;
  p.slot = static_cast<int>(rng() % sizes.size());
  p.size = sizes[p.slot];
  p.fresh = rng() % 8 == 0;
  p.base = rng();
  int n = 1 + static_cast<int>(rng() % o.max_ops);
  uint64_t max_len = std::min(p.size, o.max_op);
  for (int k = 0; k < n; ++k) {
    Op op{};
    op.len = LogUniform(rng, 1, max_len);
    op.off = rng() % (p.size - op.len + 1);
    op.loff = rng() % (o.max_op - op.len + 1);
    if (rng() % 100 < 45) {
      op.type = 'w';
      op.seed = rng();
      p.ops.push_back(op);
      if (rng() % 2 == 0) {  // read it back through another part of the staging buffer
        Op back = op;
        back.type = 'r';
        back.loff = rng() % (o.max_op - op.len + 1);
        p.ops.push_back(back);
      }
    } else {
      op.type = 'r';
      p.ops.push_back(op);
    }
  }
  p.drop = u(rng) < o.drop_rate;
  if (u(rng) < o.fault_rate) {
    p.fault = static_cast<Fault>(1 + rng() % kFaultKinds);
    // Log-uniform: most faults strike within the first calls of their step,
    // some after it is over (the victim idle, holding what it made).
    p.delay_us = static_cast<int>(LogUniform(rng, 1, std::max(1, o.max_fault_delay_us))) - 1;
    switch (p.fault) {
      case Fault::kKillExporter:
        p.phase = static_cast<int>(rng() % 3);
        break;
      case Fault::kCloseExporter:
        p.phase = rng() % 2 == 0 ? kExport : kRelease;
        break;
      case Fault::kExitOffersExporter:
        p.phase = kRelease;
        p.offers = 1 + static_cast<int>(rng() % 8);
        p.offer_ack = rng() % 2 == 0;
        break;
      case Fault::kExitOffersImporter:
        p.phase = kImport;
        p.offers = 1 + static_cast<int>(rng() % 8);
        p.offer_ack = rng() % 2 == 0;
        break;
      default:
        p.phase = kImport;
        break;
    }
  }
  return p;
}

// ---------------------------------------------------------------------------

struct Cycle;

struct Worker {
  int index = 0;
  std::string name;
  std::unique_ptr<PodProcess> proc;
  enum State { kStarting, kIdle, kBound, kExiting } state = kStarting;
  Cycle* cycle = nullptr;
  bool expect_exit = false;
  Clock::time_point started;
  std::vector<bool> dirty;  // pool slots whose buffer a faulted cycle may still write
};

struct Cycle {
  Plan plan;
  int e = -1, i = -1;
  int stage = kExport;
  bool e_pending = false, i_pending = false;  // a reply is due
  bool e_dying = false, i_dying = false;      // killed, not reaped yet
  bool e_dead = false, i_dead = false;        // gone (or, for the importer, done with this cycle)
  bool kill_scheduled = false, kill_fired = false;
  int kill_target = -1;
  Clock::time_point kill_at;
  bool export_ok = false, e_reset = false, import_ok = false;
  std::string desc;
  Clock::time_point started;
};

struct Counters {
  uint64_t done = 0, clean = 0, faulted = 0;
  std::map<std::string, uint64_t> faults;  // by kind
  uint64_t drops = 0, restarts = 0, resets = 0, abandoned = 0, offers = 0;
  uint64_t bytes_checked = 0, mismatches = 0, notify_lost = 0;
  uint64_t unexpected_errors = 0, unexpected_exits = 0;
  std::map<std::string, uint64_t> fault_errors;  // expected errors by code
};

class Soak {
 public:
  explicit Soak(const SoakOptions& o) : o_(o), sizes_(SlotSizes(o)) {}

  int Run();

 private:
  // --- pods ---
  void StartWorker(Worker& w);
  void HandleLine(Worker& w, const json& j);
  void HandleDeath(Worker& w);
  // --- cycles ---
  void StartCycle(uint64_t number, int e, int i);
  void SendExport(Cycle& c);
  void SendImport(Cycle& c);
  void SendRelease(Cycle& c);
  void ScheduleKill(Cycle& c, int target);
  void FireKill(Cycle& c);
  void Advance(Cycle& c);
  void Finish(Cycle& c);
  void CheckReply(Cycle& c, Worker& w, int step, const json& j);
  // --- phases ---
  bool RunCycles(const std::string& phase, uint64_t first, uint64_t count);
  bool StopWorkers();
  DaemonSample Settle();
  void Progress(const std::string& phase, uint64_t done, uint64_t total, Clock::time_point t0);
  std::string SampleText(const DaemonSample& s) const;
  void PrintHeader();

  const SoakOptions o_;
  const std::vector<uint64_t> sizes_;
  std::string dir_;
  DaemonProcess daemon_;
  std::vector<PodCgroup> cgroups_;
  std::vector<Worker> workers_;
  std::list<Cycle> active_;
  Counters n_;
  std::mt19937_64 pick_rng_;
  bool ending_ = false;
  bool stuck_ = false;
};

void Soak::StartWorker(Worker& w) {
  std::vector<std::string> argv = {o_.self, "--worker", absl::StrCat("--pod=", w.index),
                                   absl::StrCat("--max_op=", o_.max_op),
                                   absl::StrCat("--relay_timeout_s=", o_.relay_timeout_s)};
  w.proc =
      std::make_unique<PodProcess>(cgroups_[w.index].path(), dir_, argv, absl::StrCat(dir_, "/", w.name, ".stderr"));
  w.state = Worker::kStarting;
  w.cycle = nullptr;
  w.expect_exit = false;
  w.started = Clock::now();
  w.dirty.assign(o_.slots, false);
}

void Soak::HandleLine(Worker& w, const json& j) {
  std::string ev = j.value("ev", "");
  if (j.value("abandoned", false)) {
    w.expect_exit = true;
    ++n_.abandoned;
  }
  if (j.value("exiting", false)) w.expect_exit = true;
  if (j.value("reset", false)) ++n_.resets;
  if (ev == "ready") {
    if (w.state == Worker::kStarting) w.state = Worker::kIdle;
    if (ending_ && w.state == Worker::kIdle) {
      w.proc->Send({{"op", "exit"}});
      w.expect_exit = true;
      w.state = Worker::kExiting;
    }
    return;
  }
  if (ev == "bye" || ev == "offer-exit") return;
  if (ev == "exported" || ev == "imported" || ev == "released") {
    Cycle* c = w.cycle;
    if (c == nullptr || j.value("cycle", uint64_t{0}) != c->plan.cycle) {
      ++n_.unexpected_errors;
      Say("error: %s answered for no cycle of its own: %s", w.name, j.dump());
      return;
    }
    int step = ev == "exported" ? kExport : ev == "imported" ? kImport : kRelease;
    CheckReply(*c, w, step, j);
    if (step == kExport) {
      c->e_pending = false;
      c->export_ok = j.value("ok", false);
      c->e_reset = j.value("reset", false);
      c->desc = j.value("desc", "");
    } else if (step == kImport) {
      c->i_pending = false;
      c->import_ok = j.value("ok", false);
      if (c->import_ok && c->plan.drop) ++n_.drops;
    } else {
      c->e_pending = false;
    }
    Advance(*c);
    return;
  }
  // "fatal", "garbage" or anything else: the worker cannot go on.
  if (!w.expect_exit) {
    ++n_.unexpected_errors;
    Say("error: %s: %s", w.name, j.dump());
  }
}

// Whether a failed step is the fault's doing: the importer of an exporter
// killed before or during the import; every later step after the exporter's
// session was closed during its export; the step whose session was closed
// under it. A worker killed or told to exit answered before that, so its
// answers must be right; so must the partner's, unless it used the victim's
// memory.
bool ErrorExpected(const Plan& p, bool is_exporter, int step) {
  switch (p.fault) {
    case Fault::kKillExporter:
      return !is_exporter && step == kImport && p.phase <= kImport;
    case Fault::kCloseExporter:
      return p.phase == kExport || (is_exporter && step == kRelease);
    case Fault::kCloseImporter:
      return !is_exporter && step == kImport;
    default:
      return false;
  }
}

// Counts what a reply says: bytes checked, mismatches, notifications, and
// failures the cycle's fault does not explain.
void Soak::CheckReply(Cycle& c, Worker& w, int step, const json& j) {
  uint64_t bad = j.value("mismatch", uint64_t{0});
  n_.bytes_checked += j.value("bytes", uint64_t{0});
  if (step == kRelease && j.contains("mismatch")) n_.bytes_checked += c.plan.size;
  if (bad != 0) {
    n_.mismatches += bad;
    Say("MISMATCH: cycle=%d step=%s pod=%s bytes=%d fault=%s reply=%s", c.plan.cycle, StageName(step), w.name, bad,
        FaultName(c.plan.fault), j.dump());
  }
  if (step == kRelease && j.value("ok", false) && j.contains("notified") && !j.value("notified", false)) {
    ++n_.notify_lost;
    Say("NOTIFY-LOST: cycle=%d exporter=%s never saw the importer's notification", c.plan.cycle, w.name);
  }
  if (j.value("ok", false)) return;
  if (ErrorExpected(c.plan, w.index == c.e, step)) {
    ++n_.fault_errors[absl::StrCat(StageName(step), ":", j.value("code", "?"))];
    if (o_.verbose) {
      Say("expected-error: cycle=%d step=%s pod=%s fault=%s phase=%s delay_us=%d reply=%s", c.plan.cycle,
          StageName(step), w.name, FaultName(c.plan.fault), StageName(c.plan.phase), c.plan.delay_us, j.dump());
    }
    return;
  }
  ++n_.unexpected_errors;
  Say("ERROR: cycle=%d step=%s pod=%s fault=%s reply=%s", c.plan.cycle, StageName(step), w.name,
      FaultName(c.plan.fault), j.dump());
}

void Soak::HandleDeath(Worker& w) {
  if (!w.expect_exit) {
    ++n_.unexpected_exits;
    std::ifstream f(absl::StrCat(dir_, "/", w.name, ".stderr"));
    std::stringstream ss;
    ss << f.rdbuf();
    std::string err = ss.str();
    if (err.size() > 2000) err = err.substr(err.size() - 2000);
    Say("ERROR: %s exited unexpectedly (status %d); its stderr ends: %s", w.name, w.proc->exit_code(), err);
  }
  Cycle* c = w.cycle;
  w.cycle = nullptr;
  w.proc.reset();
  if (!ending_) {
    ++n_.restarts;
    StartWorker(w);
  }
  if (c != nullptr) {
    if (c->e == w.index) {
      c->e_dead = true;
      c->e_pending = c->e_dying = false;
    }
    if (c->i == w.index) {
      c->i_dead = true;
      c->i_pending = c->i_dying = false;
    }
    Advance(*c);
  }
}

void Soak::StartCycle(uint64_t number, int e, int i) {
  active_.emplace_back();
  Cycle& c = active_.back();
  c.plan = MakePlan(o_, sizes_, number);
  c.e = e;
  c.i = i;
  c.started = Clock::now();
  for (int k : {e, i}) {
    workers_[k].state = Worker::kBound;
    workers_[k].cycle = &c;
  }
  if (c.plan.fault != Fault::kNone) {
    ++n_.faults[FaultName(c.plan.fault)];
    Say("fault: cycle=%d kind=%s phase=%s delay_us=%d exporter=%s importer=%s%s", number, FaultName(c.plan.fault),
        StageName(c.plan.phase), c.plan.delay_us, workers_[e].name, workers_[i].name,
        c.plan.offers ? absl::StrCat(" offers=", c.plan.offers, c.plan.offer_ack ? " acked" : " unacked") : "");
  }
  SendExport(c);
}

void Soak::SendExport(Cycle& c) {
  Worker& w = workers_[c.e];
  json cmd = {{"op", "export"},
              {"cycle", c.plan.cycle},
              {"slot", c.plan.slot},
              {"size", c.plan.size},
              {"fresh", c.plan.fresh || w.dirty[c.plan.slot]},
              {"seed", c.plan.base}};
  w.dirty[c.plan.slot] = false;
  if (c.plan.fault == Fault::kCloseExporter && c.plan.phase == kExport) cmd["close_us"] = c.plan.delay_us;
  c.e_pending = true;
  w.proc->Send(cmd);
  if (c.plan.fault == Fault::kKillExporter && c.plan.phase == kExport) ScheduleKill(c, c.e);
}

void Soak::SendImport(Cycle& c) {
  c.stage = kImport;
  json ops = json::array();
  for (const Op& op : c.plan.ops) {
    if (op.type == 'w') {
      ops.push_back({"w", op.off, op.len, op.loff, op.seed});
    } else {
      ops.push_back({"r", op.off, op.len, op.loff});
    }
  }
  uint64_t base = c.plan.base;
  if (static_cast<int64_t>(c.plan.cycle) == o_.corrupt_cycle) {
    base ^= 1;  // the importer now expects other bytes than the exporter wrote
    Say("corrupt: cycle=%d importer=%s told a wrong pattern seed", c.plan.cycle, workers_[c.i].name);
  }
  json cmd = {{"op", "import"}, {"cycle", c.plan.cycle}, {"desc", c.desc}, {"base", base},
              {"ops", ops},     {"drop", c.plan.drop}};
  if (c.plan.fault == Fault::kCloseImporter) cmd["close_us"] = c.plan.delay_us;
  c.i_pending = true;
  workers_[c.i].proc->Send(cmd);
  if (c.plan.fault == Fault::kKillExporter && c.plan.phase == kImport) ScheduleKill(c, c.e);
  if (c.plan.fault == Fault::kKillImporter) ScheduleKill(c, c.i);
}

void Soak::SendRelease(Cycle& c) {
  c.stage = kRelease;
  json writes = json::array();
  for (const Op& op : c.plan.ops) {
    if (op.type == 'w') writes.push_back({op.off, op.len, op.seed});
  }
  json cmd = {{"op", "release"}, {"cycle", c.plan.cycle}, {"verify", c.import_ok && !c.e_reset}, {"writes", writes}};
  if (c.plan.fault == Fault::kCloseExporter && c.plan.phase == kRelease) cmd["close_us"] = c.plan.delay_us;
  if (c.plan.fault == Fault::kExitOffersExporter) {
    cmd["exit_offers"] = c.plan.offers;
    cmd["exit_ack"] = c.plan.offer_ack;
    workers_[c.e].expect_exit = true;
    n_.offers += c.plan.offers;
  }
  c.e_pending = true;
  workers_[c.e].proc->Send(cmd);
  if (c.plan.fault == Fault::kKillExporter && c.plan.phase == kRelease) ScheduleKill(c, c.e);
}

void Soak::ScheduleKill(Cycle& c, int target) {
  c.kill_scheduled = true;
  c.kill_target = target;
  c.kill_at = Clock::now() + std::chrono::microseconds(c.plan.delay_us);
}

void Soak::FireKill(Cycle& c) {
  c.kill_fired = true;
  Worker& w = workers_[c.kill_target];
  bool dead = c.kill_target == c.e ? c.e_dead : c.i_dead;
  if (!dead && w.cycle == &c && w.proc != nullptr && !w.proc->reaped()) {
    w.proc->Kill();
    w.expect_exit = true;
    // Wait for it to be reaped before the cycle goes on.
    if (c.kill_target == c.e) c.e_dying = true;
    if (c.kill_target == c.i) c.i_dying = true;
  }
  Advance(c);
}

void Soak::Advance(Cycle& c) {
  if (c.kill_scheduled && !c.kill_fired) return;
  if (c.e_pending || c.i_pending || c.e_dying || c.i_dying) return;
  switch (c.stage) {
    case kExport:
      if (c.e_dead || !c.export_ok) return Finish(c);
      return SendImport(c);
    case kImport: {
      if (!c.i_dead) {
        Worker& w = workers_[c.i];
        w.cycle = nullptr;
        c.i_dead = true;  // no longer part of this cycle
        if (c.plan.fault == Fault::kExitOffersImporter) {
          w.proc->Send({{"op", "offer-exit"}, {"n", c.plan.offers}, {"ack", c.plan.offer_ack}});
          w.expect_exit = true;
          w.state = Worker::kExiting;
          n_.offers += c.plan.offers;
        } else {
          w.state = w.expect_exit ? Worker::kExiting : Worker::kIdle;  // abandoned: exits by itself
        }
      }
      if (c.e_dead) return Finish(c);
      return SendRelease(c);
    }
    default:
      return Finish(c);
  }
}

void Soak::Finish(Cycle& c) {
  ++n_.done;
  if (c.plan.fault == Fault::kNone) {
    ++n_.clean;
  } else {
    ++n_.faulted;
  }
  for (int k : {c.e, c.i}) {
    Worker& w = workers_[k];
    if (w.cycle != &c) continue;
    w.cycle = nullptr;
    if (w.state == Worker::kBound) w.state = w.expect_exit ? Worker::kExiting : Worker::kIdle;
  }
  // A buffer a failed or faulted cycle may still be written into by a late
  // transfer is not reused.
  if (c.plan.fault != Fault::kNone || !c.import_ok) workers_[c.e].dirty[c.plan.slot] = true;
  active_.remove_if([&](const Cycle& x) { return &x == &c; });
}

// Mappings added, less the stack and guard page of each thread added: the
// daemon's gRPC pools (default executor and resolver: up to 2 threads per
// core each; timer threads) grow on demand and do not shrink.
int MapsNet(const DaemonSample& base, const DaemonSample& fin) {
  return fin.maps - base.maps - 2 * std::max(0, fin.threads - base.threads);
}

std::string Soak::SampleText(const DaemonSample& s) const {
  return absl::StrFormat("fds=%d maps=%d rss_kib=%d threads=%d sessions=%.0f exports=%.0f rings=%.0f", s.fds, s.maps,
                         s.rss_kib, s.threads, s.Metric("podlink_sessions"), s.Metric("podlink_exports"),
                         s.Metric("podlink_relay_rings"));
}

void Soak::Progress(const std::string& phase, uint64_t done, uint64_t total, Clock::time_point t0) {
  DaemonSample s = daemon_.Sample();
  double t = Seconds(Clock::now() - t0);
  Say("progress: phase=%s t=%.1f cycles=%d/%d clean=%d faulted=%d rate=%.1f %s relay_ops=%.0f relay_gib=%.2f "
      "restarts=%d resets=%d errors=%d mismatches=%d",
      phase, t, done, total, n_.clean, n_.faulted, t > 0 ? done / t : 0.0, SampleText(s),
      s.Metric("podlink_relay_ops_total"), s.Metric("podlink_relay_bytes_total") / (1 << 30), n_.restarts, n_.resets,
      n_.unexpected_errors + n_.unexpected_exits, n_.mismatches);
}

// Runs `count` cycles numbered from `first` with every pod's worker up.
bool Soak::RunCycles(const std::string& phase, uint64_t first, uint64_t count) {
  ending_ = false;
  for (Worker& w : workers_) StartWorker(w);
  uint64_t started = 0;
  uint64_t done0 = n_.done;
  Clock::time_point t0 = Clock::now(), next_progress = t0 + std::chrono::seconds(o_.progress_s);
  int parallel = o_.parallel > 0 ? o_.parallel : std::max(1, o_.pods / 2);
  for (;;) {
    // Start cycles on random pairs of idle pods.
    while (static_cast<int>(active_.size()) < parallel && started < count) {
      std::vector<int> idle;
      for (const Worker& w : workers_) {
        if (w.state == Worker::kIdle) idle.push_back(w.index);
      }
      if (idle.size() < 2) break;
      std::shuffle(idle.begin(), idle.end(), pick_rng_);
      StartCycle(first + started++, idle[0], idle[1]);
    }
    if (started == count && active_.empty()) break;

    std::vector<pollfd> fds;
    std::vector<int> who;
    bool unreaped = false;
    for (const Worker& w : workers_) {
      if (w.proc == nullptr) continue;
      if (!w.proc->eof()) {
        fds.push_back({w.proc->out_fd(), POLLIN, 0});
        who.push_back(w.index);
      } else {
        unreaped = true;
      }
    }
    Clock::time_point now = Clock::now();
    int timeout = unreaped ? 2 : 50;
    for (const Cycle& c : active_) {
      if (c.kill_scheduled && !c.kill_fired) {
        int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(c.kill_at - now).count());
        timeout = std::clamp(ms, 0, timeout);
      }
    }
    ::poll(fds.data(), fds.size(), timeout);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Worker& w = workers_[who[k]];
      for (const json& j : w.proc->ReadLines()) {
        HandleLine(w, j);
        if (w.proc == nullptr) break;
      }
    }
    for (Worker& w : workers_) {
      if (w.proc != nullptr && w.proc->Reap()) {
        for (const json& j : w.proc->ReadLines()) HandleLine(w, j);  // its last words
        HandleDeath(w);
      }
    }
    now = Clock::now();
    // Kill timers (a cycle may finish while another fires: collect first).
    std::vector<Cycle*> due;
    for (Cycle& c : active_) {
      if (c.kill_scheduled && !c.kill_fired && now >= c.kill_at) due.push_back(&c);
    }
    for (Cycle* c : due) FireKill(*c);
    for (const Cycle& c : active_) {
      if (now - c.started > std::chrono::seconds(o_.stuck_s)) {
        Say("STUCK: cycle=%d stage=%s exporter=%s importer=%s e_pending=%d i_pending=%d e_dying=%d i_dying=%d "
            "fault=%s age_s=%.0f",
            c.plan.cycle, StageName(c.stage), workers_[c.e].name, workers_[c.i].name, c.e_pending, c.i_pending,
            c.e_dying, c.i_dying, FaultName(c.plan.fault), Seconds(now - c.started));
        stuck_ = true;
        return false;
      }
    }
    if (now >= next_progress) {
      Progress(phase, n_.done - done0, count, t0);
      next_progress += std::chrono::seconds(o_.progress_s);
    }
    if (!daemon_.Alive()) {
      Say("ERROR: podlinkd died during the %s (%s)", phase, daemon_.end());
      return false;
    }
    if (n_.unexpected_errors + n_.unexpected_exits > 100) {
      Say("ERROR: more than 100 unexpected errors; stopping the %s", phase);
      return false;
    }
  }
  Progress(phase, n_.done - done0, count, t0);
  return true;
}

// Asks every worker to exit and waits until all are gone.
bool Soak::StopWorkers() {
  ending_ = true;
  // Cycles left by an aborted run: their pods are killed.
  for (Cycle& c : active_) {
    for (int k : {c.e, c.i}) {
      Worker& w = workers_[k];
      if (w.cycle != &c) continue;
      w.cycle = nullptr;
      w.expect_exit = true;
      if (w.proc != nullptr) w.proc->Kill();
    }
  }
  active_.clear();
  for (Worker& w : workers_) {
    if (w.proc != nullptr && w.state == Worker::kIdle) {
      w.proc->Send({{"op", "exit"}});
      w.expect_exit = true;
      w.state = Worker::kExiting;
    }
  }
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    bool any = false;
    for (Worker& w : workers_) {
      if (w.proc == nullptr) continue;
      any = true;
      for (const json& j : w.proc->ReadLines()) HandleLine(w, j);
      if (w.proc->Reap()) HandleDeath(w);
    }
    if (!any) return true;
    if (Clock::now() > deadline) {
      for (Worker& w : workers_) {
        if (w.proc == nullptr) continue;
        Say("ERROR: %s did not exit within 60 s; killed", w.name);
        ++n_.unexpected_exits;
        w.expect_exit = true;
        w.proc.reset();  // SIGKILL and reap
      }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// After the pods are gone: waits until the daemon has no sessions, exports or
// rings and its descriptor and mapping counts hold still, then samples.
DaemonSample Soak::Settle() {
  Clock::time_point t0 = Clock::now(), deadline = t0 + std::chrono::seconds(o_.settle_s);
  DaemonSample prev = daemon_.Sample();
  int stable = 0;
  while (Clock::now() < deadline && stable < 4) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    DaemonSample s = daemon_.Sample();
    bool quiet =
        s.Metric("podlink_sessions") == 0 && s.Metric("podlink_exports") == 0 && s.Metric("podlink_relay_rings") == 0;
    stable = quiet && s.fds == prev.fds && s.maps == prev.maps ? stable + 1 : 0;
    prev = s;
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  DaemonSample s = daemon_.Sample();
  Say("settled: after_s=%.1f %s", Seconds(Clock::now() - t0), SampleText(s));
  return s;
}

void Soak::PrintHeader() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  utsname u{};
  ::uname(&u);
  long mem_kib = 0;
  {
    std::ifstream f("/proc/meminfo");
    std::string k;
    f >> k >> mem_kib;
  }
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  Say("soak: podlink soak (tests/soak) date=%s", date);
  Say("machine: host=%s nproc=%d mem_kib=%d kernel=%s arch=%s", host, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)),
      mem_kib, u.release, u.machine);
  Say("command: %s", o_.command_line);
  Say("options: seed=%d pods=%d parallel=%d cycles=%d warmup=%d fault_rate=%g drop_rate=%g slots=%d min_region=%d "
      "max_region=%d max_op=%d max_ops=%d max_fault_delay_us=%d daemon_log_level=%s fd_tolerance=%d "
      "maps_tolerance=%d thread_tolerance=%d rss_tolerance_kib=%d",
      o_.seed, o_.pods, o_.parallel > 0 ? o_.parallel : std::max(1, o_.pods / 2), o_.cycles, o_.warmup, o_.fault_rate,
      o_.drop_rate, o_.slots, o_.min_region, o_.max_region, o_.max_op, o_.max_ops, o_.max_fault_delay_us,
      o_.daemon_log_level, o_.fd_tolerance, o_.maps_tolerance, o_.thread_tolerance, o_.rss_tolerance_kib);
  Say("region sizes: %s", absl::StrJoin(sizes_, ","));
}

int Soak::Run() {
  ::signal(SIGPIPE, SIG_IGN);
  pick_rng_.seed(Mix(o_.seed ^ 0x9a1c));
  PrintHeader();
  char tmpl[] = "/tmp/podlink-soak-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    Say("ERROR: mkdtemp");
    return 2;
  }
  dir_ = tmpl;

  json config = {{"identity", {{"kubelet_cgroup_roots", {"/", "/kubelet.slice", SoakKubeletRoot()}}}},
                 {"pods", json::array()}};
  for (int k = 0; k < o_.pods; ++k) {
    auto cg = PodCgroup::Create(RandomPodUid());
    if (!cg.ok()) {
      Say("ERROR: %s", cg.status().ToString());
      return 2;
    }
    config["pods"].push_back({{"match", {{"pod_uid", cg->pod_uid()}}},
                              {"namespace", "soak"},
                              {"name", absl::StrCat("pod-", k)},
                              {"annotations", {{"podlink.io/peer-group", "soak"}}}});
    cgroups_.push_back(*std::move(cg));
    Worker w;
    w.index = k;
    w.name = absl::StrCat("pod-", k);
    workers_.push_back(std::move(w));
  }
  absl::Status st = daemon_.Start(o_.podlinkd, dir_, config.dump(), {"--log-level", o_.daemon_log_level});
  if (!st.ok()) {
    Say("ERROR: %s", st.ToString());
    return 2;
  }
  Say("podlinkd: pid=%d socket_dir=%s metrics=127.0.0.1:%d log=%s", daemon_.pid(), dir_, daemon_.metrics_port(),
      daemon_.log_path());
  DaemonSample start = daemon_.Sample();
  Say("start: %s", SampleText(start));

  Clock::time_point t0 = Clock::now();
  bool ok = true;
  DaemonSample base = start;
  std::vector<std::string> base_fds = daemon_.FdTargets(), base_maps = daemon_.MapKinds(),
                           base_threads = daemon_.ThreadNames();
  if (o_.warmup > 0) {
    ok = RunCycles("warmup", 0, o_.warmup) && StopWorkers();
    if (ok) {
      base = Settle();
      base_fds = daemon_.FdTargets();
      base_maps = daemon_.MapKinds();
      base_threads = daemon_.ThreadNames();
      Say("baseline: %s", SampleText(base));
    }
  }
  Counters warm = n_;
  n_ = Counters();
  std::vector<std::string> why;
  if (warm.mismatches + warm.notify_lost + warm.unexpected_errors + warm.unexpected_exits > 0) {
    why.push_back(absl::StrCat("warm-up: ", warm.mismatches, " bytes mismatched, ", warm.notify_lost,
                               " notifications lost, ", warm.unexpected_errors, " unexpected errors, ",
                               warm.unexpected_exits, " unexpected worker exits"));
  }
  Clock::time_point t1 = Clock::now();
  if (ok) ok = RunCycles("soak", o_.warmup, o_.cycles);
  double soak_s = Seconds(Clock::now() - t1);
  if (!StopWorkers()) ok = false;
  bool alive = daemon_.Alive();
  DaemonSample fin = alive ? Settle() : DaemonSample();
  if (alive) {
    Say("final: %s", SampleText(fin));
    Say("fds-diff: %s", DiffKinds(base_fds, daemon_.FdTargets()));
    Say("maps-diff: %s", DiffKinds(base_maps, daemon_.MapKinds()));
    Say("threads-diff: %s (all: %s)", DiffKinds(base_threads, daemon_.ThreadNames()),
        DiffKinds({}, daemon_.ThreadNames()));
  }

  if (!alive) why.push_back(absl::StrCat("podlinkd died (", daemon_.end(), ")"));
  if (stuck_) why.push_back("a cycle got stuck");
  if (n_.done != o_.cycles) why.push_back(absl::StrCat("only ", n_.done, " of ", o_.cycles, " cycles ran"));
  if (n_.mismatches) why.push_back(absl::StrCat(n_.mismatches, " bytes mismatched"));
  if (n_.notify_lost) why.push_back(absl::StrCat(n_.notify_lost, " notifications lost"));
  if (n_.unexpected_errors) why.push_back(absl::StrCat(n_.unexpected_errors, " unexpected errors"));
  if (n_.unexpected_exits) why.push_back(absl::StrCat(n_.unexpected_exits, " unexpected worker exits"));
  if (alive) {
    if (fin.fds - base.fds > o_.fd_tolerance) {
      why.push_back(absl::StrCat("descriptors ", base.fds, " -> ", fin.fds));
    }
    if (fin.threads - base.threads > o_.thread_tolerance) {
      why.push_back(absl::StrCat("threads ", base.threads, " -> ", fin.threads));
    }
    if (MapsNet(base, fin) > o_.maps_tolerance) {
      why.push_back(absl::StrCat("mappings ", base.maps, " -> ", fin.maps, " with ", fin.threads - base.threads,
                                 " threads more"));
    }
    if (fin.rss_kib - base.rss_kib > o_.rss_tolerance_kib) {
      why.push_back(absl::StrCat("RSS ", base.rss_kib, " -> ", fin.rss_kib, " KiB"));
    }
    if (fin.Metric("podlink_sessions") != 0 || fin.Metric("podlink_exports") != 0 ||
        fin.Metric("podlink_relay_rings") != 0) {
      why.push_back("sessions, exports or rings left in the daemon");
    }
  }
  int daemon_exit = daemon_.Stop();
  if (alive && daemon_exit != 0) why.push_back(absl::StrCat("podlinkd exited ", daemon_exit, " on SIGTERM"));

  std::string faults;
  for (const auto& [k, v] : n_.faults) absl::StrAppend(&faults, faults.empty() ? "" : ",", k, ":", v);
  std::string ferr;
  for (const auto& [k, v] : n_.fault_errors) absl::StrAppend(&ferr, ferr.empty() ? "" : ",", k, ":", v);
  Say("summary: cycles=%d clean=%d faulted=%d seconds=%.1f rate=%.1f drops=%d restarts=%d resets=%d abandoned=%d "
      "offers_left=%d bytes_checked=%d mismatches=%d notify_lost=%d unexpected_errors=%d unexpected_exits=%d "
      "warmup_cycles=%d total_seconds=%.1f",
      n_.done, n_.clean, n_.faulted, soak_s, soak_s > 0 ? n_.done / soak_s : 0.0, n_.drops, n_.restarts, n_.resets,
      n_.abandoned, n_.offers, n_.bytes_checked, n_.mismatches, n_.notify_lost, n_.unexpected_errors,
      n_.unexpected_exits, warm.done, Seconds(Clock::now() - t0));
  Say("faults: %s", faults.empty() ? "none" : faults);
  Say("expected-errors: %s", ferr.empty() ? "none" : ferr);
  Say("relay: ops=%.0f bytes=%.0f failed=%.0f notifies=%.0f broken_rings=%.0f sessions_total=%.0f exports_total=%.0f "
      "imports_total=%.0f",
      fin.Metric("podlink_relay_ops_total"), fin.Metric("podlink_relay_bytes_total"),
      fin.Metric("podlink_relay_failed_total"), fin.Metric("podlink_relay_notifies_total"),
      fin.Metric("podlink_relay_broken_rings_total"), fin.Metric("podlink_sessions_total"),
      fin.Metric("podlink_exports_total"), fin.Metric("podlink_imports_total"));
  Say("delta: fds=%+d maps=%+d maps_net=%+d rss_kib=%+d threads=%+d (final - baseline; maps_net: less two per "
      "thread added; start: fds=%d maps=%d rss_kib=%d threads=%d)",
      fin.fds - base.fds, fin.maps - base.maps, MapsNet(base, fin), fin.rss_kib - base.rss_kib,
      fin.threads - base.threads, start.fds, start.maps, start.rss_kib, start.threads);
  {
    // The daemon's log at --log-level warn: every line is worth a look.
    std::ifstream f(daemon_.log_path());
    std::string line, last;
    std::map<std::string, int> by_event;
    int lines = 0;
    while (std::getline(f, line)) {
      ++lines;
      size_t at = line.find("event=");
      std::string ev = at == std::string::npos ? "other" : line.substr(at + 6, line.find(' ', at) - at - 6);
      ++by_event[ev];
      last = line;
    }
    std::string evs;
    for (const auto& [k, v] : by_event) absl::StrAppend(&evs, evs.empty() ? "" : ",", k, ":", v);
    Say("daemon-log: lines=%d events=%s", lines, evs.empty() ? "none" : evs);
    if (!why.empty() && !last.empty()) Say("daemon-log-last: %s", last);
  }
  workers_.clear();
  cgroups_.clear();
  RemoveSharedCgroups();
  if (why.empty()) {
    Say("result: PASS");
    std::string cmd = absl::StrCat("rm -rf '", dir_, "'");
    (void)!std::system(cmd.c_str());
    return 0;
  }
  Say("result: FAIL %s (daemon log and pod stderr kept in %s)", absl::StrJoin(why, "; "), dir_);
  return 1;
}

}  // namespace

int RunSoak(const SoakOptions& options) {
  Soak s(options);
  return s.Run();
}

}  // namespace podlink::soak
