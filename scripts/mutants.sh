#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Mutation testing of the security checks: every check in tests/mutants/mutants.toml is broken
# in turn (in a scratch copy, build-mutants/src, with one reused build directory), rebuilt, and
# must be caught by the tests mapped to it with a message naming the check. See docs/mutants.md.
#
#   bash scripts/mutants.sh                 every mutant (prints killed/total and the survivors)
#   bash scripts/mutants.sh --quick         the fixed sample CI runs (quick = true)
#   bash scripts/mutants.sh --changed [REF] the mutants whose file this branch changed (vs main)
#   bash scripts/mutants.sh --only ID...    these mutants
#   bash scripts/mutants.sh --list          list them
#   bash scripts/mutants.sh --check         no build: does every original text still apply?
#
# MUTANTS_NINJA_JOBS limits the build's parallelism. Needs root (the tests do) and a configured
# toolchain (scripts/setup.sh). Exit status: 0 only when every selected mutant is killed.
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 scripts/mutants.py "$@"
