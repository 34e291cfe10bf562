PODLINK_VM_VERBS_TIMEOUT=16 PODLINK_VM_NAME=node-b sh /work/main/tests/vm/node.sh /work/main/build pair 16777216 node-a node-c
