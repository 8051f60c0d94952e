#!/usr/bin/env bash
# Prometheus 2.42 and Alertmanager 0.25 (with promtool and amtool) from Debian's packages: the tests
# run the real servers on loopback ports. Skipped when already installed; needs root and apt.
set -euo pipefail

missing=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v amtool >/dev/null 2>&1 && command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: ${missing[*]} missing; install the Debian packages (apt-get install ${missing[*]}) as root" >&2
  exit 2
fi
echo "setup: installing ${missing[*]} (Debian packages)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The packages' services are not started here (no init system); tests start their own instances.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
