# The two commands the README starts with. Both run scripts/setup first (idempotent, fast when done).
# `make test` (what CI runs) checks the code first: ruff, then mypy (applier strict, tests and bench too; see pyproject.toml).
.PHONY: setup test-servers demo test test-fast lint check

setup:
	@scripts/setup

# The object-store emulators the suite runs against (Azurite; fake-gcs-server with --gcs), once into the cache.
test-servers: setup
	@scripts/setup-test-servers

demo: setup
	.venv/bin/applier demo

# Two workers, each test file whole on one of them (a file's module fixtures are shared, and the files
# that kill and restart processes keep their own order), the longest files first (tests/durations.json):
# 17-24 min on 2 cores until 2026-11-27 (fresh-clone CI runs: 17:10, 18:35, 23:50); 42:12 for 1,049 tests on
# 2026-11-28 (27789aa: Azure and the bench smoke file added; ~51 min with the setup), 43:57 for 1,060 tests
# (4613d93: cuts, readers, the cluster on S3; 49.6 min with the setup), 38:04 for 1,061 (2e96f9e), 36:34 in a
# fresh-clone CI run of 9055dfa (41:57 with the setup), 34:00 for 1,083 in one of 921315a (39:30), 36:17 for 1,107 in one of 60ecad2 (41:49), 33:38 for 1,109 in one of 263cb2c (38:58), 33:37 for 1,127 in one of 8cc48d3 (38:56), 33:05 for 1,144 in one of fca5bf3 (37:39), 26:14 for 1,162 in one of 3588dd0 (31:07; mostly the run-to-run spread), 32:56 for 1,211 in one of 0528065 (38:18; the spread again, and the deletion-vector tests), 37:44 for 1,250 in one of aa13558 (46:21; a C1-only Spark session for the tests, reverted), 32:36 for 1,274 in one of 25b92a3 (37:30), 33:35 for 1,318 in one of aeed308 (38:50), 39:43 for 1,319 in one of f014900 (45:00; every file ~1.2x slower), 35:09 for 1,340 in one of a6dbb2c (40:44), 19:46 for 1,345 in one of 3a7e261 (22:39; the VM twice as fast that day), 18:11 for 1,351 in one of 7672f3a (20:56), 17:47 for 1,356 in one of f86d7f4 (20:32), 19:03 for 1,364 in one of b0bcb95 (22:00), 20:36 for 1,370 in one of 3eb4085 (24:03), 19:25 for 1,599 in one of ca574be (21:56). Three workers on 2 cores were slower (28 min: every test ~1.5x longer, no idle CPU to fill).
# APPLIER_TEST_WORKERS=1 runs the suite in one process (as `pytest` alone does).
test: setup test-servers check
	.venv/bin/python -m pytest -n $${APPLIER_TEST_WORKERS:-2} --dist loadfile --no-loadscope-reorder

# The unit tier (tests/unit: no PostgreSQL, no Spark): decoder, assembly, config, CLI errors, layout.
# Under a minute on 2 cores; for the edit-test loop, not instead of `make test`. The other tiers:
# `pytest tests/integration` (real PostgreSQL and Spark), `pytest tests/scenario` (kill matrices,
# random histories, a standalone cluster, pipelines); `-m unit|integration|scenario` selects the same.
test-fast: setup
	.venv/bin/python -m pytest tests/unit -q

lint: setup check

check:
	.venv/bin/ruff check applier tests bench jobs scripts
	.venv/bin/mypy
