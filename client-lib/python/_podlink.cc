// _podlink: the pybind11 module under `import podlink` (client-lib/python/podlink/).
// A thin face of libpodlink's public C++ API (podlink/client.h, podlink/transfer.h):
// it converts arguments and results, releases the GIL around every call that can
// block, and turns absl::Status into Python exceptions in one place
// (RaiseStatus). Conveniences (numpy/torch views, context managers, stream
// order) live in the pure-Python package.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

namespace py = pybind11;

namespace podlink::python {
namespace {

// --- errors ------------------------------------------------------------------

// A Status on its way to Python (thrown, translated by the registered translator).
struct StatusError {
  absl::Status status;
};

[[noreturn]] void Throw(absl::Status s) { throw StatusError{std::move(s)}; }

void Check(const absl::Status& s) {
  if (!s.ok()) Throw(s);
}

template <typename T>
T Unwrap(absl::StatusOr<T> v) {
  if (!v.ok()) Throw(v.status());
  return *std::move(v);
}

// Exception classes by status code, made at import (see PYBIND11_MODULE).
struct Errors {
  py::object base, permission, not_found, timeout, invalid, unavailable, precondition, exists, exhausted;
};
Errors* errors = nullptr;

py::object ClassFor(absl::StatusCode c) {
  switch (c) {
    case absl::StatusCode::kPermissionDenied:
      return errors->permission;
    case absl::StatusCode::kNotFound:
      return errors->not_found;
    case absl::StatusCode::kDeadlineExceeded:
      return errors->timeout;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return errors->invalid;
    case absl::StatusCode::kUnavailable:
      return errors->unavailable;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return errors->precondition;
    case absl::StatusCode::kAlreadyExists:
      return errors->exists;
    case absl::StatusCode::kResourceExhausted:
      return errors->exhausted;
    default:
      return errors->base;
  }
}

void RaiseStatus(const absl::Status& s) {
  py::object cls = ClassFor(s.code());
  py::object e = cls(std::string(s.message()));
  e.attr("code") = std::string(absl::StatusCodeToString(s.code()));
  PyErr_SetObject(cls.ptr(), e.ptr());
}

py::object MakeError(py::module_& m, const char* name, const char* doc, py::handle base, py::handle builtin) {
  py::tuple bases = builtin ? py::make_tuple(base, builtin) : py::make_tuple(base);
  std::string qual = std::string("podlink.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qual.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  py::object o = py::reinterpret_steal<py::object>(cls);
  m.attr(name) = o;
  return o;
}

// --- memory ------------------------------------------------------------------

// Host memory from podlinkd's allocator (a sealed memfd): a writable buffer.
struct HostMemory {
  std::unique_ptr<HostBuffer> buf;
  uint64_t address() const { return reinterpret_cast<uint64_t>(buf->data()); }
  size_t size() const { return buf->size(); }
};

// Exportable GPU memory (cuMem, POSIX-FD handle) on one GPU.
struct GpuMemory {
  std::unique_ptr<GpuBuffer> buf;
};

struct Local {
  LocalRegion region;
};

struct Remote {
  RemoteRegion region;
};

// A peer's GPU memory mapped into this process (direct transport): kernels
// load and store it over NVLink; no copy engine, no daemon on the path.
struct MappedRemote {
  std::unique_ptr<Imported> imported;
  std::unique_ptr<Mapping> mapping;
};

// Version 3 of the CUDA array interface for `nbytes` bytes at `ptr` (torch.as_tensor takes it).
py::dict CudaArrayInterface(uint64_t ptr, size_t nbytes) {
  py::dict d;
  d["shape"] = py::make_tuple(nbytes);
  d["typestr"] = "|u1";
  d["data"] = py::make_tuple(ptr, false);
  d["version"] = 3;
  d["strides"] = py::none();
  d["stream"] = py::none();
  return d;
}

// Operations from Python, checked and converted once: (Region, local_offset,
// RemoteRegion, remote_offset[, length]) each, as the package's Region and
// RemoteRegion objects. A Batch may be submitted any number of times; it holds
// the objects it names. Conversion is here, not in Python, because it is per
// operation (a KV hand-off writes thousands of blocks per call).
struct Batch {
  std::vector<TransferOp> ops;
  py::list keep;                  // every Region and RemoteRegion named (each once)
  std::vector<py::handle> remotes;  // of those, the RemoteRegions (checked for close at each submit)
  int cuda_device = -1;           // the device of the first CUDA source, -1 when none
  uint64_t bytes = 0;
};

constexpr const char* kOpShape = "an operation is (Region, local_offset, RemoteRegion, remote_offset, length)";

uint64_t AttrU64(py::handle o, const char* name) {
  py::object v = py::reinterpret_steal<py::object>(PyObject_GetAttrString(o.ptr(), name));
  if (!v) throw py::error_already_set();
  return v.cast<uint64_t>();
}

bool RemoteClosed(py::handle remote) {
  PyObject* c = PyObject_GetAttrString(remote.ptr(), "_closed");
  if (c == nullptr) throw py::error_already_set();
  int t = PyObject_IsTrue(c);
  Py_DECREF(c);
  return t == 1;
}

// A non-negative Python int (offsets and lengths); InvalidArgument otherwise.
uint64_t Offset(PyObject* v) {
  if (!PyLong_Check(v)) Throw(absl::InvalidArgumentError("offsets and lengths must be integers"));
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (overflow > 0) Throw(absl::InvalidArgumentError("an offset or length is too large"));
  if (overflow < 0 || x < 0) Throw(absl::InvalidArgumentError("offsets and lengths must not be negative"));
  return static_cast<uint64_t>(x);
}

std::unique_ptr<Batch> Prepare(const py::iterable& ops) {
  auto b = std::make_unique<Batch>();
  // Consecutive operations mostly name the same two regions: looked up once each.
  struct LocalView {
    PyObject* obj = nullptr;
    const Local* local = nullptr;
    uint64_t offset = 0, nbytes = 0;
  } lv;
  struct RemoteView {
    PyObject* obj = nullptr;
    const Remote* remote = nullptr;
  } rv;
  for (py::handle item : ops) {
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(item.ptr(), kOpShape));
    if (!seq) {
      PyErr_Clear();
      Throw(absl::InvalidArgumentError(kOpShape));
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
    if (n != 4 && n != 5) Throw(absl::InvalidArgumentError(kOpShape));
    PyObject** f = PySequence_Fast_ITEMS(seq.ptr());
    if (f[0] != lv.obj) {
      py::object l = py::reinterpret_steal<py::object>(PyObject_GetAttrString(f[0], "_local"));
      if (!l || !py::isinstance<Local>(l)) {
        PyErr_Clear();
        Throw(absl::InvalidArgumentError(kOpShape));
      }
      lv = {f[0], l.cast<const Local*>(), AttrU64(f[0], "_offset"), AttrU64(f[0], "_nbytes")};
      b->keep.append(py::handle(f[0]));
      if (b->cuda_device < 0) {
        py::handle h(f[0]);
        if (h.attr("is_cuda").cast<bool>()) b->cuda_device = h.attr("device").cast<int>();
      }
    }
    if (f[2] != rv.obj) {
      py::object r = py::reinterpret_steal<py::object>(PyObject_GetAttrString(f[2], "_remote"));
      if (!r || !py::isinstance<Remote>(r)) {
        PyErr_Clear();
        Throw(absl::InvalidArgumentError(kOpShape));
      }
      if (RemoteClosed(f[2])) Throw(absl::FailedPreconditionError("the remote region was closed"));
      rv = {f[2], r.cast<const Remote*>()};
      b->keep.append(py::handle(f[2]));
      b->remotes.push_back(py::handle(f[2]));
    }
    uint64_t lo = Offset(f[1]), ro = Offset(f[3]);
    uint64_t len = 0;
    if (n == 5 && f[4] != Py_None) {
      len = Offset(f[4]);
    } else {
      uint64_t rsize = rv.remote->region.size;
      len = std::min(lo < lv.nbytes ? lv.nbytes - lo : 0, ro < rsize ? rsize - ro : 0);
    }
    if (lo > lv.nbytes || len > lv.nbytes - lo) {
      Throw(absl::InvalidArgumentError(absl::StrCat("local range ", lo, "+", len, " is outside the region's ",
                                                    lv.nbytes, " bytes")));
    }
    b->ops.push_back(TransferOp{&lv.local->region, lv.offset + lo, &rv.remote->region, ro, len});
    b->bytes += len;
  }
  return b;
}

// --- the endpoint ------------------------------------------------------------

class Endpoint {
 public:
  Endpoint(const std::string& socket_dir, int device, bool allow_direct, bool force_relay, double timeout_s) {
    ConnectOptions co;
    co.socket_dir = socket_dir;
    co.timeout = absl::Seconds(timeout_s);
    {
      py::gil_scoped_release nogil;
      client_ = Unwrap(Client::Connect(co));
      TransferEngine::Options eo;
      eo.device = device < 0 ? 0 : device;
      eo.allow_direct = allow_direct;
      eo.force_relay = force_relay;
      eo.timeout = absl::Seconds(timeout_s);
      eo.log_transport = false;
      engine_ = Unwrap(TransferEngine::Create(*client_, eo));
      auto node = client_->GetNodeInfo();
      if (node.ok()) node_id_ = node->node_id;
    }
  }

  void Close() {
    py::gil_scoped_release nogil;
    engine_.reset();
    client_.reset();
  }
  bool closed() const { return client_ == nullptr; }
  const std::string& node_id() const { return node_id_; }
  uint64_t session_id() {
    Live();
    return client_->session_id();
  }

  HostMemory AllocHost(size_t n) {
    Live();
    py::gil_scoped_release nogil;
    return HostMemory{Unwrap(client_->AllocateHost(n))};
  }
  GpuMemory AllocGpu(size_t n, int device) {
    Live();
    py::gil_scoped_release nogil;
    return GpuMemory{Unwrap(client_->AllocateGpu(n, device))};
  }

  Local RegisterHost(const HostMemory& m, const std::string& name) {
    Live();
    py::gil_scoped_release nogil;
    return Local{Unwrap(engine_->Register(*m.buf, Options(name)))};
  }
  // Host memory by address (RegisterHost): inside a memfd mapping, that
  // memfd; otherwise the process's memory as it is. (Local, offset).
  py::tuple RegisterHostRange(uint64_t address, size_t size, const std::string& name) {
    Live();
    TransferEngine::HostRange r;
    {
      py::gil_scoped_release nogil;
      r = Unwrap(engine_->RegisterHost(reinterpret_cast<void*>(address), size, Options(name)));
    }
    return py::make_tuple(Local{r.region}, r.offset);
  }
  Local RegisterGpu(const GpuMemory& m, const std::string& name) {
    Live();
    py::gil_scoped_release nogil;
    return Local{Unwrap(engine_->Register(*m.buf, Options(name)))};
  }
  Local RegisterExisting(uint64_t ptr, size_t size, const std::string& name) {
    Live();
    py::gil_scoped_release nogil;
    return Local{Unwrap(engine_->RegisterExisting(ptr, size, Options(name)))};
  }
  void Unregister(const Local& l) {
    Live();
    py::gil_scoped_release nogil;
    Check(engine_->Unregister(l.region));
  }

  py::bytes Describe(const Local& l) {
    Live();
    std::string wire;
    {
      py::gil_scoped_release nogil;
      wire = Unwrap(engine_->Describe(l.region)).Serialize();
    }
    return py::bytes(wire);
  }

  Remote Open(const std::string& descriptor) {
    Live();
    if (descriptor.size() > 64 * 1024) Throw(absl::InvalidArgumentError("a region descriptor is at most 64 KiB"));
    py::gil_scoped_release nogil;
    RegionDescriptor d = Unwrap(RegionDescriptor::Parse(descriptor));
    return Remote{Unwrap(engine_->Open(d))};
  }

  // The export named `name` ("name" or "namespace/name"), opened; NOT_FOUND
  // while there is none this pod may import.
  Remote OpenNamed(const std::string& name) {
    Live();
    py::gil_scoped_release nogil;
    Imported imp = Unwrap(client_->Import(name));
    RegionDescriptor d;
    d.node_id = node_id_;
    d.export_id = imp.info().export_id;
    d.size = imp.info().size;
    d.handle_type = imp.info().handle_type;
    d.gpu_uuid = imp.info().gpu_uuid;
    // The session's import record is one per export: the engine's opening keeps it.
    return Remote{Unwrap(engine_->Open(d))};
  }

  // Maps the peer's GPU memory behind `r` for kernels of `device` (direct
  // transport only: the pod must be able to open the peer's GPU).
  MappedRemote MapRemote(const Remote& r, int device) {
    Live();
    if (r.region.transport != Transport::kDirect) {
      Throw(absl::FailedPreconditionError(absl::StrCat(
          "region ", r.region.export_id, " is reached via ", TransportName(r.region.transport),
          ": kernels can address only a peer's GPU memory that this pod may map (direct transport; request "
          "podlink.io/peer-direct). Use write/read instead")));
    }
    py::gil_scoped_release nogil;
    MappedRemote m;
    m.imported = std::make_unique<Imported>(Unwrap(client_->Import(r.region.export_id)));
    m.mapping = Unwrap(client_->Map(*m.imported, device));
    return m;
  }

  void CloseRemote(const Remote& r) {
    Live();
    py::gil_scoped_release nogil;
    Check(engine_->Close(r.region));
  }

  // ops: (Local, local_offset, Remote, remote_offset, length); returns a batch id.
  // A prepared batch (the remote regions it names must still be open).
  uint64_t SubmitBatch(const Batch& b, bool write) {
    Live();
    for (py::handle r : b.remotes) {
      if (RemoteClosed(r)) Throw(absl::FailedPreconditionError("the remote region was closed"));
    }
    py::gil_scoped_release nogil;
    return Unwrap(write ? engine_->WriteAsync(b.ops) : engine_->ReadAsync(b.ops));
  }

  // One operation, submitted and waited for under one release of the GIL
  // (the synchronous write/read path: the binding's cost per call).
  void Transfer(const Local& l, uint64_t local_offset, const Remote& r, uint64_t remote_offset, uint64_t length,
                bool write) {
    Live();
    TransferOp op{&l.region, local_offset, &r.region, remote_offset, length};
    py::gil_scoped_release nogil;
    Check(write ? engine_->Write(op) : engine_->Read(op));
  }

  bool Poll(uint64_t batch) {
    Live();
    py::gil_scoped_release nogil;
    return Unwrap(engine_->Poll(batch));
  }

  // Waits up to timeout_s (negative: the engine's own timeout) for the batch;
  // DEADLINE_EXCEEDED leaves it pending (wait again, or poll).
  void Wait(uint64_t batch, double timeout_s) {
    Live();
    py::gil_scoped_release nogil;
    if (timeout_s >= 0) {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
      for (uint64_t spins = 0;; ++spins) {
        if (Unwrap(engine_->Poll(batch))) break;
        if (std::chrono::steady_clock::now() >= deadline) {
          Throw(absl::DeadlineExceededError("the transfer did not complete within the timeout (still pending)"));
        }
        if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(spins > 4096 ? 1000 : 20));
      }
    }
    Check(engine_->Wait(batch));
  }

  void Notify(const Remote& r, uint64_t value) {
    Live();
    py::gil_scoped_release nogil;
    Check(engine_->Notify(r.region, value));
  }

  void NotifyBytes(const Remote& r, const std::string& message) {
    Live();
    py::gil_scoped_release nogil;
    Check(engine_->Notify(r.region, 0, message));
  }

  // (export id, value) for a notification of a value, (export id, bytes) for one with bytes.
  std::vector<std::pair<uint64_t, py::object>> Notifications() {
    Live();
    std::vector<Notification> n;
    {
      py::gil_scoped_release nogil;
      n = engine_->PollNotifications();
    }
    std::vector<std::pair<uint64_t, py::object>> out;
    out.reserve(n.size());
    for (const Notification& x : n) {
      out.emplace_back(x.export_id, x.has_message ? py::object(py::bytes(x.message)) : py::object(py::int_(x.value)));
    }
    return out;
  }

 private:
  void Live() const {
    if (client_ == nullptr) Throw(absl::FailedPreconditionError("this podlink Endpoint is closed"));
  }
  static ExportOptions Options(const std::string& name) {
    ExportOptions o;
    o.name = name;
    return o;
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<TransferEngine> engine_;  // destroyed before client_ (Close, and member order)
  std::string node_id_;
};

}  // namespace
}  // namespace podlink::python

PYBIND11_MODULE(_podlink, m) {
  using namespace podlink::python;
  namespace pl = podlink;
  m.doc() = "libpodlink for Python (use the `podlink` package, not this module)";

  static Errors errs;
  py::object exc_base = py::module_::import("builtins").attr("RuntimeError");
  {
    PyObject* base = PyErr_NewExceptionWithDoc("podlink.Error",
                                               "A podlink call failed; `code` is podlinkd's status code name.",
                                               exc_base.ptr(), nullptr);
    if (base == nullptr) throw py::error_already_set();
    errs.base = py::reinterpret_steal<py::object>(base);
    m.attr("Error") = errs.base;
  }
  py::module_ builtins = py::module_::import("builtins");
  errs.permission = MakeError(m, "PermissionDenied", "podlinkd's policy refused (PERMISSION_DENIED).", errs.base,
                              builtins.attr("PermissionError"));
  errs.not_found = MakeError(m, "NotFound", "No such export, or none this pod may import (NOT_FOUND).", errs.base,
                             builtins.attr("LookupError"));
  errs.timeout = MakeError(m, "Timeout", "Did not complete in time (DEADLINE_EXCEEDED).", errs.base,
                           builtins.attr("TimeoutError"));
  errs.invalid = MakeError(m, "InvalidArgument", "A bad argument or range (INVALID_ARGUMENT, OUT_OF_RANGE).",
                           errs.base, builtins.attr("ValueError"));
  errs.unavailable = MakeError(m, "Unavailable", "podlinkd or a peer is unreachable (UNAVAILABLE).", errs.base,
                               builtins.attr("ConnectionError"));
  errs.precondition = MakeError(m, "FailedPrecondition", "Not possible in this state (FAILED_PRECONDITION).",
                                errs.base, py::handle());
  errs.exists = MakeError(m, "AlreadyExists", "The name is taken (ALREADY_EXISTS).", errs.base, py::handle());
  errs.exhausted = MakeError(m, "ResourceExhausted", "A limit was reached (RESOURCE_EXHAUSTED).", errs.base,
                             py::handle());
  errors = &errs;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatus(e.status);
    }
  });

  py::class_<HostMemory>(m, "HostMemory", py::buffer_protocol(), "Host memory podlinkd can share (a sealed memfd).")
      .def_property_readonly("address", &HostMemory::address)
      .def_property_readonly("nbytes", &HostMemory::size)
      .def_buffer([](HostMemory& h) {
        return py::buffer_info(h.buf->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(h.buf->size())}, {1});
      });

  py::class_<GpuMemory>(m, "GpuMemory", "Exportable GPU memory (cuMem, POSIX-FD handle).")
      .def_property_readonly("address", [](const GpuMemory& g) { return g.buf->device_ptr(); })
      .def_property_readonly("nbytes", [](const GpuMemory& g) { return g.buf->size(); })
      .def_property_readonly("device", [](const GpuMemory& g) { return g.buf->device(); })
      .def_property_readonly("__cuda_array_interface__",
                             [](const GpuMemory& g) { return CudaArrayInterface(g.buf->device_ptr(), g.buf->size()); });

  py::class_<Local>(m, "Local")
      .def_property_readonly("export_id", [](const Local& l) { return l.region.export_id; })
      .def_property_readonly("nbytes", [](const Local& l) { return l.region.size; })
      .def_property_readonly("device", [](const Local& l) { return l.region.device; });

  py::class_<Remote>(m, "Remote")
      .def_property_readonly("export_id", [](const Remote& r) { return r.region.export_id; })
      .def_property_readonly("nbytes", [](const Remote& r) { return r.region.size; })
      .def_property_readonly("transport", [](const Remote& r) {
        std::string n = pl::TransportName(r.region.transport);  // "podlink/relay" -> "relay"
        return n.substr(n.find('/') + 1);
      });

  py::class_<MappedRemote>(m, "MappedRemote", "A peer's GPU memory mapped into this process.")
      .def_property_readonly("address", [](const MappedRemote& r) { return r.mapping->device_ptr(); })
      .def_property_readonly("nbytes", [](const MappedRemote& r) { return r.mapping->size(); })
      .def_property_readonly("device", [](const MappedRemote& r) { return r.mapping->device(); })
      .def_property_readonly("__cuda_array_interface__", [](const MappedRemote& r) {
        return CudaArrayInterface(r.mapping->device_ptr(), r.mapping->size());
      });

  py::class_<Batch>(m, "Batch", "Operations checked and converted once (Endpoint.prepare).")
      .def_property_readonly("count", [](const Batch& b) { return b.ops.size(); })
      .def_property_readonly("nbytes", [](const Batch& b) { return b.bytes; })
      .def_property_readonly("cuda_device", [](const Batch& b) { return b.cuda_device; });
  m.def("prepare", &Prepare, py::arg("ops"));

  py::class_<Endpoint>(m, "Endpoint")
      .def(py::init<const std::string&, int, bool, bool, double>(), py::arg("socket_dir"), py::arg("device"),
           py::arg("allow_direct"), py::arg("force_relay"), py::arg("timeout"))
      .def("close", &Endpoint::Close)
      .def_property_readonly("closed", &Endpoint::closed)
      .def_property_readonly("node_id", &Endpoint::node_id)
      .def_property_readonly("session_id", &Endpoint::session_id)
      .def("alloc_host", &Endpoint::AllocHost, py::arg("nbytes"))
      .def("alloc_gpu", &Endpoint::AllocGpu, py::arg("nbytes"), py::arg("device"))
      .def("register_host", &Endpoint::RegisterHost, py::arg("memory"), py::arg("name"))
      .def("register_host_range", &Endpoint::RegisterHostRange, py::arg("address"), py::arg("nbytes"),
           py::arg("name"))
      .def("register_gpu", &Endpoint::RegisterGpu, py::arg("memory"), py::arg("name"))
      .def("register_existing", &Endpoint::RegisterExisting, py::arg("address"), py::arg("nbytes"), py::arg("name"))
      .def("unregister", &Endpoint::Unregister)
      .def("describe", &Endpoint::Describe)
      .def("open", &Endpoint::Open)
      .def("open_named", &Endpoint::OpenNamed)
      .def("close_remote", &Endpoint::CloseRemote)
      .def("map_remote", &Endpoint::MapRemote, py::arg("remote"), py::arg("device"))
      .def("submit_batch", &Endpoint::SubmitBatch, py::arg("batch"), py::arg("write"))
      .def("transfer", &Endpoint::Transfer, py::arg("local"), py::arg("local_offset"), py::arg("remote"),
           py::arg("remote_offset"), py::arg("length"), py::arg("write"))
      .def("poll", &Endpoint::Poll)
      .def("wait", &Endpoint::Wait, py::arg("batch"), py::arg("timeout"))
      .def("notify", &Endpoint::Notify)
      .def("notify_bytes", &Endpoint::NotifyBytes)
      .def("notifications", &Endpoint::Notifications);
}
