#!/usr/bin/env bash
# Sets up .venv if needed, then runs the whole test suite (extra args go to pytest).
#
# The suite runs as two pytest processes at once (tests/conftest.py, --part): the tests on the
# shared Ray session (the longer part: Ray starts a process for every trial, and the trainables
# wait), and all the others, mostly one core of math, at a lower priority (nice) so that they
# fill the Ray part's idle time rather than slow it. The Ray part streams here, the other part's
# report follows it, and the run ends with the 15 slowest tests of both. TESTS_SERIAL=1 runs one
# pytest process instead. The exhaustive grids: --exhaustive (README, "Tests").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ "${TESTS_SERIAL:-0}" == 1 ]]; then
    exec .venv/bin/python -m pytest "$@"
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$SECONDS
nice -n 10 .venv/bin/python -m pytest --part rest -o cache_dir=.pytest_cache/rest "$@" >"$logs/rest" 2>&1 &
rest_pid=$!
set +e
.venv/bin/python -m pytest --part ray -o cache_dir=.pytest_cache/ray "$@" 2>&1 | tee "$logs/ray"
ray_status=${PIPESTATUS[0]}
wait "$rest_pid"
rest_status=$?
set -e
echo
echo "=============================== the other tests (--part rest) ==============================="
cat "$logs/rest"
echo
echo "============================ slowest 15 durations, both parts ============================"
cat "$logs/ray" "$logs/rest" | grep -E '^[0-9.]+s (call|setup|teardown) ' | sort -rn | head -15 || true
echo "tests: Ray part exit ${ray_status}, other part exit ${rest_status}; $((SECONDS - start)) s in all"

# 5 is pytest's "no test collected": fine for one part when the other ran (e.g. -k picks math only)
if [[ $ray_status == 5 && $rest_status == 5 ]]; then exit 5; fi
for status in "$ray_status" "$rest_status"; do
    if [[ $status != 0 && $status != 5 ]]; then exit "$status"; fi
done
exit 0
