# The two commands the README starts with. Both run scripts/setup first (idempotent, fast when done).
.PHONY: setup demo test lint

setup:
	@scripts/setup

demo: setup
	.venv/bin/applier demo

test: setup
	.venv/bin/python -m pytest

lint: setup
	.venv/bin/ruff check applier tests bench jobs scripts
