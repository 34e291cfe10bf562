#!/bin/bash
# main.cc's compile time with BrokerService's constructor in the header (before 662ee79) and out of line (after).
# Needs, made beforehand:
#   /tmp/oldtree/daemon/broker/grpc_service.h   git show 662ee79^:daemon/broker/grpc_service.h (found first by -I)
#   /tmp/flags.txt                               the CXX_ lines of an ASan tree's podlinkd flags.make (configured as
#                                                scripts/sanitize.sh asan configures build-asan, here in /tmp/ta)
#   build/                                       the plain build (scripts/build.sh)
#   measure.sh OUTPUT_FILE
set -u
cd /work/main
out=$1
gf=build/daemon/CMakeFiles/podlinkd_main.dir/flags.make
GF=$(grep CXX_FLAGS $gf | cut -d= -f2-); GD=$(grep CXX_DEFINES $gf | cut -d= -f2-); GI=$(grep CXX_INCLUDES $gf | cut -d= -f2-)
{
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), this 2-core Debian 12 machine, nothing else running; commit $(git rev-parse --short HEAD)"
echo "# GCC (the plain build's flags: build/daemon/CMakeFiles/podlinkd_main.dir/flags.make)"
for v in before after; do
  inc=""; [ $v = before ] && inc="-I/tmp/oldtree"
  echo "## $v: g++ $GD $inc $GI $GF -c daemon/main.cc"
  eval /usr/bin/time -f "'$v gcc: %e s wall, %U s user'" g++ $GD $inc $GI $GF -c daemon/main.cc -o /tmp/mcc.o
done
cf=/tmp/flags.txt
CF=$(grep CXX_FLAGS $cf | cut -d= -f2-); CD=$(grep CXX_DEFINES $cf | cut -d= -f2-); CI=$(grep CXX_INCLUDES $cf | cut -d= -f2-)
echo "# clang 14 under ASan+UBSan with the fuzz build's instrumentation (the ASan tree's flags for podlinkd)"
for v in before after; do
  inc=""; [ $v = before ] && inc="-I/tmp/oldtree"
  echo "## $v: clang++ $CD $inc $CI $CF -c daemon/main.cc"
  eval /usr/bin/time -f "'$v clang-asan: %e s wall, %U s user'" clang++ $CD $inc $CI $CF -c daemon/main.cc -o /tmp/mcc.o
done
} > "$out" 2>&1
