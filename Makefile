# relayhub build entry points. `make run` starts the hub with its fixtures;
# `make test` is what CI runs.
GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
FUZZTIME ?= 60s
# staticcheck at a pinned version, run through the module proxy.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

# make install: the relay and relayctl, the systemd unit, its settings,
# user and logrotate snippets, and the docs with the alert rules
# (docs/OPERATING.md, "Running it in production"). DESTDIR stages the
# files for a package; the paths inside them are those of PREFIX and
# SYSCONFDIR.
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
SYSCONFDIR  ?= /etc
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
DOCDIR      ?= $(PREFIX)/share/doc/relayhub

.PHONY: all build test run demo fleet-demo bench fuzz lint clean install

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# The race detector makes sync.Pool drop items at random, so the tests
# that count allocations run once more without it; so do those that
# measure goroutine stacks, which it makes larger.
test: lint
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run 'DoesNotAllocate|SmallStacks' ./...

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

# The settings file is the operator's: an upgrade installs the shipped one
# beside it as relayhub.env.dist and never overwrites it.
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(DOCDIR) \
		$(DESTDIR)$(SYSCONFDIR)/relayhub $(DESTDIR)$(SYSCONFDIR)/logrotate.d
	install -m 0755 $(BIN)/relay $(BIN)/relayctl $(DESTDIR)$(BINDIR)/
	sed -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/usr/local/share/doc/relayhub/|$(DOCDIR)/|g' \
		-e 's|/etc/relayhub/|$(SYSCONFDIR)/relayhub/|g' deploy/relayhub.service > $(DESTDIR)$(UNITDIR)/relayhub.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/relayhub.service
	install -m 0644 deploy/relayhub.sysusers $(DESTDIR)$(SYSUSERSDIR)/relayhub.conf
	install -m 0644 deploy/relayhub.logrotate $(DESTDIR)$(SYSCONFDIR)/logrotate.d/relayhub
	install -m 0644 README.md docs/*.md docs/*.png docs/relay.example.toml deploy/prometheus/*.yml $(DESTDIR)$(DOCDIR)/
	@env=$(DESTDIR)$(SYSCONFDIR)/relayhub/relayhub.env; \
	if [ -e "$$env" ]; then \
		install -m 0640 deploy/relayhub.env "$$env.dist"; \
		echo "kept $$env; the shipped settings are in $$env.dist"; \
	else \
		install -m 0640 deploy/relayhub.env "$$env"; \
	fi
