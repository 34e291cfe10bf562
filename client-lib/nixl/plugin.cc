// libplugin_PODLINK.so's entry points: NIXL's plugin struct, filled by hand
// (NIXL's helper template logs through Abseil) and nothing else; the engine
// is client-lib/nixl/engine.h.
//
// Built against NIXL 1.4.0's ABI (client-lib/nixl/nixl_abi.h). NIXL gives a
// plugin no way to learn the loading NIXL's version (api_version has been 1
// since 0.x; no version in the init params or as a symbol). nixl_abi.h
// describes a heuristic (probing libnixl's symbols for 1.4.0 and later
// releases); it is not implemented here: it was never tried on real
// binaries, and the engine touches no inline base-class code whose layout
// changed between 1.0 and 1.4 (no addTelemetryEvent), so the 1.0-1.4
// releases, whose engine vtable and base layout are identical, all load it.
#include <cstdio>
#include <exception>
#include <new>

#include "client-lib/nixl/engine.h"
#include "client-lib/nixl/nixl_abi.h"

namespace podlink::nixl {
namespace {

constexpr char kPluginName[] = "PODLINK";
#ifdef PODLINK_VERSION
constexpr char kPluginVersion[] = PODLINK_VERSION;
#else
constexpr char kPluginVersion[] = "0.1";
#endif

nixlBackendEngine* CreateEngine(const nixlBackendInitParams* init_params) {
  if (init_params == nullptr) return nullptr;
  try {
    // Returned even when it failed to start: NIXL reads getInitErr() and
    // destroys it; the engine logged why.
    return new PodlinkNixlEngine(init_params);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "podlink-nixl: create engine: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "podlink-nixl: create engine: unknown exception\n");
  }
  return nullptr;
}

void DestroyEngine(nixlBackendEngine* engine) {
  try {
    delete engine;
  } catch (...) {
    std::fprintf(stderr, "podlink-nixl: destroy engine: exception (ignored)\n");
  }
}

const char* PluginName() { return kPluginName; }
const char* PluginVersion() { return kPluginVersion; }
nixl_b_params_t BackendOptions() { return {}; }  // configured from the environment (vLLM passes none)
nixl_mem_list_t BackendMems() { return {DRAM_SEG, VRAM_SEG}; }

// Static storage: valid until fini and, since NIXL dlopens with
// RTLD_NODELETE, after it; init may run again after fini.
nixlBackendPlugin g_plugin;

}  // namespace
}  // namespace podlink::nixl

extern "C" {

nixlBackendPlugin* nixl_plugin_init() {
  using namespace podlink::nixl;
  g_plugin.api_version = podlink::nixl_abi::kPluginApiVersion;
  g_plugin.create_engine = &CreateEngine;
  g_plugin.destroy_engine = &DestroyEngine;
  g_plugin.get_plugin_name = &PluginName;
  g_plugin.get_plugin_version = &PluginVersion;
  g_plugin.get_backend_options = &BackendOptions;
  g_plugin.get_backend_mems = &BackendMems;
  return &g_plugin;
}

// Nothing to free: engines are destroyed through destroy_engine, and the
// struct is static.
void nixl_plugin_fini() {}

}  // extern "C"
