# The project's verbs. Only Go is needed; everything else is fetched by the
# go command through the module proxy.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
TEST_FLAGS  ?= -race -timeout 15m
FUZZTIME    ?= 30s

.PHONY: demo test lint e2e fuzz

## demo: real workers against an embedded etcd replay a forced expiry
demo:
	$(GO) run ./examples/forced-expiry

## test: vet, then every test with the race detector on real embedded etcd
test:
	$(GO) vet ./...
	$(GO) test $(TEST_FLAGS) ./...

## lint: gofmt, vet and staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

## e2e: the end-to-end suite alone (forced-expiry replay, harness)
e2e:
	$(GO) test $(TEST_FLAGS) -count=1 -v ./e2e/...

## fuzz: run every fuzz target for FUZZTIME
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseToken -fuzztime=$(FUZZTIME) ./fence
