# relayhub build entry points. `make run` starts the hub with its fixtures;
# `make test` is what CI runs.
GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
FUZZTIME ?= 60s
# staticcheck at a pinned version, run through the module proxy.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build test run demo fleet-demo bench fuzz lint clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# The race detector makes sync.Pool drop items at random, so the tests
# that count allocations run once more without it.
test: lint
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run 'DoesNotAllocate' ./...

# exec: make's child is the script itself, with no shell in between, so the
# SIGTERM make passes on to its child when it is terminated reaches the
# script, which stops the three processes.
run: build
	exec scripts/run.sh

demo: build
	scripts/demo.sh

fleet-demo: build
	scripts/fleet-demo.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

fuzz:
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

# The status page's screenshots, docs/status-page.png and
# docs/status-page-dark.png: a CORE outage played against the real binaries
# and taken in a headless chromium (about 3 minutes).
.PHONY: screenshot
screenshot:
	$(GO) test -count=1 -run '^TestStatusPageInABrowser$$' -timeout 10m ./cmd/relay/ -update-screenshot

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

clean:
	rm -rf $(BIN)
