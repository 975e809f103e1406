# The two commands the README starts with. Both run scripts/setup first (idempotent, fast when done).
# `make test` (what CI runs) checks the code first: ruff, then mypy (applier strict, tests and bench too; see pyproject.toml).
.PHONY: setup demo test test-fast lint check

setup:
	@scripts/setup

demo: setup
	.venv/bin/applier demo

test: setup check
	.venv/bin/python -m pytest

# The tier without servers (no PostgreSQL, no Spark): decoder, assembly, values, config, CLI errors.
# Under a minute on 2 cores; for the edit-test loop, not instead of `make test`.
test-fast: setup
	.venv/bin/python -m pytest -m "not postgres and not spark" -q

lint: setup check

check:
	.venv/bin/ruff check applier tests bench jobs scripts
	.venv/bin/mypy
