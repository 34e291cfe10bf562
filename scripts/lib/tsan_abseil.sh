#!/usr/bin/env bash
# Builds Debian's Abseil with ThreadSanitizer into DEST/lib (for
# scripts/sanitize.sh tsan): the source package of the installed libabsl-dev,
# fetched with apt-get source through a private apt state (the machine's
# sources lists stay as they are), configured as debian/rules configures the
# shared build, plus -fsanitize=thread. Skips the work when DEST/lib already
# holds a build of that version.
#
#   bash scripts/lib/tsan_abseil.sh DEST
set -euo pipefail
dest=${1:?usage: $0 DEST}
version=$(dpkg-query -W -f='${source:Version}' libabsl-dev)
if [ -f "$dest/lib/VERSION" ] && [ "$(cat "$dest/lib/VERSION")" = "$version" ]; then
  echo "tsan abseil: $version already built in $dest/lib"
  exit 0
fi
start=$(date +%s)
rm -rf "$dest" && mkdir -p "$dest/apt/lists/partial" "$dest/src"
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
key=/usr/share/keyrings/debian-archive-keyring.gpg
{
  echo "deb-src [signed-by=$key] http://deb.debian.org/debian $codename main"
  echo "deb-src [signed-by=$key] http://deb.debian.org/debian $codename-updates main"
  echo "deb-src [signed-by=$key] http://deb.debian.org/debian-security $codename-security main"
} > "$dest/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$dest/apt/sources.list" -o "Dir::Etc::SourceParts=$dest/apt/none"
          -o "Dir::State::Lists=$dest/apt/lists" -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=")
echo "tsan abseil: fetching the source of abseil $version (apt-get source)"
apt-get "${apt_opts[@]}" -qq update
# The installed version if the archive still has it; otherwise the archive's
# current one (a point or security release of the same upstream and ABI: the
# options.h check below refuses a copy whose ABI options differ).
if ! (cd "$dest/src" && apt-get "${apt_opts[@]}" -qq source "abseil=$version" > "$dest/apt/source.log" 2>&1); then
  echo "tsan abseil: abseil=$version is no longer in the archive; taking its current abseil source"
  (cd "$dest/src" && apt-get "${apt_opts[@]}" -qq source abseil >> "$dest/apt/source.log" 2>&1) ||
    { echo "tsan abseil: apt-get source abseil failed:"; cat "$dest/apt/source.log"; exit 1; }
fi
src=$(find "$dest/src" -mindepth 1 -maxdepth 1 -type d -name 'abseil-*' | head -1)
[ -n "$src" ] || { echo "tsan abseil: no source tree in $dest/src"; exit 1; }
# The instrumented copy must match the installed headers' ABI options.
cmp -s "$src/absl/base/options.h" /usr/include/absl/base/options.h ||
  { echo "tsan abseil: $src/absl/base/options.h differs from the installed one"; exit 1; }
echo "tsan abseil: building $(basename "$src") with -fsanitize=thread"
cmake -S "$src" -B "$dest/build" -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_CXX_FLAGS="-fsanitize=thread" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build "$dest/build" -j "$(nproc)" > "$dest/build.log" 2>&1 ||
  { tail -n 40 "$dest/build.log"; echo "tsan abseil: build failed (log: $dest/build.log)"; exit 1; }
mkdir -p "$dest/lib"
find "$dest/build" -name 'libabsl_*.so.*' -exec cp -P {} "$dest/lib/" \;
n=$(find "$dest/lib" -name 'libabsl_*.so.*' | wc -l)
[ "$n" -gt 0 ] || { echo "tsan abseil: no libraries built"; exit 1; }
echo "$version" > "$dest/lib/VERSION"
echo "tsan abseil: $n files in $dest/lib in $(($(date +%s) - start)) s"
