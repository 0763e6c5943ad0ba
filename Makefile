.PHONY: demo test test-full lint

demo:  ## set up everything, then run the demo pipeline through Airflow
	bash scripts/dev.sh demo

test:  ## set up everything, then run the whole test suite
	bash scripts/dev.sh test

test-full:  ## the whole test suite with its slow variants (more chaos runs, more delta-spark commands): before resolving an issue
	FULL_TESTS=1 bash scripts/dev.sh test

lint:
	bash scripts/bootstrap.sh && .venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
