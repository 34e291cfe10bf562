#!/usr/bin/env bash
# Installs podlink's build and test dependencies from Debian packages.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# golang-go, sprig and yaml.v3 build tests/deploy/chartrender, which renders the Helm chart in tests;
# python3-grpcio runs tests/deploy/fake_cri.py, the container runtime behind rendered manifests' podlinkd;
# libcpp-httplib-dev: podlinkd's client of the Kubernetes API server (--remote-pods apiserver) and its fake in tests;
# libssl-dev: mesh requests through relays are signed with the node key (daemon/mesh/origin_sign.*);
# iproute2 and openssl: the mesh tests' emulated nodes (netns, veth, tc) and their per-run CA;
# python3-yaml reads YAML back in tests (rendered manifests, kubectl-podlink -o yaml);
# containerd, runc, umoci, busybox-static and python3-protobuf: the OCI image (scripts/build-image.sh) and the
# real-runtime test (tests/runtime/containerd_test.py);
# clang and its runtime build the libFuzzer targets (tests/fuzz); lld links every build (CMakeLists.txt);
# pybind11-dev and python3-dev build `import podlink` (client-lib/python); python3-numpy and python3-pytest test it, python3-pip and python3-setuptools install it;
# qemu-system-x86, kmod, cpio, rdma-core, ibverbs-providers and ibverbs-utils: the soft-RoCE guests of the verbs
# mesh test (tests/vm/; Debian's kernel package is fetched there with apt-get download, not installed).
pkgs=(build-essential cmake pkg-config protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
      libgrpc++-dev libabsl-dev libspdlog-dev libgtest-dev libgmock-dev nlohmann-json3-dev
      libibverbs-dev librdmacm-dev libssl-dev libcpp-httplib-dev util-linux iproute2 openssl yamllint python3-yaml
      golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev python3-grpcio
      containerd runc umoci busybox-static python3-protobuf
      clang libclang-rt-14-dev lld
      qemu-system-x86 kmod cpio rdma-core ibverbs-providers ibverbs-utils
      pybind11-dev python3-dev python3-numpy python3-pytest python3-pip python3-setuptools)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# kubectl renders deploy/ (kustomize) and finds kubectl-podlink; Debian ships it
# as kubernetes-client unless a kubectl package is already there.
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
if [ ${#missing[@]} -gt 0 ]; then
  echo "podlink: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
