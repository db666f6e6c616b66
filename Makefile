# The two commands of the README's quick start. Each installs what it needs first (idempotent).
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup run test
setup:
	@bash scripts/setup.sh

run: setup
	.venv/bin/kpgo run $(ARGS)

test: setup
	.venv/bin/python -m pytest -v -s -rs --durations=0 $(PYTEST_ARGS)
