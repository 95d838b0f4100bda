#!/bin/bash
# Installs the Debian packages Ember needs to build, test and run. Idempotent: quiet and quick
# when everything is present; otherwise one apt-get update and one apt-get install.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git libssl-dev
  libfuse3-dev fuse3
  librocksdb-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libxxhash-dev libgoogle-perftools-dev
  libibverbs-dev rdma-core
  libgtest-dev libgmock-dev python3 python3-torch
  libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libcpp-httplib-dev libspdlog-dev
  procps psmisc bc openssl util-linux clang
  prometheus chromium systemd curl libcurl4-openssl-dev nginx-light
  fio rclone bindfs etcd-server etcd-client
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# node and npm may come from elsewhere (e.g. NodeSource's nodejs bundles npm and conflicts with
# Debian's npm): only ask Debian for them when the commands are missing.
command -v node > /dev/null 2>&1 || missing+=(nodejs)
command -v npm > /dev/null 2>&1 || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
