# Set-up is these two targets: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# two stamps: `make run` installs only what running needs ([project.dependencies]);
# test, lint, chaos, bench... install the test extra (PySpark, matplotlib, mypy, ...)
STAMP  := $(VENV)/.installed-stamp
RUN_STAMP := $(VENV)/.run-stamp
AMQP_PORT ?= 5672

.PHONY: run test test-fast test-long lint unit integration bench clean release-fixture chaos chaos-long soak fuzz proto image spark-up spark-down spark-submit

$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	@mkdir -p data
	@echo "mirrorq: starting a 3-node local cluster (n1..n3, AMQP on $(AMQP_PORT)..$$(($(AMQP_PORT)+2)); admin token in data/cluster/admin.token); Ctrl-C stops it"
	$(VENV)/bin/mirrorq local-cluster up --nodes 3 --base-port $(AMQP_PORT) --dir data/cluster --foreground

lint: $(STAMP)
	$(VENV)/bin/ruff check node harness tests bench k8s chaos soak
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit

integration: $(STAMP)
	$(VENV)/bin/pytest -q tests/integration

# test: tests/suite.sh: every test but the `long` ones (lint runs in its background lane); the Kubernetes build
# and image are made in the background (nice 19) while the tests outside tests/k8s run,
# then tests/k8s runs; prints the 40 slowest (JUnit XML in data/test-results/)
test: $(STAMP)
	bash tests/suite.sh

# test-fast: the inner loop (under 5 minutes): lint, the unit tests, the layer rules and
# the integration tests that need one node (tests/integration, but those marked `slow`)
test-fast: lint
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=15 -m "not long and not slow" \
		tests/unit tests/test_layers.py tests/integration

# test-long: the tests marked `long` (minutes each, covered more cheaply in make test;
# left out to keep CI within its time budget)
test-long: lint k8s-build
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=25 -m long tests

# release-fixture: tests/data/release-<commit>.tar.gz, the node/ package of the previous
# release that tests/cluster/test_rolling_upgrade.py rolls a cluster from (it replaces the
# one there); refresh at each release: make release-fixture REL=<released commit>
REL ?= HEAD
release-fixture:
	tests/data/make-release-fixture.sh $(REL)

# chaos: every experiment of chaos/experiments with short durations (root for the
# netns partitions; without root those are skipped, a failure with --subset ci or
# --no-skip), judged from the journals and the history checker; prints the table,
# fails on any failure or lost message.
# CI subset: make chaos CHAOS_ARGS='--subset ci'
CHAOS_ARGS ?=
chaos: $(STAMP)
	$(PY) -m chaosmirrorq.suite $(CHAOS_ARGS)

# chaos-long: every experiment 10 times with different seeds and faults of 5-60 s,
# then one Spark job over all the histories (Parquet partitioned by experiment and
# run) and a report: data/chaos-long/report.md + charts/. Knobs, e.g.
# make chaos-long CHAOS_LONG_ARGS='--runs 3 --minutes 45 --spark standalone --docs docs/chaos-long'
CHAOS_LONG_ARGS ?=
chaos-long: $(STAMP)
	$(PY) -m chaosmirrorq.long $(CHAOS_LONG_ARGS)

# spark-up / spark-down: a Spark standalone cluster on loopback (a master and two
# workers from the pyspark distribution; state and logs in data/spark) for the
# history checker: make spark-submit ARGS='chaos/analysis/check_history.py RUN --out r.json'
SPARK_DIR ?= data/spark
spark-up: $(STAMP)
	$(PY) chaos/analysis/spark_standalone.py up --dir $(SPARK_DIR)
spark-down: $(STAMP)
	$(PY) chaos/analysis/spark_standalone.py down --dir $(SPARK_DIR)
spark-submit: $(STAMP)
	$(PY) chaos/analysis/spark_standalone.py submit --dir $(SPARK_DIR) -- $(ARGS)

# bench: the benchmark suite (bench/README.md): mirrorq 1 and 3 nodes vs RabbitMQ 3.10
# 1 node / 3-node quorum / 3-node classic mirrored, 3 repeats each; installs the Debian
# packages it needs first. Quicker: make bench BENCH_ARGS='--quick'
BENCH_ARGS ?=
bench: $(STAMP)
	bash bench/install-deps.sh
	$(PY) bench/suite.py $(BENCH_ARGS)

# proto: regenerate node/admin/admin_pb2*.py from admin.proto (checked in; the
# drift test tests/unit/admin/test_admin_proto.py compares them with a fresh run)
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. node/admin/admin.proto

# soak: a 3-node cluster under connection churn (>= 1,000), queue churn (>= 10,000) and
# confirmed publishing/consuming for 10 minutes; fails on RSS growth, an fd or connection
# leak, a lost confirmed message or a node death (soak/README.md). Shorter:
# make soak SOAK_ARGS='--duration 60 --connections 100 --queues 1000'
SOAK_ARGS ?=
soak: $(STAMP)
	$(PY) soak/soak.py $(SOAK_ARGS)

# fuzz: the long fuzz run (docs/fuzzing.md): frame reader/decoders and the
# connection+channel state machines over the real state machine, 1,000,000
# inputs per target on 2 niced processes; prints inputs, inputs/s and crashes.
FUZZ_ARGS ?= --inputs 1000000 --jobs 2 --seed 1
fuzz: $(STAMP)
	nice -n 10 $(PY) -m tests.fuzz.fuzz_amqp $(FUZZ_ARGS)

clean:
	rm -rf $(VENV) data build *.egg-info

# image: mirrorq's OCI image (broker + operator) from the Dockerfile without Docker
# (k8s/image.sh: mmdebstrap base + buildah, vfs storage), tagged
# localhost/mirrorq:<the chart's appVersion>, the chart's default; then both entry
# points run in it. The Kubernetes tests build it themselves.
image:
	bash k8s/image.sh --check

# k8s-build / k8s-up / k8s-down: a real Kubernetes control plane for the Kubernetes
# tests (issue 13, k8s/): etcd 3.4.23, kube-apiserver, kube-controller-manager and
# kube-scheduler v1.20.2 (RBAC, token auth, TLS), the kubelet and kube-proxy for a real
# node (k8s/node.py, with Debian's containerd) and kubectl/helm. k8s-build builds
# them once (about 10-15 min, from Debian packages) into a cache outside the work tree
# (MIRRORQ_K8S_CACHE, default /var/cache/mirrorq/k8s-v1.20.2-etcd3.4.23-go1.15.15) and
# is instant once it is there; k8s-up starts the control plane in the background
# (workdir and pid file under $(K8S_DIR)) and prints the KUBECONFIG to export;
# k8s-down stops it.
K8S_DIR ?= /tmp/mirrorq-k8s

.PHONY: k8s-build k8s-up k8s-down

k8s-build:
	@bash k8s/build.sh

k8s-up: $(STAMP) k8s-build
	@$(PY) k8s/control_plane.py up $(K8S_DIR)/work --detach --pid-file $(K8S_DIR)/control-plane.pid

k8s-down: $(STAMP)
	@$(PY) k8s/control_plane.py down $(K8S_DIR)/work --pid-file $(K8S_DIR)/control-plane.pid
