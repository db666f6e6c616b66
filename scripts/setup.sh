#!/usr/bin/env bash
# Install what kpgo needs on Debian 12, idempotently: a second call costs seconds.
#   apt: QEMU, the kernel source, kernel build dependencies
#   pip: kpgo itself (editable) with its test tools, Ray (the cluster extra) and virtme-ng, in ./.venv
#   then every workload's packages (servers, load generators) via `kpgo workloads install`;
#   KPGO_WORKLOADS=redis,nginx limits that to some (default: all)
#   then the simulated-counter QEMU plugin and its guest tool (docs/SIM.md): the plugin header
#   comes once from Debian's qemu source package (network), cached in ~/.cache/kpgo/qemu-plugin
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

APT_PACKAGES=(
  qemu-system-x86 linux-source-6.12
  linux-config-6.12  # Debian's own kernel configs: --base debian, --base debian-cloud (docs/DEBIAN.md)
  passt  # the guest's network with --client host (QEMU's -netdev stream; slirp stalls under load, docs/WORKLOADS.md)
  qemu-user  # tests/test_sim.py runs the plugin's probes under user-mode QEMU too
  ccache  # reuses objects whose inputs (the .gcda included) did not change, across optimized builds and runs
  gcc make bc bison flex libelf-dev libssl-dev cpio binutils xz-utils
  gcc-12-plugin-dev g++ patch  # value profiles (--values): kpgo's GCC plugin and kernel patch (docs/VALUES.md)
  python3 python3-venv
  libglib2.0-dev pkg-config dpkg-dev libc6-dev  # the QEMU plugin (GLib), its header fetch (apt-get source), kpgo-window
  debhelper kmod  # kpgo package: the kernel's bindeb-pkg (dpkg-dev has dpkg-buildpackage; kmod is one of its build dependencies; docs/PACKAGING.md)
  chromium-headless-shell  # renders report.html in the report test
  bolt-19 llvm-19  # branch records' consumers: perf2bolt/llvm-bolt and llvm-profgen (docs/LAYOUT.md; tests/test_branches.py)
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python ≥ 3.11: the first python3 on PATH that is new enough.
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: $PY is older than 3.11; set PYTHON=/path/to/python3.11+" >&2
  exit 1
fi
stamp_want="$("$PY" --version 2>&1) $(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.kpgo-stamp 2>/dev/null)" != "$stamp_want" ]; then
  echo "setup: creating .venv and installing kpgo, Ray, virtme-ng and test tools"
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test,cluster]' virtme-ng  # cluster: Ray, for --cluster and its tests
  echo "$stamp_want" > .venv/.kpgo-stamp
fi
.venv/bin/kpgo workloads install "${KPGO_WORKLOADS:-all}"
.venv/bin/python -m kpgo.sim   # builds libkpgosim.so for the installed QEMU and kpgo-window (idempotent)
echo "setup: ready in $(( $(date +%s) - start )) s (run .venv/bin/kpgo, or make run / make test)"
