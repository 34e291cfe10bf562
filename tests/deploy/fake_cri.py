#!/usr/bin/python3
"""A container runtime that knows no pods, for starting a rendered podlinkd.

Serves runtime.v1.RuntimeService on a Unix socket and answers every call with
an empty message: Version names no runtime, ListPodSandbox and ListContainers
list nothing. That is enough for podlinkd --pod-source=cri to find a runtime
that answers. Each call is appended to LOG as "NAME METHOD" so a test can tell
which of several runtimes answered. With "call", asks the runtime at SOCKET
for its Version once (3 s deadline) and exits 0 if it answered.

Uses Debian's python3-grpcio (hence /usr/bin/python3, which Debian's packages
install for); no generated protobuf code: requests are ignored and an empty
message is zero bytes.

    fake_cri.py serve SOCKET NAME LOG
    fake_cri.py call SOCKET
"""
import sys
import threading
from concurrent import futures

import grpc

SERVICE = "/runtime.v1.RuntimeService/"


class EmptyAnswers(grpc.GenericRpcHandler):
    def __init__(self, name, log):
        self.name = name
        self.log = log
        self.lock = threading.Lock()

    def service(self, details):
        if not details.method.startswith(SERVICE):
            return None  # UNIMPLEMENTED

        def answer(request, context):
            with self.lock, open(self.log, "a") as f:
                f.write(f"{self.name} {details.method[len(SERVICE):]}\n")
            return b""

        return grpc.unary_unary_rpc_method_handler(answer)


def call(socket):
    with grpc.insecure_channel("unix:" + socket) as channel:
        try:
            channel.unary_unary(SERVICE + "Version")(b"", timeout=3)
        except grpc.RpcError as e:
            sys.exit(f"fake_cri: no answer from {socket}: {e.code().name} {e.details()}")


def serve(socket, name, log):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((EmptyAnswers(name, log),))
    if server.add_insecure_port("unix:" + socket) == 0:
        sys.exit(f"fake_cri: cannot listen on {socket}")
    server.start()
    print(f"fake_cri {name}: serving {socket}", flush=True)
    server.wait_for_termination()


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "serve":
        serve(*sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "call":
        call(sys.argv[2])
    else:
        sys.exit("usage: fake_cri.py serve SOCKET NAME LOG | fake_cri.py call SOCKET")


if __name__ == "__main__":
    main()
