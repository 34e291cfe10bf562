PODLINK_VM_VERBS_TIMEOUT=16 PODLINK_VM_NAME=node-d sh /work/main/tests/vm/node.sh /work/main/build pair 16777216 node-c node-a
