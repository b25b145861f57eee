package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/e2e/chaos/traffic"
	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// recipes is a simulation's recipe workload (Config.Recipes): the chaos
// suite's recipe workers (traffic.RecipeWorker) — each campaigning in one
// election and taking permits of one semaphore, writing downstream
// through the etcd guard while it leads or holds a permit — each on a
// client of its own behind the seeded network, and the operator that
// changes the semaphore's limit now and then (traffic.LimitOperator), on
// the direct client. The recipe checks (checks.CheckRecipes) judge it:
// one leader at a time, each claim against the limit in force at its
// revision, no stale write past the guard.
type recipes struct {
	s    *sim
	hist *model.RecipeHistory
	reg  *lease.Registry // the direct client's, in the recipes' namespace: depose's revocations
}

// startRecipes starts the recipe workers and the limit's operator on ctx,
// counted in wg; their clients' networks and their gates join the ones
// injectFaults heals and pauses, their names the clients whose watches
// it cancels.
func (s *sim) startRecipes(ctx context.Context, wg *sync.WaitGroup) *recipes {
	r := &recipes{s: s, hist: &model.RecipeHistory{}}
	reg, err := lease.NewRegistry(s.direct, lease.WithNamespace(model.RecipeNamespace))
	if err != nil {
		s.t.Fatalf("sim: recipes: %v", err)
	}
	r.reg = reg
	mcfg := model.Config{TTL: s.cfg.TTL, RecipeLimit: traffic.DefaultRecipeLimit, Control: s.cfg.Control}
	op := traffic.NewLimitOperator(s.direct, mcfg, r.hist, s.cfg.Seed*1000+499)
	for i := range s.cfg.Recipes {
		name := fmt.Sprintf("r%d", i)
		net := &switchable{inner: simetcd.NewSeededNetwork(s.cfg.Seed*1000+500+uint64(i), s.cfg.Network)}
		s.nets = append(s.nets, net)
		s.clients = append(s.clients, name)
		gate := &nemesis.Gate{}
		s.gates = append(s.gates, gate)
		w, err := traffic.NewRecipeWorker(name, s.srv.Client(name, net), mcfg, op, gate, r.hist, s.cfg.Seed*1000+500+uint64(i))
		if err != nil {
			s.t.Fatalf("sim: recipe worker %s: %v", name, err)
		}
		wg.Go(func() { w.Run(ctx) })
	}
	wg.Go(func() { op.Run(ctx) })
	return r
}

// depose revokes, as an operator would (lease.Registry.Revoke, audited),
// the election's leadership or one of the permits, whichever the seed
// picks among those held now: the holder's context ends with
// lease.ErrRevoked, and a careless holder writes on, late, to be fenced.
func (r *recipes) depose() bool {
	space := keys.MustNew(model.RecipeNamespace)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := r.s.direct.Get(ctx, space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return false
	}
	var held []string
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		if space.IsControl(key) {
			continue
		}
		res, err := space.ResourceFromLease(key)
		if err != nil {
			continue
		}
		if _, _, ok := recipekeys.ParsePermit(res); ok || res == recipekeys.Election(model.RecipeName) {
			held = append(held, res)
		}
	}
	if len(held) == 0 {
		return false
	}
	return r.reg.Revoke(ctx, held[r.s.rng.IntN(len(held))], "sim: depose") == nil
}

// read reads the recipes' history from etcd (through the historian: the
// history may be compacted) inside the bubble, and returns the check to
// run on it outside, which adds the recipe checks' facts and findings to
// res.
func (r *recipes) read(cli *clientv3.Client) (check func(res *checks.Result)) {
	_ = r.reg.Close()
	final, err := checks.ReadRecipes(cli)
	if err != nil {
		r.s.t.Fatalf("sim: final read of the recipes: %v", err)
	}
	ops, workers := r.hist.Ops(), r.s.cfg.Recipes
	return func(res *checks.Result) {
		res.RecipeOps = ops
		var vs []checks.Violation
		res.Recipes, vs = checks.CheckRecipes(res.RecipeOps, final)
		res.Recipes.Workers = workers
		res.Violations = append(res.Violations, vs...)
	}
}
