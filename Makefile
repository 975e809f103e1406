# The two commands the README starts with. Both run scripts/setup first (idempotent, fast when done).
# `make test` (what CI runs) checks the code first: ruff, then mypy (strict, see pyproject.toml).
.PHONY: setup demo test lint check

setup:
	@scripts/setup

demo: setup
	.venv/bin/applier demo

test: setup check
	.venv/bin/python -m pytest

lint: setup check

check:
	.venv/bin/ruff check applier tests bench jobs scripts
	.venv/bin/mypy
