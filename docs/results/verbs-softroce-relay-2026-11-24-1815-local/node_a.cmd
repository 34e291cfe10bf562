PODLINK_VM_VERBS_TIMEOUT=16 PODLINK_VM_CUT='node-b eth1 0.5 3' PODLINK_VM_NAME=node-a sh /work/main/tests/vm/node.sh /work/main/build pair 16777216 node-b node-c node-d
