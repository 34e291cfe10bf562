#!/usr/bin/env python3
"""Every target that includes protoc's generated headers is built after them (Make trees only).

With CMAKE_OPTIMIZE_DEPENDENCIES (CMakeLists.txt) a static library no longer waits for the libraries it links, so
one that includes a generated header (proto/gen/...) but reaches podlink_proto through nothing CMake keeps would
compile, in a clean parallel build, before protoc has written that header: a failure of some builds only. This reads
what the built tree says (CMakeFiles/Makefile2's target order, the compiler's dependency files of each object) and fails for such
a target, naming it.

    check_build_order.py BUILD_DIR      exit 0: ordered; 1: a target is not; 77: not a Make tree or not built
"""
import collections
import glob
import os
import re
import sys

SKIP = 77


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    build = os.path.abspath(sys.argv[1])
    makefile2 = os.path.join(build, "CMakeFiles", "Makefile2")
    if not os.path.exists(makefile2):
        print(f"{build}: no CMakeFiles/Makefile2 (not a Make tree): skipped")
        return SKIP
    deps = collections.defaultdict(set)
    targets = set()
    rule = re.compile(r"^(\S+)\.dir/all:(?: (\S+)\.dir/all)?\s*$")
    with open(makefile2) as f:
        for line in f:
            m = rule.match(line)
            if m:
                targets.add(m.group(1))
                if m.group(2):
                    deps[m.group(1)].add(m.group(2))

    def after(target):
        seen, todo = set(), [target]
        while todo:
            for d in deps[todo.pop()]:
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return seen

    proto = [t for t in targets if t.endswith("/podlink_proto")]
    if len(proto) != 1:
        print(f"{makefile2}: no single podlink_proto target ({proto})")
        return 1
    proto = proto[0]
    generated = "proto/gen/"  # protoc's output under the build tree (the dependency files name it relative to it)
    checked, bad = 0, []
    for t in sorted(targets):
        if t == proto:
            continue
        uses = []
        for depfile in glob.glob(os.path.join(build, t + ".dir", "**", "*.o.d"), recursive=True):
            with open(depfile) as f:
                uses += [w for line in f for w in line.split() if generated in w]
        if not uses:
            continue
        checked += 1
        if proto not in after(t):
            bad.append((t, uses[0]))
    if checked == 0:
        print(f"{build}: no object's dependency file names a generated header (not built yet?): skipped")
        return SKIP
    for t, header in bad:
        print(f"FAIL: {t} includes {header} but is not built after {proto}: link podlink::proto to it")
    print(f"{checked} targets include generated headers; {len(bad)} not ordered after {proto}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
