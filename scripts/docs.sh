#!/usr/bin/env bash
# Builds the documentation site strictly (a broken link or reference fails) and serves it.
#
#     bash scripts/docs.sh          # build into site/, then serve on http://127.0.0.1:8000
#     bash scripts/docs.sh build    # build only
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/mkdocs build --strict --site-dir site
[[ "${1:-serve}" == build ]] || exec .venv/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8000
