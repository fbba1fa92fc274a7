#!/usr/bin/env bash
# make dist-arm64: dist-arm64/edgebroker, the one-file binary for 64-bit ARM, built inside a
# Debian bookworm arm64 root file system run under qemu-user (docs/deploy.md). Needs root
# (debootstrap, chroot, binfmt_misc) and the network the first time.
#
#   packaging/arm64.sh setup   the host's tools and binfmt_misc, then the cached root file
#                              systems under $CACHE (default ~/.cache/edgebroker):
#                              bookworm-arm64      minbase + python3, gcc, a venv with PyInstaller
#                              bookworm-arm64-run  minbase only: no Python (the smoke test's)
#   packaging/arm64.sh build   the binary from this checkout's files, into dist-arm64/
set -euo pipefail

CACHE=${EDGEBROKER_CACHE:-$HOME/.cache/edgebroker}
ROOT=$CACHE/bookworm-arm64
RUN=$CACHE/bookworm-arm64-run
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYINSTALLER="pyinstaller==6.22.3 pyinstaller-hooks-contrib==2026.9"
HERE=$(cd "$(dirname "$0")/.." && pwd)
CA=/etc/ssl/certs/ca-certificates.crt

host_tools() {
    local missing=""
    command -v debootstrap >/dev/null || missing="$missing debootstrap"
    [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || [ -e /usr/bin/qemu-aarch64-static ] \
        || missing="$missing qemu-user-static"
    command -v update-binfmts >/dev/null || missing="$missing binfmt-support"
    if [ -n "$missing" ]; then
        echo "installing Debian packages:$missing"
        mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        # The package lists first: a fresh image has none, and install finds no package.
        DEBIAN_FRONTEND=noninteractive apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
    fi
    mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
    grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 || update-binfmts --enable qemu-aarch64
}

# Run a command inside $ROOT with /proc and /dev, unmounted afterwards.
in_root() {
    mount -t proc proc "$ROOT/proc"
    mount --bind /dev "$ROOT/dev"
    local rc=0
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        PIP_CERT=$CA PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive \
        /bin/sh -c "$1" || rc=$?
    umount "$ROOT/dev" "$ROOT/proc"
    return $rc
}

setup() {
    host_tools
    [ -f "$ROOT/.ready" ] && [ -f "$RUN/.ready" ] && return 0
    mkdir -p "$CACHE"
    if [ ! -f "$RUN/.ready" ]; then
        rm -rf "$RUN"
        debootstrap --arch=arm64 --variant=minbase bookworm "$RUN" "$MIRROR"
        touch "$RUN/.ready"
    fi
    rm -rf "$ROOT"
    cp -a "$RUN" "$ROOT"
    rm "$ROOT/.ready"
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
    mkdir -p "$(dirname "$ROOT$CA")" && cp "$CA" "$ROOT$CA"     # the host's bundle, for pip
    in_root "apt-get update -q && apt-get install -y -q --no-install-recommends \
             python3 python3-venv python3-dev gcc libc6-dev binutils"
    cp "$CA" "$ROOT$CA"     # again: the ca-certificates package rewrote it
    in_root "python3 -m venv /opt/venv && /opt/venv/bin/pip install -q setuptools wheel \
             'cffi>=1.15' 'psutil>=5.9' 'wsproto>=1.2' 'zstandard>=0.22' $PYINSTALLER"
    touch "$ROOT/.ready"
}

build() {
    setup
    rm -f "$HERE/dist-arm64/edgebroker"     # a failed build leaves no binary behind
    rm -rf "$ROOT/src" && mkdir -p "$ROOT/src"
    (cd "$HERE" && tar -c --exclude=__pycache__ --exclude='*.so' edgebroker csrc packaging \
        setup.py setup.cfg pyproject.toml README.md MANIFEST.in) | tar -x -C "$ROOT/src"
    in_root "cd /src && /opt/venv/bin/pip install -q --no-deps --no-build-isolation -e . \
             && PYTHONNODEBUGRANGES=1 /opt/venv/bin/pyinstaller --noconfirm --clean --log-level WARN \
                --distpath /src/dist --workpath /src/build packaging/edgebroker.spec \
             && ./dist/edgebroker --version && packaging/check-native.sh dist/edgebroker"
    mkdir -p "$HERE/dist-arm64"
    cp "$ROOT/src/dist/edgebroker" "$HERE/dist-arm64/edgebroker"
    file "$HERE/dist-arm64/edgebroker" 2>/dev/null || true
}

case "${1:-}" in
    setup) setup ;;
    build) build ;;
    run-root) echo "$RUN" ;;
    *) echo "usage: $0 setup|build|run-root" >&2; exit 2 ;;
esac
