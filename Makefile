# Posthorn's build, test and benchmark entry points. The README's commands
# and .ci/run call these targets.
GO      ?= go
PKGS    ?= ./...
BIN     := bin/posthorn
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: build test test-race test-short lint bench soak demo clean

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/posthorn

# The README's test command: vet, then every test with the race detector.
test:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 25m $(PKGS)

test-race: test

test-short:
	$(GO) test -short -count=1 $(PKGS)

lint:
	test -z "$$(gofmt -l .)" || (gofmt -l . && exit 1)
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.6.1 $(PKGS)

# Benchmarks: side-by-side figures the issues ask for. Stays under 10 minutes.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 10m $(PKGS)

clean:
	rm -rf bin
