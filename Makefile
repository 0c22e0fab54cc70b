# Entry points a person types. Every target installs what it needs first (uv, then the
# locked Python environment), so a fresh clone needs nothing but the tools the README names.
SHELL := /bin/bash
.DEFAULT_GOAL := help

UV_VERSION := 0.13.9
TOOLS := $(CURDIR)/.tools
UV := $(shell command -v uv 2>/dev/null || echo $(TOOLS)/uv/bin/uv)
RUN := $(UV) run --frozen --all-packages
PACKAGES := contracts packages/pin-runtime packages/pin-testkit $(wildcard services/*)
MYPY_DIRS := $(PACKAGES) infra $(patsubst %/,%,$(wildcard bench/*/)) $(if $(wildcard tests-e2e/*.py),tests-e2e) $(if $(wildcard tests-kube/*.py),tests-kube)

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(TOOLS)/uv/bin/uv:
	python3 -m venv $(TOOLS)/uv
	$(TOOLS)/uv/bin/pip install --quiet "uv==$(UV_VERSION)"

.venv/.synced: uv.lock pyproject.toml $(UV)
	$(UV) sync --frozen --all-packages
	@touch $@

.PHONY: sync
sync: .venv/.synced ## install uv and the locked Python environment

.PHONY: lint
lint: sync ## ruff (lint + format check) and mypy --strict on every member
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) python -m pin_contracts.schemas check
	$(RUN) python -m pin_contracts.asyncapi check
	@set -e; for p in $(MYPY_DIRS); do echo "mypy $$p"; (cd $$p && $(RUN) mypy .); done

# One command in the locked environment, with the uv `make sync` chose (on the PATH, else
# .tools/uv/bin/uv): what the READMEs give for anything without a target of its own.
.PHONY: run
run: sync ## a command in the locked environment: make run CMD="pytest contracts/tests"
	@test -n "$(CMD)" || { echo 'usage: make run CMD="python -m pin_contracts.asyncapi check"' >&2; exit 2; }
	@$(RUN) $(CMD)

.PHONY: fmt
fmt: sync ## apply ruff's fixes and formatting
	$(RUN) ruff check --fix .
	$(RUN) ruff format .

.PHONY: up
up: sync ## start real PostgreSQL and Kafka on loopback (idempotent)
	$(RUN) pin-local up

.PHONY: down
down: sync ## stop what `make up` started
	$(RUN) pin-local down

# Unit tests of every member, their integration tests on the real services, then end to end.
TEST_PATHS := contracts/tests $(wildcard packages/*/tests) $(wildcard services/*/tests) infra/tests \
	$(wildcard tests-e2e)

# Pact: consumer tests write contracts/pacts/, then the real producers are verified against them.
PACT_CONSUMER_TESTS := contracts/tests/pact services/rewards-membership/tests/test_pact_consumer.py
PACT_PROVIDER_TESTS := services/identity-fanout/tests/test_pact_provider.py
# The pact verifier reports anonymous usage to its vendor unless told not to.
export PACT_DO_NOT_TRACK := true

.PHONY: pact
pact: up ## consumer pact tests (write contracts/pacts/), then provider verification
	eval "$$($(RUN) pin-local -q env)" && $(RUN) pytest $(PACT_CONSUMER_TESTS) \
		&& $(RUN) pytest $(PACT_PROVIDER_TESTS)

.PHONY: pact-publish
pact-publish: ## publish contracts/pacts/ to the pact broker named by PACT_BROKER_BASE_URL
	contracts/pact-publish.sh

# The release flow on a broker: publish the pacts, verify identity-fanout against the
# broker's pacts and publish the results, then can-i-deploy every pacticipant.
.PHONY: pact-broker
pact-broker: pact ## with PACT_BROKER_BASE_URL: publish, verify and publish results, can-i-deploy
	@test -n "$$PACT_BROKER_BASE_URL" || { echo "pact-broker: PACT_BROKER_BASE_URL is not set" >&2; exit 2; }
	contracts/pact-publish.sh
	. contracts/pact-broker-env.sh && eval "$$($(RUN) pin-local -q env)" \
		&& PIN_PACT_BROKER_RELEASE=true $(RUN) pytest $(PACT_PROVIDER_TESTS) -k test_release_on_the_broker
	contracts/pact-can-i-deploy.sh

.PHONY: sbom
sbom: sync ## each image's CycloneDX SBOM from uv.lock, in build/sbom/ (checked against the lock)
	UV=$(UV) infra/checks/sbom.sh

.PHONY: infra-check
infra-check: sync ## images, SBOMs, Helm charts, monitoring rules, pin-contracts release (tools cached per user)
	UV=$(UV) infra/checks/all.sh

# `make test`: every step runs and reports, whatever failed before it; red if any failed.
.PHONY: test
test: ## lint, infra checks, pact, then every test on real PostgreSQL and Kafka (each step whatever failed before)
	@$(MAKE) -k --no-print-directory lint infra-check pact test-suites

.PHONY: test-suites
test-suites: model-tools up ## every test but pact's: unit, integration and end-to-end
	eval "$$($(RUN) pin-local -q env)" && $(RUN) pytest $(TEST_PATHS) \
		$(addprefix --ignore=,$(PACT_CONSUMER_TESTS) $(PACT_PROVIDER_TESTS))

# What `make test` leaves out and CI runs after it, each step whatever failed before it, red
# if any failed: what ships (the containers, both releases on Kubernetes) and every check of
# the outbox model. The long chaos faults and the 10,000-example fuzz take longer than CI's
# limit allows beside them: `make chaos`, `make fuzz`.
.PHONY: ci
ci: ## after make test: the containers, both releases on Kubernetes, the outbox model
	@$(MAKE) -k --no-print-directory test-containers e2e-kube model

# The shipped artefacts on a Docker engine (infra/README.md "Containers"): the engine itself
# (Debian's docker.io, Compose built from the Go module proxy, dockerd without a bridge), the
# images built from the package registries alone, and integration tests on testcontainers.
.PHONY: engine
engine: ## a Docker engine here: docker.io and Compose where missing, dockerd without bridge (idempotent)
	infra/docker/engine.sh up

.PHONY: images
images: sync engine ## the base images from Debian, PyPI and Maven Central, then both service images labelled with the revision
	UV=$(UV) infra/docker/images.sh all

TESTCONTAINERS_TESTS := packages/pin-testkit/tests/test_runtime_roles_integration.py \
	services/rewards-membership/tests/test_hostile_records_integration.py
.PHONY: testcontainers
testcontainers: images ## integration tests on PostgreSQL and Kafka that testcontainers starts (PIN_SERVICES=containers)
	PIN_SERVICES=containers $(RUN) pytest $(TESTCONTAINERS_TESTS)

# The whole system in containers (infra/compose), on the local bases unless PIN_IMAGE_BASES=public.
STACK := $(if $(filter public,$(PIN_IMAGE_BASES)),,PIN_POSTGRES_IMAGE=$${PIN_POSTGRES_IMAGE:-pin-base/postgres:15} \
	PIN_KAFKA_IMAGE=$${PIN_KAFKA_IMAGE:-pin-base/kafka:4.2.0}) docker compose -f infra/compose/docker-compose.yml
.PHONY: stack
stack: images ## the whole system in containers, as the charts run it (infra/compose): up and healthy
	$(STACK) up -d --wait

.PHONY: stack-down
stack-down: ## remove the compose stack and its volumes
	$(STACK) down -v --remove-orphans

# The end-to-end scenarios with every service a container of its image and the stack's
# PostgreSQL and Kafka as the servers (tests-e2e/pin_e2e/stack.py): one suite, two topologies.
# Not here: 9 (its TLS/SCRAM broker and certificates are host files), 10 (Toxiproxy and
# the private servers of the chaos campaign), 12 (the previous release is built from git
# history into a virtual environment, not an image) and 13 (the outbox history checks the
# relay's code, not its image: once per `make test`), nor the pure tests of 10's and 13's
# parts.
E2E_COMPOSE_TESTS := $(filter-out tests-e2e/test_9_secrets.py tests-e2e/test_10_chaos_campaign.py \
	tests-e2e/test_12_rolling_upgrade.py tests-e2e/test_13_outbox_history.py \
	tests-e2e/test_chaos_%.py tests-e2e/test_history_%.py,$(wildcard tests-e2e/test_*.py))
.PHONY: e2e-compose
e2e-compose: images ## build the images, bring a fresh compose stack up, run the e2e scenarios on its containers, remove it
	$(STACK) down -v --remove-orphans
	$(STACK) up -d --wait
	PIN_E2E_TOPOLOGY=containers $(RUN) pytest $(E2E_COMPOSE_TESTS); status=$$?; \
	$(STACK) down -v --remove-orphans; exit $$status

# Both Helm releases on a real one-node Kubernetes built on this machine from the package
# registries (infra/kube: Kubernetes from its Go module, Debian's etcd, containerd, runc and CNI
# plugins, CoreDNS), in a network namespace of its own: the previous release installed, then
# upgraded with work in flight, helm test, the flows, pods killed, rollback and forward, a
# drain against the PodDisruptionBudgets. The cluster is taken down afterwards, whatever
# happened (PIN_KUBE_KEEP=1 keeps it). Needs root (or password-less sudo), Go and gcc.
.PHONY: e2e-kube
e2e-kube: images ## both releases on a real Kubernetes built here: install, upgrade, helm test, scenarios, kills, rollback, drain
	infra/kube/e2e.sh

# What `make ci` runs first: the engine (installed and started where missing), every image
# built from the registries, the scenarios on the compose stack, integration tests on
# testcontainers; the project's containers removed afterwards, whatever happened.
.PHONY: test-containers
test-containers: ## the engine, the images, make e2e-compose and make testcontainers; containers removed after
	$(MAKE) -k --no-print-directory e2e-compose testcontainers; status=$$?; \
	infra/docker/engine.sh down; exit $$status

# The outbox protocol's model (services/identity-fanout/model/README.md): Debian's spin and
# gcc where missing, then one spin run per design and property, each held to what it must
# give (the frontier passes everything, the back-read protocol it replaced fails with its
# known counterexamples); a summary of each with its states and time. `make test` installs the
# tools only: its identity-fanout tests run the deciding checks (tests/test_model.py).
.PHONY: model
model: ## model-check the outbox protocol with spin: the frontier passes, the back-read protocol fails as known
	services/identity-fanout/model/run.sh

.PHONY: model-tools
model-tools:
	services/identity-fanout/model/run.sh --install-only

# What a developer runs between edits: no service is started, nothing is left running.
UNIT_PATHS := contracts/tests $(wildcard packages/*/tests) $(wildcard services/*/tests)

.PHONY: unit
unit: sync ## the tests that need no PostgreSQL or Kafka (pure logic, settings, parsers, CLI refusals), on every core
	$(RUN) pytest -q -n auto -m "not integration" $(UNIT_PATHS) \
		$(addprefix --ignore=,$(PACT_CONSUMER_TESTS) $(PACT_PROVIDER_TESTS))

.PHONY: test-one
test-one: up ## one test, file or folder on the real services: make test-one T=path::test
	@test -n "$(T)" || { echo "usage: make test-one T=path/to/test_file.py::test_name" >&2; exit 2; }
	eval "$$($(RUN) pin-local -q env)" && $(RUN) pytest $(T)

# The long chaos campaign: 50 faults (or PIN_CHAOS_FAULTS) over PIN_CHAOS_SPAN seconds (default
# 6 per fault), then the long faults (PIN_CHAOS_LONG=0 leaves them out: every relay down,
# every consumer down, every worker batch failing, a 10-minute partial outage; about an hour)
# with the alert matrix checked; PIN_CHAOS_SEED replays a campaign. `make test` runs a short
# one (10 faults, no long ones).
.PHONY: chaos
chaos: up ## chaos campaign: 50 random faults, then the long ones, invariants and alert matrix checked
	eval "$$($(RUN) pin-local -q env)" && PIN_CHAOS_FAULTS=$${PIN_CHAOS_FAULTS:-50} \
		PIN_CHAOS_LONG=$${PIN_CHAOS_LONG:-1} $(RUN) pytest tests-e2e/test_10_chaos_campaign.py

# A long outbox history: PIN_HISTORY_SECONDS (600) of late, flooding and prepared writers with
# relays killed and moved, then the delivery guarantees checked (tests-e2e/README.md "The
# outbox history"); PIN_HISTORY_SEED replays one. `make test` runs 40 s of it.
.PHONY: history
history: up ## outbox history: 10 minutes of writers and relay faults, delivery guarantees checked
	eval "$$($(RUN) pin-local -q env)" && PIN_HISTORY_SECONDS=$${PIN_HISTORY_SECONDS:-600} \
		$(RUN) pytest tests-e2e/test_13_outbox_history.py

# Whole-path fuzzing with many more examples than `make test` runs (a few hundred each),
# the consumer's batch statement proved against the pure plan on as many batches, and the
# pure paths that read a record's bytes fed hostile ones (nesting, size, encoding, numbers).
FUZZ_TESTS := $(wildcard services/*/tests/test_fuzz_integration.py) \
	services/rewards-membership/tests/test_batch_sql_integration.py \
	services/rewards-membership/tests/test_hostile_bytes_fuzz.py \
	services/identity-fanout/tests/test_hostile_rows_fuzz.py
.PHONY: fuzz
fuzz: up ## fuzz the consumer, the relay and the batch statement against real Kafka and PostgreSQL (10,000 examples each)
	eval "$$($(RUN) pin-local -q env)" && PIN_FUZZ_EXAMPLES=$${PIN_FUZZ_EXAMPLES:-10000} \
		$(RUN) pytest $(FUZZ_TESTS)

# Man pages and shell completions of the services' commands, generated from the parsers the
# commands run with (pin_testkit.cli_docs), never written by hand; README "Shell completion
# and man pages" says how to install them.
CLI_DOCS := build/cli
.PHONY: cli-docs
cli-docs: sync ## man pages and bash/zsh completions of both CLIs, from their parsers, in build/cli/
	$(RUN) python -m pin_testkit.cli_docs --out $(CLI_DOCS) identity-fanout rewards-membership

.PHONY: demo
demo: sync ## run the whole system on this machine and show what happens
	$(RUN) python infra/local/demo.py

# BASELINE="<rev> ...": the fan-out (50k-user role, revocation latency) and relay benchmarks
# also run the service of those git revisions in turn with this one (the fan-out ones on a
# schema their own migrations made).
BASELINE ?=
BASELINE_ARGS := $(if $(strip $(BASELINE)),--baseline $(BASELINE))

.PHONY: bench
bench: up ## benchmarks (not tests): 50k-user fan-out vs the database floor, 1M-user role by 1/2/4 instances and by 1/2/4/8 with a 50m CPU limit each, revocation latency during a 1M-user fan-out, relay drain vs a plain producer and 4 relays vs 1, relay drain with a snapshot held vs none, membership consumer drain; BASELINE=<rev ...>: the fan-out and relay benchmarks beside those git revisions' service, in turn
	@set -e; eval "$$($(RUN) pin-local -q env)"; \
	export PIN_BENCH_RESULTS="$$(mktemp -t pin-bench.XXXXXX)"; \
	for b in $(wildcard bench/*/run.py); do echo "== $$b"; case $$b in \
		bench/fanout/run.py|bench/relay/run.py) $(RUN) python $$b $(BASELINE_ARGS);; \
		*) $(RUN) python $$b;; esac; done; \
	echo "== bench/relay/held_snapshot.py"; $(RUN) python bench/relay/held_snapshot.py --rows 300000; \
	$(RUN) python -m pin_testkit.bench; rm -f "$$PIN_BENCH_RESULTS"
