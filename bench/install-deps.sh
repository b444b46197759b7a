#!/usr/bin/env bash
# Debian packages bench/suite.py needs; installs only what is missing (root, non-interactive).
# apt may start the system rabbitmq-server service when it installs the package: that one is
# stopped again (the suite starts its own throwaway nodes and must not share the CPUs).
set -euo pipefail

need=()
command -v javac >/dev/null 2>&1 || need+=(openjdk-17-jdk-headless)
[ -f /usr/share/java/amqp-client.jar ] || need+=(librabbitmq-client-java)
[ -f /usr/share/java/slf4j-nop.jar ] || need+=(libslf4j-java)
new_rabbit=0
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  need+=(rabbitmq-server)
  new_rabbit=1
fi
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "bench: missing Debian packages: ${need[*]} (run as root, or apt-get install them)" >&2
  exit 1
fi
echo "bench: apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
if [ "$new_rabbit" = 1 ]; then
  service rabbitmq-server stop >/dev/null 2>&1 || true
  # and the epmd that service started (the suite starts and stops its own)
  epmd -kill >/dev/null 2>&1 || true
fi
