# relayhub build entry points. `make run` starts the hub with its fixtures;
# `make test` is what CI runs.
GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
FUZZTIME ?= 60s

.PHONY: all build test run demo bench fuzz lint clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

test:
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

# exec: make's child is the script itself, with no shell in between, so the
# SIGTERM make passes on to its child when it is terminated reaches the
# script, which stops the three processes.
run: build
	exec scripts/run.sh

demo: build
	scripts/demo.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

fuzz:
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
