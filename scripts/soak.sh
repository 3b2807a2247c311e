#!/usr/bin/env bash
# Runs the fault tests N times (default 10) while two busy processes keep both cores loaded, and
# prints each file's pass count: the check that no fault test depends on the machine's speed.
#
#     bash scripts/soak.sh [N] [TEST ...]    (default tests: the kill, node-loss, budget, ASHA and audit ones)
#
# Each round runs every file in one pytest process (one Ray session); the log of a failed round
# is kept under soak-logs/.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
rounds=${1:-10}
shift || true
tests=("$@")
if [[ ${#tests[@]} == 0 ]]; then
    tests=(
        tests/tune/test_driver_kills.py
        tests/tune/test_multinode.py
        tests/tune/test_budget_cap.py
        "tests/tune/test_private_asha.py -k in_tune or example or legacy"
        "tests/audit/test_audit.py::test_an_audited_search_reports_epsilon_lower_beside_epsilon_upper"
    )
fi

hogs=()
for _ in 1 2; do
    .venv/bin/python -c "while True: pass" &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
mkdir -p soak-logs

declare -A passed
for test in "${tests[@]}"; do passed[$test]=0; done
start=$SECONDS
for round in $(seq 1 "$rounds"); do
    for test in "${tests[@]}"; do
        read -r -a words <<<"${test%% -k *}"
        selection=()
        [[ $test == *" -k "* ]] && selection=(-k "${test#* -k }")
        log="soak-logs/round${round}-$(basename "${words[0]%%::*}" .py).log"
        if .venv/bin/python -m pytest -q -p no:cacheprovider "${words[@]}" "${selection[@]}" >"$log" 2>&1; then
            passed[$test]=$((passed[$test] + 1))
            rm -f "$log"
        fi
        echo "round $round: ${test}: $(tail -n 1 "$log" 2>/dev/null || echo passed) ($((SECONDS - start)) s)"
    done
done
echo
echo "under two busy processes, $rounds rounds, $((SECONDS - start)) s:"
for test in "${tests[@]}"; do echo "  ${passed[$test]}/$rounds  $test"; done
