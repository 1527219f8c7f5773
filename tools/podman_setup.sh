#!/usr/bin/env bash
# Make rootful podman usable for gyre's container sandboxes on a machine that reaches no
# registry: install podman and runc if missing, write gyre's containers.conf, and build the base
# image localhost/gyre-base:latest from the host's own /usr. Idempotent: a second run only checks.
#
#   tools/podman_setup.sh            # install, configure, build the base image if it is missing
#   tools/podman_setup.sh --rebuild  # build the base image again (after the host's /usr changed)
#
# The configuration goes to /etc/containers/gyre.conf; gyre's sandboxes point CONTAINERS_CONF at
# it when it is unset (export CONTAINERS_CONF=/etc/containers/gyre.conf to use it by hand).
set -euo pipefail

CONF=/etc/containers/gyre.conf
BASE=localhost/gyre-base:latest
# Trees of the host's /usr that no task's tests need: a cloud SDK, JVMs, CUDA, LLVM, manuals.
EXCLUDES=(
    usr/lib/google-cloud-sdk usr/lib/jvm 'usr/local/cuda*' 'usr/lib/llvm-*'
    usr/share/doc usr/share/man usr/share/info
)
ETC_FILES=(passwd group nsswitch.conf ld.so.cache ld.so.conf ld.so.conf.d localtime alternatives hosts)

rebuild=0
[[ "${1:-}" == "--rebuild" ]] && rebuild=1

if [[ $(id -u) -ne 0 ]]; then
    echo "podman_setup.sh: run as root (gyre's container sandboxes use rootful podman)" >&2
    exit 1
fi

if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
    echo "podman_setup.sh: installing podman and runc"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc >/dev/null
fi

# crun fails here (setrlimit RLIMIT_NOFILE, hybrid cgroups): runc on cgroupfs, and no default
# ulimits a container could not raise to.
mkdir -p "$(dirname "$CONF")"
cat >"$CONF.new" <<'EOF'
# gyre's container sandboxes (tools/podman_setup.sh writes this file)
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
mv "$CONF.new" "$CONF"
export CONTAINERS_CONF="$CONF"

if [[ $rebuild -eq 0 ]] && podman image exists "$BASE"; then
    echo "podman_setup.sh: $BASE present; CONTAINERS_CONF=$CONF"
    exit 0
fi

echo "podman_setup.sh: building $BASE from the host's /usr (a minute or two)"
stage=$(mktemp -d /tmp/gyre-base.XXXXXX)
trap 'rm -rf "$stage" "$stage.tar"' EXIT
mkdir -p "$stage/etc" "$stage/tmp" "$stage/app" "$stage/root"
chmod 1777 "$stage/tmp"
for name in "${ETC_FILES[@]}"; do
    if [[ -e /etc/$name ]]; then cp -a "/etc/$name" "$stage/etc/"; fi
done
grep -q '^nobody:' "$stage/etc/passwd" || echo 'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' >>"$stage/etc/passwd"
linked=() folders=()  # the merged-/usr root links are recreated; real folders are copied
for name in bin lib lib64 sbin; do
    if [[ -L /$name ]]; then ln -s "$(readlink "/$name")" "$stage/$name"; linked+=("$name")
    elif [[ -d /$name ]]; then folders+=("$name"); fi
done
excludes=()
for pattern in "${EXCLUDES[@]}"; do excludes+=(--exclude="$pattern"); done
tar -C / -cf "$stage.tar" "${excludes[@]}" usr "${folders[@]}"
tar -C "$stage" -rf "$stage.tar" etc tmp app root "${linked[@]}"
podman --runtime runc --cgroup-manager cgroupfs import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' --change 'WORKDIR /app' \
    --message "the host's /usr ($(hostname), $(date -u +%F))" \
    "$stage.tar" "$BASE" >/dev/null
echo "podman_setup.sh: built $BASE; CONTAINERS_CONF=$CONF"
