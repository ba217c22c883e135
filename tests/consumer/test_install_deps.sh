#!/usr/bin/env bash
# scripts/install-deps.sh's "only when missing" checks, run against stub
# commands (nothing is installed): with every tool present and a BLIS header
# on the system but no libblis-dev package (another flavour such as
# libblis-openmp-dev provides it), nothing may be asked of apt.
# Then a python3 without pip: python3-pip must be installed by apt; and one
# without venv: python3-venv.
# Skips (77) on a machine without a BLIS header.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
found=0
for h in /usr/include/blis.h /usr/include/*/blis.h /usr/include/blis/blis.h; do [ -f "$h" ] && found=1; done
if [ "$found" = 0 ]; then echo "no blis.h on this machine: skipped"; exit 77; fi

stubs=$(mktemp -d)
trap 'rm -rf "$stubs"' EXIT
for t in cmake ninja pkg-config ccache python3; do printf '#!/bin/sh\nexit 0\n' > "$stubs/$t"; done
# dpkg -s: every package installed except libblis-dev
printf '#!/bin/sh\n[ "$2" = libblis-dev ] && exit 1\nexit 0\n' > "$stubs/dpkg"
printf '#!/bin/sh\necho "$@" >> "%s/apt.log"\nexit 0\n' "$stubs" > "$stubs/apt-get"
printf '#!/bin/sh\necho 0\n' > "$stubs/id"
chmod +x "$stubs"/*
PATH="$stubs:$PATH" bash "$root/scripts/install-deps.sh"
if [ -f "$stubs/apt.log" ]; then
  echo "install-deps asked apt for packages already present:"; cat "$stubs/apt.log"; exit 1
fi

# A python3 without pip (Debian's default) and without pytest: python3-pip
# must come from apt before the pip installs.
cat > "$stubs/python3" <<'PY'
#!/bin/sh
case "$*" in
  "-m pip --version") exit 1 ;;
  "-c import pytest, numpy") exit 1 ;;
esac
exit 0
PY
PATH="$stubs:$PATH" bash "$root/scripts/install-deps.sh"
if ! grep -q "install .*python3-pip" "$stubs/apt.log" 2>/dev/null; then
  echo "install-deps did not install python3-pip for a python3 without pip"; exit 1
fi
# The same with only matplotlib missing (fastbench report's charts).
rm -f "$stubs/apt.log"
cat > "$stubs/python3" <<'PY'
#!/bin/sh
case "$*" in
  "-m pip --version") exit 1 ;;
  "-c import matplotlib") exit 1 ;;
esac
exit 0
PY
PATH="$stubs:$PATH" bash "$root/scripts/install-deps.sh" | grep -q "pip install matplotlib" ||
  { echo "install-deps did not pip install a missing matplotlib"; exit 1; }
if ! grep -q "install .*python3-pip" "$stubs/apt.log" 2>/dev/null; then
  echo "install-deps did not install python3-pip for matplotlib on a python3 without pip"; exit 1
fi
# A python3 without ensurepip (Debian's, without python3-venv): the wheel
# test's venv needs python3-venv from apt.
rm -f "$stubs/apt.log"
cat > "$stubs/python3" <<'PY'
#!/bin/sh
[ "$*" = "-c import ensurepip, venv" ] && exit 1
exit 0
PY
PATH="$stubs:$PATH" bash "$root/scripts/install-deps.sh"
if ! grep -q "install .*python3-venv" "$stubs/apt.log" 2>/dev/null; then
  echo "install-deps did not install python3-venv for a python3 without venv"; exit 1
fi
echo "install-deps OK"
