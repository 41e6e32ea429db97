#!/usr/bin/env bash
# base-image.sh builds berth's base image offline: a root filesystem made of
# busybox-static (with a symlink per applet) and bash-static, packed as an OCI
# image archive by internal/cmd/mkimage. No registry and no container engine
# are involved. Run scripts/deps.sh first (the Makefile's `image` target does).
#
# Environment:
#   BERTH_CACHE  cache directory holding bash-static/ (default: $REPO/.cache)
#   BERTH_BUILD  output directory (default: $REPO/build)
#   IMAGE_REF    image reference (default: berth.dev/base:latest)
#   FORCE=1      rebuild even when the archive is up to date
#
# Output: $BERTH_BUILD/base.oci.tar (the archive; its last stdout line is
# "PATH REF MANIFEST-DIGEST") and $BERTH_BUILD/rootfs (the unpacked tree).
# The archive is reproducible: the same inputs give the same digest.
#
# Image contents: /bin/busybox and its applets (/bin/sh is busybox ash),
# /bin/bash (bash-static), printenv and nohup as sh scripts (Debian's
# busybox-static lacks both), users root (0), berth (1000:1000, home /home/berth
# owned by it) and nobody (65534), /tmp and /var/tmp 1777, /workspace,
# /etc/hosts. PATH is the usual one; the default command is /bin/sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${BERTH_CACHE:-$REPO/.cache}
BUILD=${BERTH_BUILD:-$REPO/build}
REF=${IMAGE_REF:-berth.dev/base:latest}
OUT=$BUILD/base.oci.tar
BUSYBOX=/bin/busybox
BASH_STATIC=$CACHE/bash-static/bin/bash-static

log() { printf 'base-image: %s\n' "$*" >&2; }

for f in "$BUSYBOX" "$BASH_STATIC"; do
	[[ -x $f ]] || { log "$f missing: run scripts/deps.sh first"; exit 1; }
done
# A dynamically linked busybox (package busybox, not busybox-static) would
# not run in an image without a libc.
if command -v file >/dev/null && LC_ALL=C file -L "$BUSYBOX" | grep -q 'dynamically linked'; then
	log "$BUSYBOX is dynamically linked: install busybox-static"
	exit 1
fi

# Inputs whose change must rebuild the image.
inputs=("$BUSYBOX" "$BASH_STATIC" "${BASH_SOURCE[0]}" "$REPO"/internal/ociarchive/*.go "$REPO"/internal/cmd/mkimage/*.go)
if [[ ${FORCE:-0} != 1 && -f $OUT && -z $(find "${inputs[@]}" -newer "$OUT" 2>/dev/null) ]]; then
	log "$OUT is up to date (FORCE=1 rebuilds)"
	exit 0
fi

mkdir -p "$BUILD"
rootfs=$BUILD/rootfs
rm -rf "$rootfs" "$rootfs.tmp"
r=$rootfs.tmp
mkdir -p "$r"

install -d -m 0755 "$r"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,usr/local/sbin,etc,dev,proc,sys,run,mnt,opt,var,workspace,home/berth}
install -d -m 0700 "$r/root"
install -d -m 1777 "$r/tmp" "$r/var/tmp"

install -m 0755 "$BUSYBOX" "$r/bin/busybox"
install -m 0755 "$BASH_STATIC" "$r/bin/bash"
n=0
while read -r applet; do
	# --list-full gives paths like bin/ls and usr/bin/awk; linuxrc (an
	# initrd entry point at the root) is of no use in a container.
	[[ $applet == */* ]] || continue
	[[ -e $r/$applet || -L $r/$applet ]] && continue # bin/busybox, bin/bash
	ln -s /bin/busybox "$r/$applet"
	n=$((n + 1))
done < <("$BUSYBOX" --list-full)

cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/bash
berth:x:1000:1000:berth:/home/berth:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat >"$r/etc/group" <<'EOF'
root:x:0:
berth:x:1000:
nogroup:x:65534:
EOF
cat >"$r/etc/shadow" <<'EOF'
root:*:20000:0:99999:7:::
berth:*:20000:0:99999:7:::
nobody:*:20000:0:99999:7:::
EOF
chmod 0640 "$r/etc/shadow"
cat >"$r/etc/hosts" <<'EOF'
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
EOF
cat >"$r/etc/profile" <<'EOF'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
PS1='\u@\h:\w\$ '
EOF
printf '/bin/sh\n/bin/bash\n' >"$r/etc/shells"

# Debian's busybox-static has no printenv or nohup applet; both are expected
# in any image (printenv NAME is the portable way to read one variable).
cat >"$r/usr/bin/printenv" <<'EOF'
#!/bin/sh
# printenv [NAME]...: print the environment, or the value of each NAME on its
# own line; exit 1 if any NAME is unset (coreutils semantics, without -0).
[ $# -eq 0 ] && exec env
exec awk 'BEGIN {
	rc = 0
	for (i = 1; i < ARGC; i++) if (ARGV[i] in ENVIRON) print ENVIRON[ARGV[i]]; else rc = 1
	exit rc
}' "$@"
EOF
cat >"$r/usr/bin/nohup" <<'EOF'
#!/bin/sh
# nohup COMMAND [ARG]...: run COMMAND ignoring SIGHUP; output that would go
# to a terminal goes to nohup.out (coreutils semantics).
if [ $# -eq 0 ]; then
	echo "usage: nohup COMMAND [ARG]..." >&2
	exit 125
fi
trap '' HUP
if [ -t 1 ]; then
	exec >>nohup.out || exec >>"$HOME/nohup.out" || exit 125
	echo "nohup: ignoring input and appending output to 'nohup.out'" >&2
fi
[ -t 2 ] && exec 2>&1
exec "$@"
EOF
chmod 0755 "$r/usr/bin/printenv" "$r/usr/bin/nohup"
chmod 0644 "$r"/etc/{passwd,group,hosts,profile,shells}
mv "$r" "$rootfs"
# shellcheck disable=SC2016 # expanded by bash-static
log "rootfs: busybox with $n applet links, bash $("$BASH_STATIC" -c 'echo $BASH_VERSION')"

(cd "$REPO" && go run ./internal/cmd/mkimage \
	--rootfs "$rootfs" --ref "$REF" --out "$OUT" \
	--cmd /bin/sh --chown home/berth=1000:1000)
log "$OUT: $(du -h "$OUT" | cut -f1)"
