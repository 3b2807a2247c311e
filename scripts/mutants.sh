#!/usr/bin/env bash
# Mutation testing of the accounting layer (README, "Contributing"); an estimated 4-5 h on 2 cores for all
# of ray_dptune/accounting/, minutes for one module. mutmut (pinned in the [lint] extra) mutates
# every function there and runs the fast tests that reach each mutant (config: [tool.mutmut] in
# pyproject.toml); scripts/mutant_probe.py then sorts the survivors by what they do to the
# reported numbers. A LOWERS or ACCEPTS verdict is a hole: kill it with a test.
#
#   bash scripts/mutants.sh                                        # everything
#   bash scripts/mutants.sh 'ray_dptune.accounting.bounds.selection.*'    # one module (mutmut name globs)
#
# Results stay in mutants/ (git-ignored): with no argument, mutmut keeps each mutant's cached verdict;
# a glob re-runs every mutant it names, finished or not (so a module named twice runs twice).
set -euo pipefail
# mutmut forks one process per mutant from a parent that has already run the tests: a thread pool the
# parent started (OpenMP, BLAS) hangs in the child, and the mutant is scored "timed out" for a test
# that never ran. One thread each keeps the children honest (and 2 cores busy).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
cd "$(dirname "$0")/.."
bash scripts/setup.sh
start=$SECONDS
.venv/bin/mutmut run --max-children "${MUTANT_WORKERS:-2}" "$@" | tr '\r' '\n' | tail -1
results=$(.venv/bin/mutmut results --all true)
if [[ $# -gt 0 ]]; then
    pattern=$(printf '%s\n' "$@" | sed 's/\./\\./g; s/\*/.*/g' | paste -sd'|')
    results=$(grep -E "^ *(${pattern}):" <<<"$results" || true)
fi
status_count() { grep -c ": $1\$" <<<"$results" || true; }
killed=$(status_count killed) survived=$(status_count survived) untested=$(status_count "no tests")
timeouts=$(status_count timeout)
echo "mutation score: ${killed} killed + ${timeouts} timed out of $((killed + timeouts + survived + untested))" \
    "(${survived} survived, ${untested} reached by no fast test)"
echo "the survivors and the untested, by what they do to the reported numbers:"
grep -E ': (survived|no tests)$' <<<"$results" | sed 's/^ *//; s/: .*//' |
    (cd mutants && PYTHONPATH=. ../.venv/bin/python ../scripts/mutant_probe.py)
echo "$((SECONDS - start)) s"
