#!/usr/bin/env bash
# The habits that keep the code as it is (seconds): ruff's lint and format check over the
# repository, and mypy --strict over the math and the records ([tool.mypy] in pyproject.toml).
# The same checks run as pre-commit hooks (.pre-commit-config.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
