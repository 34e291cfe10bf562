// tests/fakes/kube_apiserver.h as a process, for tests that start podlinkd
// as a manifest does (tests/deploy/start_rendered.sh):
//   fake_kube_apiserver CERT KEY ADDRESS TOKEN PODS.json PORT_FILE
// serves PODS.json ([{"uid", "namespace", "name", "node", "annotations"}])
// on ADDRESS, writes the port it got to PORT_FILE, and runs until SIGTERM.
#include <signal.h>

#include <fstream>
#include <iostream>

#include "nlohmann/json.hpp"
#include "tests/fakes/kube_apiserver.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: fake_kube_apiserver CERT KEY ADDRESS TOKEN PODS.json PORT_FILE\n";
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // before the server's threads start
  nlohmann::json pods = nlohmann::json::parse(std::ifstream(argv[5]));
  podlink::testing::FakeKubeApiServer api(argv[1], argv[2], argv[3], argv[4]);
  if (api.port() <= 0) {
    std::cerr << "fake_kube_apiserver: cannot listen on " << argv[3] << "\n";
    return 1;
  }
  for (const auto& p : pods) {
    podlink::testing::FakePod pod{p.at("uid"), p.at("namespace"), p.at("name"), p.value("node", ""), {}};
    const nlohmann::json annotations = p.value("annotations", nlohmann::json::object());  // outlives the loop
    for (const auto& [k, v] : annotations.items()) pod.annotations[k] = v;
    api.Put(pod);
  }
  std::ofstream(argv[6]) << api.port() << "\n";
  int sig = 0;
  sigwait(&sigs, &sig);
  return 0;
}
