PODLINK_VM_GDB=0 PODLINK_VM_NAME=node-b sh /work/main/tests/vm/node.sh /work/main/build pair 4194304 node-a
