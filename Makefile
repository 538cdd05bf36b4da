# HCS: one command to run it (make run), one to test it (make test).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CACHE ?= $(HOME)/.cache/hcs

.PHONY: run test test-quick deps lint proto proto-check config-docs config-docs-check bench clean \
	package manifests manifests-check image compatibility-report

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## make run: hcsd on the simulated mixed-vendor node, in the foreground (Ctrl-C stops it)
run: $(STAMP)
	@scripts/run-simulated

## make test: lint, types, layer contracts, generated-code check, all test suites (libhcs also
##   built for aarch64 and run under qemu-user: make -C libhcs test-arm64)
test: deps $(STAMP) lint proto-check config-docs-check
	$(MAKE) -C libhcs                 # the packages and the runtime tests ship the real library
	-$(MAKE) -s -C bpf                # optional: the eBPF tests say why they skip without it
	$(PY) -m pytest -q -rs tests
	$(MAKE) -C libhcs test
	-tests/e2e/make-arm64-root $(CACHE) >/dev/null  # its shell for the smoke runs (they say when absent)
	$(MAKE) -C libhcs test-arm64 HCS_CACHE=$(CACHE)  # aarch64 under qemu-user (skipped, saying why, without it)

deps:
	@scripts/install-test-deps

lint: $(STAMP)
	$(VENV)/bin/ruff check hcsd tests bench
	$(VENV)/bin/ruff format --check hcsd tests bench
	$(VENV)/bin/mypy hcsd
	$(VENV)/bin/lint-imports

test-quick: $(STAMP)
	$(PY) -m pytest -q tests/unit

## make compatibility-report: run the cross-vendor compatibility test on the real-kubelet
##   cluster (tests/kubelet/test_compatibility.py) and write docs/compatibility.md from its
##   results; `make test` fails while the checked-in report is not what a run finds
compatibility-report: $(STAMP)
	$(MAKE) -C libhcs
	HCS_WRITE_COMPATIBILITY=1 $(PY) -m pytest -q -rs tests/kubelet/test_compatibility.py

## make proto: regenerate hcsd/api/v1 from proto/hcsd/api/v1/hcsd.proto
PROTO := proto/hcsd/api/v1/hcsd.proto
NRI_PROTOS := proto/hcsd/runtime/nri/ttrpc.proto proto/hcsd/runtime/nri/v1alpha1/api.proto
KUBELET_PROTOS := proto/hcsd/cluster/kubeletplugin/wire/dra_v1.proto \
	proto/hcsd/cluster/kubeletplugin/wire/dra_v1beta1.proto \
	proto/hcsd/cluster/kubeletplugin/wire/registration_v1.proto \
	proto/hcsd/cluster/kubeletplugin/wire/dra_health_v1alpha1.proto
GENERATED := $(patsubst proto/%.proto,%_pb2.py,$(KUBELET_PROTOS)) \
	$(patsubst proto/%.proto,%_pb2.pyi,$(KUBELET_PROTOS)) \
	hcsd/api/v1/hcsd_pb2.py hcsd/api/v1/hcsd_pb2.pyi hcsd/api/v1/hcsd_pb2_grpc.py \
	hcsd/runtime/nri/ttrpc_pb2.py hcsd/runtime/nri/ttrpc_pb2.pyi \
	hcsd/runtime/nri/v1alpha1/api_pb2.py hcsd/runtime/nri/v1alpha1/api_pb2.pyi
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. $(PROTO)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. $(NRI_PROTOS) $(KUBELET_PROTOS)

proto-check: $(STAMP)
	@tmp=$$(mktemp -d) && \
	$(PY) -m grpc_tools.protoc -Iproto --python_out=$$tmp --pyi_out=$$tmp \
		--grpc_python_out=$$tmp $(PROTO) && \
	$(PY) -m grpc_tools.protoc -Iproto --python_out=$$tmp --pyi_out=$$tmp $(NRI_PROTOS) \
		$(KUBELET_PROTOS) && \
	for f in $(GENERATED); do \
		cmp -s $$tmp/$$f $$f || { echo "$$f is stale: run make proto"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "generated code matches the .proto files"

## make config-docs: regenerate docs/configuration.md from the config sections in hcsd/
config-docs: $(STAMP)
	$(PY) -m hcsd.daemon.reference markdown > docs/configuration.md

config-docs-check: $(STAMP)
	@$(PY) -m hcsd.daemon.reference check docs/configuration.md

## make manifests: render packaging/kubernetes (the kustomize tree) from packaging/helm/hcs
manifests: $(STAMP)
	$(PY) scripts/render-manifests

manifests-check: $(STAMP)
	@$(PY) scripts/render-manifests --check && echo "packaging/kubernetes matches the chart"

## make bench: the benchmarks under bench/ (figures printed, JSON in bench/out/)
bench: $(STAMP)
	$(PY) bench/run_all.py

## make package: dist/hcsd_VERSION_amd64.deb and dist/hcsd-VERSION.x86_64.rpm (docs/packaging.md)
## make package ARCH=arm64: dist/hcsd_VERSION_arm64.deb and dist/hcsd-VERSION.aarch64.rpm, with
##   libhcs cross-built for aarch64, the arm64 eBPF objects and aarch64 wheels (docs/packaging.md)
# Only an ARCH given on the command line counts (CI systems set ARCH in the environment).
PACKAGE_ARCH := $(if $(filter command line,$(origin ARCH)),$(ARCH))
package: $(STAMP)
ifneq ($(PACKAGE_ARCH),)
	$(MAKE) -C libhcs ARCH=$(PACKAGE_ARCH)
	-$(MAKE) -s -C bpf ARCH=$(PACKAGE_ARCH)
endif
	PYTHON=$(PY) HCS_ARCH=$(PACKAGE_ARCH) packaging/build-packages

## make image: dist/hcs-cluster-VERSION.oci.tar, docker.io/hcs/hcs-cluster:VERSION (docs/images.md)
image: $(STAMP)
	PYTHON=$(PY) packaging/build-image

clean:
	rm -rf $(VENV) .run bench/out
	$(MAKE) -C bpf clean
