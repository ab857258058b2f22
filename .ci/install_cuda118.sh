#!/usr/bin/env bash
# Install Debian's CUDA 11.8 toolkit (package nvidia-cuda-toolkit, Debian non-free) so that the
# kernels compile check can build sm_70: the machine's CUDA 13 nvcc has dropped sm_70.
# Idempotent: does nothing when the toolkit's nvcc is already there. Needs root (or sudo) and apt.
set -euo pipefail

NVCC118=/usr/lib/nvidia-cuda-toolkit/bin/nvcc
if [ -x "$NVCC118" ]; then
  echo "install_cuda118: $("$NVCC118" --version | tail -n 2 | head -n 1) already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

# The toolkit lives in Debian's non-free component; add a sources entry like the machine's own
# Debian one (same snapshot-free mirror and suite), with components contrib non-free.
. /etc/os-release
SUITE="${VERSION_CODENAME:-bookworm}"
LIST=/etc/apt/sources.list.d/qgate-debian-nonfree.sources
if [ ! -f "$LIST" ]; then
  $SUDO tee "$LIST" >/dev/null <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: ${SUITE} ${SUITE}-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends nvidia-cuda-toolkit
"$NVCC118" --version | tail -n 2
