#!/usr/bin/env bash
# Builds the container tests' worker image without a registry: a Debian bookworm rootfs
# with python3 (debootstrap), the repo's python/vendor_flash SDK and
# test/runtime/fixtures/handler.py, imported into the engine as
#   localhost/flashd-test-worker:<hash of the inputs>
# Prints that tag as its last line of stdout (progress goes to stderr).
#
# Cached on the same machine: the trimmed rootfs tarball lives in $FLASHD_CI_CACHE
# (default /var/cache/flashd-ci) and the import is skipped when the tag exists.
# Needs debootstrap (run as root) for the first build, and podman or docker.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf '    [worker-image] %s\n' "$*" >&2; }

cache="${FLASHD_CI_CACHE:-/var/cache/flashd-ci}"
suite=bookworm
base="$cache/rootfs-$suite-python3.tar"

if command -v podman >/dev/null 2>&1; then engine=podman
elif command -v docker >/dev/null 2>&1; then engine=docker
else echo "worker-image.sh: neither podman nor docker is installed" >&2; exit 1; fi

# The tag: everything that goes into the image (the base's recipe is this script).
inputs=(build/worker-image.sh test/runtime/fixtures/handler.py)
while IFS= read -r f; do inputs+=("$f"); done < <(find python/vendor_flash -name '*.py' | LC_ALL=C sort)
hash=$(cat "${inputs[@]}" | sha256sum | cut -c1-16)
tag="localhost/flashd-test-worker:$hash"

if $engine image inspect "$tag" >/dev/null 2>&1; then
  say "$tag already built"
  echo "$tag"
  exit 0
fi

mkdir -p "$cache"
if [ ! -s "$base" ]; then
  command -v debootstrap >/dev/null 2>&1 || { echo "worker-image.sh: debootstrap is not installed" >&2; exit 1; }
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  say "debootstrap --variant=minbase --include=python3 $suite (about a minute)"
  debootstrap --variant=minbase --include=python3 "$suite" "$root" >"$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  # What a worker never needs: package caches and lists, docs, man pages, locales.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
  tar --numeric-owner -C "$root" -cf "$base.tmp" .
  mv "$base.tmp" "$base"
  rm -rf "$root"
  trap - EXIT
  say "rootfs cached in $base ($(du -h "$base" | cut -f1))"
else
  say "rootfs from cache $base"
fi

# The base tarball plus the SDK and the handler under /opt/flashd-worker.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/opt/flashd-worker"
tar -C python --exclude='__pycache__' -cf - vendor_flash | tar -C "$work/opt/flashd-worker" -xf -
cp test/runtime/fixtures/handler.py "$work/opt/flashd-worker/handler.py"
cp "$base" "$work/image.tar"
tar --numeric-owner --owner=0 --group=0 -C "$work" -rf "$work/image.tar" ./opt/flashd-worker
say "importing $tag"
$engine import \
  --change 'ENV PYTHONPATH=/opt/flashd-worker' \
  --change 'ENV PYTHONUNBUFFERED=1' \
  --change 'WORKDIR /opt/flashd-worker' \
  --change 'CMD ["python3", "-u", "/opt/flashd-worker/handler.py"]' \
  "$work/image.tar" "$tag" >"$work/import.log" 2>&1 || { cat "$work/import.log" >&2; exit 1; }
say "built $tag"
# Older builds of this image (other input hashes) only take disk space.
for old in $($engine images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/flashd-test-worker:' | grep -vx "$tag"); do
  $engine rmi "$old" >/dev/null 2>&1 && say "removed $old" || true
done
echo "$tag"
