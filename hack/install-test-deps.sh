#!/usr/bin/env bash
# The system packages `make test` needs and pip cannot install, installed when missing:
#   podman, runc, busybox-static  the real CDI consumer of the node tests and their image
#   the shellcheck package        tests/api/test_shell_scripts.py checks the shell scripts
#   openssl                       certificates of the kubeconfig TLS tests
#   gcc, libc6-dev                the mock libnvidia-ml.so.1 the NVML backend is tested over
#   python3-venv                  the .venv the Makefile creates
#   libseccomp-dev, pkg-config    runc's seccomp support, built for the local cluster (make e2e)
#   debootstrap                   the agent's image for the local cluster, without Docker
#   iproute2, mount               the pod network's bridge and the cluster's mounts, removed by
#                                 make cluster-down
#   iptables                      kube-proxy's Service rules (iptables mode), removed by
#                                 make cluster-down
#   pipx                          tests/api/test_dist.py installs the CLI's wheel as the README says
# Go (>= 1.26.6) is not a Debian package here: the local cluster's build checks for it itself.
# As root with apt-get it installs them; otherwise it stops with one line naming the command.
set -euo pipefail

packages=()
need() { # need PACKAGE PRESENT-CHECK...
  local package=$1
  shift
  "$@" >/dev/null 2>&1 || packages+=("$package")
}
need podman command -v podman
need runc command -v runc
need busybox-static test -x /bin/busybox
need shellcheck command -v shellcheck
need openssl command -v openssl
need gcc command -v cc
need libc6-dev test -e /usr/include/stdio.h
need python3-venv "${PYTHON:-python3}" -c 'import ensurepip, venv'
need libseccomp-dev test -e /usr/include/seccomp.h
need pkg-config command -v pkg-config
need debootstrap command -v debootstrap
need iproute2 command -v ip
need mount command -v umount
need iptables command -v iptables-save
need pipx command -v pipx

[ ${#packages[@]} -eq 0 ] && exit 0

command="apt-get install -y --no-install-recommends ${packages[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "make test needs system packages; run as root: apt-get update && $command" >&2
  exit 1
fi
echo "installing the system packages the tests need: ${packages[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
