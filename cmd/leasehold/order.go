package main

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/leasehold/leasehold/audit"
)

// This file places each epoch's end in the log's revision order, for the
// views (audit, timeline and its picture). SDK transactions write an
// epoch's end entry in the transaction that ends it, so the entry's
// revision is the end. The recorder writes an expired entry after etcd
// deleted the lease key — possibly after the resource's next epoch began
// — so the entry's revision and time are when it was recorded, and its
// EndRevision is the deletion (docs/protocol.md §3.6). Placed there, no
// epoch of a resource ends after the next one began: epochs are revisions
// (§2), and a resource's next epoch begins only once the lease key is gone.

// endAt is where an epoch's end sits in revision order: at rev, or — when
// the revision was not recorded — somewhere before rev.
type endAt struct {
	rev    int64
	before bool
}

// String is how the tables show it: "480", or "<490".
func (a endAt) String() string {
	if a.before {
		return "<" + strconv.FormatInt(a.rev, 10)
	}
	return strconv.FormatInt(a.rev, 10)
}

// endOf places end entry e of its epoch; next is the resource's next epoch
// (the revision at which it began), 0 if none is known.
func endOf(e audit.Entry, next int64) endAt {
	switch {
	case e.Kind != audit.Expired:
		return endAt{rev: e.Revision}
	case e.EndRevision > 0:
		return endAt{rev: e.EndRevision}
	case next > 0 && next < e.Revision:
		// The recorder found the epoch ended without seeing the deletion
		// (or wrote the entry before it recorded deletions): it ended
		// before the next epoch began.
		return endAt{rev: next, before: true}
	}
	return endAt{rev: e.Revision, before: true}
}

// epochsOf returns, per resource, the epochs its entries name, sorted.
func epochsOf(entries []audit.Entry) map[string][]int64 {
	out := map[string][]int64{}
	for _, e := range entries {
		out[e.Resource] = append(out[e.Resource], e.Epoch)
	}
	for res, eps := range out {
		slices.Sort(eps)
		out[res] = slices.Compact(eps)
	}
	return out
}

// nextEpoch is the first of eps (sorted) after epoch, 0 if none.
func nextEpoch(eps []int64, epoch int64) int64 {
	i, found := slices.BinarySearch(eps, epoch)
	if found {
		i++
	}
	if i < len(eps) {
		return eps[i]
	}
	return 0
}

// inRevisionOrder returns entries ordered by the revision of what they
// record — their own, or for an expired entry the end it places (endOf) —
// then by key, which puts an end before a start of the same resource at
// one revision (a handoff, §3.4). ends has each expired entry's place, by
// key.
func inRevisionOrder(entries []audit.Entry) (sorted []audit.Entry, ends map[string]endAt) {
	epochs := epochsOf(entries)
	ends = map[string]endAt{}
	for _, e := range entries {
		if e.Kind == audit.Expired {
			ends[e.Key] = endOf(e, nextEpoch(epochs[e.Resource], e.Epoch))
		}
	}
	pos := func(e audit.Entry) int64 {
		if at, ok := ends[e.Key]; ok && e.Kind == audit.Expired {
			return at.rev
		}
		return e.Revision
	}
	sorted = slices.Clone(entries)
	slices.SortStableFunc(sorted, func(a, b audit.Entry) int {
		return cmp.Or(cmp.Compare(pos(a), pos(b)), strings.Compare(a.Key, b.Key))
	})
	return sorted, ends
}
