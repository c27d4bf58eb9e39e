#!/usr/bin/env bash
# Install what the tests need (Debian's openssh-server and chromium when missing, the Python extras) and
# run the whole suite. Extra arguments go to pytest. Installing happens here only, never inside pytest, and
# under one lock, so two runs started at once on one machine do not race apt-get or pip.
#
# The Python side goes into the interpreter this script runs: the active venv ($VIRTUAL_ENV), else whatever
# `python3` is first on PATH. It says which before installing; it never reaches past a venv to its base.
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3
if [ -n "${VIRTUAL_ENV:-}" ]; then py="$VIRTUAL_ENV/bin/python"; fi
where=$("$py" -c 'import sys; v = sys.prefix != sys.base_prefix; print(sys.prefix, "(a venv)" if v else "(no venv: this python3 itself)")')
echo "scripts/test.sh: installing the trainer, test and tpu extras into $where" >&2
(
  flock 9
  missing=()
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  if [ ${#missing[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  "$py" -m pip install -q -e '.[trainer,test,tpu]'
) 9>"${TMPDIR:-/tmp}/tpuops-test-install-$(id -u).lock"
# CI (.ci/run) type-checks before the tests, so the test runner's summary is the last line it prints.
if [ "${TPUOPS_TYPECHECK:-0}" = 1 ]; then "$py" -m mypy; fi
# Three pytest workers (pytest-xdist) unless the caller picks (-n N, or -p no:xdist): much of a test's time is
# waiting on sshd, subprocesses and polls; with two, a 2-core machine's CPU was 25% idle (docs/ci.md). Work
# stealing: a worker that runs out takes half of another's queue, so none idles while another runs a long
# tail (tests/conftest.py runs the longest modules first).
workers=(-n "${TPUOPS_TEST_WORKERS:-3}" --dist worksteal)
for a in "$@"; do case "$a" in -n|-n*|--numprocesses*|no:xdist) workers=() ;; esac; done
exec "$py" -m pytest "${workers[@]}" "$@"
