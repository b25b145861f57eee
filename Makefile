# The project's verbs. Only Go is needed; everything else is fetched by the
# go command through the module proxy, except PostgreSQL for the SQL guard's
# tests, which `make postgres` installs (apt) and starts.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
TEST_FLAGS  ?= -race -timeout 15m
FUZZTIME    ?= 30s

.PHONY: demo test test-postgres postgres postgres-stop lint e2e fuzz chaos chaos-control simulate simulate-fleet simulate-controls bench dashboard-preview

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

## test-postgres: start PostgreSQL if needed, then the SQL guard's and the audit archive's tests on it and on SQLite
test-postgres: postgres
	LEASEHOLD_TEST_POSTGRES="$(PG_DSN)" $(GO) test $(TEST_FLAGS) -count=1 -run 'SQL' -v ./fence/fencesql ./audit

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

## bench: leasehold side by side with bare clientv3, concurrency.Mutex and raw Txns on one embedded etcd, fsync on and off (about 30 minutes, 15 of them the fleet section's 10-minute recorder run; see BENCHMARKS.md)
bench:
	$(GO) run ./tools/bench

## dashboard-preview: redraw docs/grafana/preview.{svg,png}: the dashboard's queries on a real Prometheus (Debian: prometheus) over a demo run; Chromium for the PNG
dashboard-preview:
	$(GO) run ./tools/dashpreview -png docs/grafana/preview.png

## fuzz: run every fuzz target for FUZZTIME
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseToken -fuzztime=$(FUZZTIME) ./fence
	$(GO) test -run='^$$' -fuzz=FuzzDecodeEntry -fuzztime=$(FUZZTIME) ./audit
	$(GO) test -run='^$$' -fuzz=FuzzEscape -fuzztime=$(FUZZTIME) ./internal/keys

# chaos and chaos-control: DURATION of faults (default 10m) from seed SEED
# (default: random, printed). -timeout 0 because DURATION is the caller's;
# every phase after the faults has its own bound.
DURATION ?= 10m
SEED     ?=

## chaos: the long chaos pass (kills, pauses, partitions, leader stops on 3 members); prints its summary, ending with violations: 0
chaos:
	LEASEHOLD_CHAOS_DURATION=$(DURATION) LEASEHOLD_CHAOS_SEED=$(SEED) $(GO) test -count=1 -timeout 0 -tags chaoslong -run '^TestChaosLong$$' -v ./e2e/chaos

## simulate: the deterministic simulation (e2e/sim) for DURATION of virtual time (default 10m) on seed SEED (default 1), then its cycle workload for CYCLE_DURATION (default 1m) on PARALLEL seeds at once (default: the cores); each prints its simulated task cycles per second of wall time and ends with violations: N
CYCLE_DURATION ?= 1m
PARALLEL ?= $(shell nproc 2>/dev/null || echo 2)
simulate:
	LEASEHOLD_SIM_DURATION=$(DURATION) LEASEHOLD_SIM_CYCLE_DURATION=$(CYCLE_DURATION) LEASEHOLD_SIM_SEED=$(or $(SEED),1) LEASEHOLD_SIM_PARALLEL=$(PARALLEL) $(GO) test -count=1 -timeout 0 -run '^TestSimulation(Cycle)?$$' -v ./e2e/sim

## simulate-fleet: the simulation's fleet alone (pools over one worker.Prefix, killed and started again) for DURATION of virtual time (default 10m) on seed SEED (default 1); ends with violations: N
simulate-fleet:
	LEASEHOLD_SIM_DURATION=$(DURATION) LEASEHOLD_SIM_SEED=$(or $(SEED),1) $(GO) test -count=1 -timeout 0 -run '^TestSimulationFleet$$' -v ./e2e/sim

## simulate-controls: each hole put back in the simulation, one line per control: found or NOT found, the seed, the time, and how often the seed finds it again in REPLAYS runs (default 10)
REPLAYS ?= 10
simulate-controls:
	LEASEHOLD_SIM_REPLAYS=$(REPLAYS) $(GO) test -count=1 -timeout 60m -run '^TestSimulation(Cycle)?Controls$$' -v ./e2e/sim

## chaos-control: the control runs (fencing off, CAS off, retention deleting before archiving or ageing entries on writers' clocks) for DURATION on seeds SEED, SEED+1, …; each must be caught
chaos-control:
	LEASEHOLD_CHAOS_CONTROL_DURATION=$(DURATION) LEASEHOLD_CHAOS_SEED=$(SEED) $(GO) test -count=1 -timeout 0 -tags chaoslong -run '^TestChaosControlLong$$' -v ./e2e/chaos
