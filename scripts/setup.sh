#!/usr/bin/env bash
# Installs what zipage needs to build, from Debian's packages. Safe to run again.
set -euo pipefail
packages=(build-essential cmake ccache libeigen3-dev doctest-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev
          libcpp-httplib-dev pkg-config python3-jinja2)  # cpp-httplib: zipage-serve; jinja2: chat template test
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
echo "setup: all dependencies present"
