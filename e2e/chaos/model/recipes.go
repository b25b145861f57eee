package model

import (
	"sync"
)

// The recipe workload's resources (Config.Recipes).
const (
	RecipeNamespace = "/recipes"
	// RecipeName names both the election and the semaphore.
	RecipeName = "chaos"
	// RecipeEffectPrefix is the downstream: one key per recipe resource
	// (the election's, each permit's), overwritten by every admitted
	// write, whose history (a watch from revision 1) is the order in
	// which the writes landed.
	RecipeEffectPrefix = "/chaos/recipe/"
)

// The recipe operations (RecipeOp.Type).
const (
	RecipeCampaign = "campaign" // election.Election.Campaign
	RecipeAcquire  = "acquire"  // semaphore.Semaphore.Acquire or TryAcquire (ControlOverLimit: also the extra permit's TryAcquire)
	RecipeWrite    = "write"    // a downstream write: fenceetcd.Guard.AdmitOps of a put of the resource's key (ControlRecipeNoFencing: the put alone)
	RecipeRelease  = "release"  // lease.Lease.Release: a leader resigns, a permit is returned
	// RecipeLimitChange is the operator's change of the semaphore's
	// limit (traffic.RecipeLimit): the limit key replaced while no permit
	// is held.
	RecipeLimitChange = "limit"
)

// RecipeOp is one operation of the recipe workload, recorded when it
// returns. Resource and Epoch are the leadership's or permit's (a
// campaign's or acquisition's, once granted); Current is a refused
// write's fence, or a stale release's current epoch.
type RecipeOp struct {
	ID       string  `json:"id"`
	Type     string  `json:"type"`
	Resource string  `json:"resource,omitempty"`
	Worker   string  `json:"worker"`
	Epoch    int64   `json:"epoch,omitempty"`
	Outcome  Outcome `json:"outcome"`
	Current  int64   `json:"current,omitempty"`
	Invoke   int64   `json:"invoke"`
	Return   int64   `json:"return"`
	Err      string  `json:"err,omitempty"`
	// Late marks a write a careless holder made after it learned that its
	// holding had ended (its context cancelled other than by its own
	// Release).
	Late bool `json:"late,omitempty"`
	// Limit is an acquisition's Semaphore's limit, or the limit a
	// RecipeLimitChange stores.
	Limit int `json:"limit,omitempty"`
}

// RecipeEffect is a recipe write's value.
type RecipeEffect struct {
	Resource string `json:"resource"`
	Epoch    int64  `json:"epoch"`
	Worker   string `json:"worker"`
	Op       string `json:"op"`
}

// RecipeHistory collects the recipe workers' operations.
type RecipeHistory struct {
	mu  sync.Mutex
	ops []RecipeOp
}

// Add records op.
func (h *RecipeHistory) Add(op RecipeOp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
}

// Ops returns the operations recorded, in order.
func (h *RecipeHistory) Ops() []RecipeOp {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]RecipeOp(nil), h.ops...)
}
