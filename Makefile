# The project's verbs. Only Go is needed; everything else is fetched by the
# go command through the module proxy, except PostgreSQL for the SQL guard's
# tests, which `make postgres` installs (apt) and starts.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
TEST_FLAGS  ?= -race -timeout 15m
FUZZTIME    ?= 30s

.PHONY: demo test test-postgres postgres postgres-stop lint e2e fuzz

## demo: workers on a batch of tasks against an embedded etcd, a forced expiry, and the invariants report
demo:
	$(GO) run ./cmd/leasehold demo

# The DSN of the PostgreSQL server scripts/postgres.sh started, if it is
# running; an explicit LEASEHOLD_TEST_POSTGRES wins. Without either, the SQL
# guard's PostgreSQL tests skip (and fail under CI=true).
PG_DSN = $${LEASEHOLD_TEST_POSTGRES:-$$(scripts/postgres.sh dsn 2>/dev/null || true)}

## test: vet, then every test with the race detector on real embedded etcd
## (and real PostgreSQL too once `make postgres` has started it)
test:
	$(GO) vet ./...
	LEASEHOLD_TEST_POSTGRES="$(PG_DSN)" $(GO) test $(TEST_FLAGS) ./...

## test-postgres: start PostgreSQL if needed, then the SQL guard's tests on it and on SQLite
test-postgres: postgres
	LEASEHOLD_TEST_POSTGRES="$(PG_DSN)" $(GO) test $(TEST_FLAGS) -count=1 -run 'SQL' -v ./fence

## postgres: install (apt, as root) and start a throwaway PostgreSQL for the tests; prints its DSN
postgres:
	@scripts/postgres.sh start

## postgres-stop: stop that PostgreSQL and delete its data
postgres-stop:
	@scripts/postgres.sh stop

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
