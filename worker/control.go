package worker

import (
	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/protocol"
)

// controlled is t as the chaos suite's control runs break it
// (internal/chaosseam): with chaosseam.DropClaimConditions set, the claim
// loses the terms' compares and keeps their Complete ops. Production
// never sets it, and then t is returned unchanged.
func controlled(t protocol.Terms) protocol.Terms {
	if chaosseam.DropClaimConditions.Load() {
		t.If = nil
	}
	return t
}
