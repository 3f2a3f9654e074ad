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

# make deb: a Debian package of what make install installs, with
# PREFIX=/usr and the unit in /lib/systemd/system, where Debian 12 keeps
# units, built by nfpm from deploy/nfpm.yaml into $(DIST) beside its
# SHA256SUMS (docs/OPERATING.md, "Installing the package"). Its version is
# the commit's time, UTC, and hash, 0.YYYYMMDD.HHMMSS+gHASH, which sorts as
# the commits do; .dirty marks a build of uncommitted changes. Without git,
# set DEB_VERSION and SOURCE_DATE_EPOCH.
DIST        ?= dist
NFPM        ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
DEB_VERSION ?= $(shell v=$$(TZ=UTC0 git log -1 --format='0.%cd+g%h' --date=format-local:%Y%m%d.%H%M%S 2>/dev/null) && \
	{ git diff --quiet HEAD 2>/dev/null && echo "$$v" || echo "$$v.dirty"; })
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
DEB_MAINTAINER ?= relayhub <dev@relayhub.invalid>

.PHONY: all build test run demo fleet-demo bench fuzz lint clean install deb soak docs

all: build

# CMDS narrows the build, as make deb does to the two binaries it ships.
CMDS ?= ./cmd/...

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ $(CMDS)

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

# The soak (cmd/relay/soak_integration_test.go), never part of make test:
# SOAK_DURATION (30m) of paced load at SOAK_RATE lines a second through
# three hubs on a Sentinel-managed store, with toxiproxy's faults on every
# link, a failover every SOAK_FAILOVER_EVERY (5m) and a hub restarted.
soak:
	$(GO) test -tags soak -run '^TestSoak$$' -count=1 -timeout 90m -v ./cmd/relay/

# The status page's screenshots, docs/status-page.png and
# docs/status-page-dark.png: a CORE outage played against the real binaries
# and taken in a headless chromium (about 3 minutes).
.PHONY: screenshot
screenshot:
	$(GO) test -count=1 -run '^TestStatusPageInABrowser$$' -timeout 10m ./cmd/relay/ -update-screenshot

# docs/CONFIG.md's flag reference, rewritten from the relay's flag
# definitions; TestFlagReferenceIsCurrent fails while it is out of date.
docs:
	UPDATE_FLAG_REFERENCE=1 $(GO) test -count=1 -run '^TestFlagReferenceIsCurrent$$' ./cmd/relay/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags soak ./cmd/relay/
	$(GO) run $(STATICCHECK) ./...

clean:
	rm -rf $(BIN) $(DIST)

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

# The binaries are built static (Go's own resolver, no libc to depend on),
# stripped and without the build's paths; the files get the commit's time
# (SOURCE_DATE_EPOCH), so one commit gives the same package twice.
deb:
	@test -n "$(DEB_VERSION)" -a -n "$(SOURCE_DATE_EPOCH)" || \
		{ echo "make deb: no git history: set DEB_VERSION and SOURCE_DATE_EPOCH"; exit 2; }
	rm -rf $(DIST)/stage $(DIST)/bin $(DIST)/relayhub_*.deb $(DIST)/SHA256SUMS
	CGO_ENABLED=0 GOFLAGS=-trimpath $(MAKE) --no-print-directory install BIN=$(abspath $(DIST))/bin \
		CMDS='./cmd/relay ./cmd/relayctl' LDFLAGS='-s -w -X main.version=$(DEB_VERSION)' DESTDIR=$(abspath $(DIST))/stage \
		PREFIX=/usr UNITDIR=/lib/systemd/system
	doc=$(DIST)/stage/usr/share/doc/relayhub; \
	install -m 0644 deploy/debian/copyright $$doc/copyright; \
	printf 'relayhub (%s) unstable; urgency=medium\n\n  * relayhub at commit %s.\n\n -- %s  %s\n' \
		'$(DEB_VERSION)' "$$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" '$(DEB_MAINTAINER)' \
		"$$(date -u -R -d @$(SOURCE_DATE_EPOCH))" | gzip -9n > $$doc/changelog.gz
	install -D -m 0644 deploy/debian/lintian-overrides $(DIST)/stage/usr/share/lintian/overrides/relayhub
	DEB_VERSION='$(DEB_VERSION)' DEB_MAINTAINER='$(DEB_MAINTAINER)' DEB_ARCH=$$($(GO) env GOARCH) DEB_STAGE=$(abspath $(DIST))/stage \
		SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(NFPM) package --config deploy/nfpm.yaml --packager deb --target $(DIST)/
	cd $(DIST) && sha256sum relayhub_*.deb > SHA256SUMS && cat SHA256SUMS
