package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// electionView is one election as `holders` shows it.
type electionView struct {
	Name    string
	Leader  lease.Holder
	Waiters int
}

// semaphoreView is one semaphore as `holders` shows it: the limit stored
// on its first use, the permits held, and the Acquire calls waiting (the
// turnstile's holder and its queue).
type semaphoreView struct {
	Name    string
	Limit   int // 0: unknown (no limit key)
	Permits []lease.Holder
	Waiters int
}

// recipeViews sorts holders into tasks, elections and semaphores, and
// reads what the tables show beside them: each election's and
// semaphore's waiters, and every semaphore's stored limit (one read of
// the limit keys), so a semaphore with no permit held still shows.
func recipeViews(ctx context.Context, cli *clientv3.Client, sp keys.Space, reg *lease.Registry, hs []lease.Holder) (tasks []lease.Holder, els []electionView, sems []semaphoreView, err error) {
	byName := map[string]*semaphoreView{}
	sem := func(name string) *semaphoreView {
		v := byName[name]
		if v == nil {
			v = &semaphoreView{Name: name}
			byName[name] = v
		}
		return v
	}
	limits, err := cli.Get(ctx, sp.LimitPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read the semaphores' limits: %w", err)
	}
	for _, kv := range limits.Kvs {
		res, err := sp.ResourceFromLimit(string(kv.Key))
		name, ok := recipekeys.ParseLimit(res)
		if err != nil || !ok {
			continue // another recipe's limit
		}
		sem(name).Limit, _ = strconv.Atoi(string(kv.Value))
	}
	turnstileHeld := map[string]bool{}
	for _, h := range hs {
		switch h.Kind {
		case recipekeys.ElectionKind:
			if name, ok := recipekeys.ElectionName(h.Resource); ok {
				els = append(els, electionView{Name: name, Leader: h})
				continue
			}
		case recipekeys.PermitKind:
			if name, _, ok := recipekeys.ParsePermit(h.Resource); ok {
				v := sem(name)
				v.Permits = append(v.Permits, h)
				continue
			}
		case recipekeys.TurnstileKind:
			if name, ok := recipekeys.ParseTurnstile(h.Resource); ok {
				turnstileHeld[name] = true
				continue
			}
		}
		tasks = append(tasks, h)
	}
	for i := range els {
		if els[i].Waiters, err = reg.Waiters(ctx, recipekeys.Election(els[i].Name)); err != nil {
			return nil, nil, nil, err
		}
	}
	for name, v := range byName {
		if v.Waiters, err = reg.Waiters(ctx, recipekeys.Turnstile(name)); err != nil {
			return nil, nil, nil, err
		}
		if turnstileHeld[name] {
			v.Waiters++ // the head waiter holds the turnstile
		}
		sems = append(sems, *v)
	}
	sort.Slice(sems, func(i, j int) bool { return sems[i].Name < sems[j].Name })
	return tasks, els, sems, nil
}

// recipeRows renders the elections' and semaphores' tables.
func recipeRows(els []electionView, sems []semaphoreView, now time.Time) (elRows, semRows [][]string) {
	for _, e := range els {
		elRows = append(elRows, []string{e.Name, e.Leader.Worker, fmt.Sprint(e.Leader.Epoch), age(now.Sub(e.Leader.Since)), fmt.Sprint(e.Waiters)})
	}
	for _, s := range sems {
		limit := "?"
		if s.Limit > 0 {
			limit = strconv.Itoa(s.Limit)
		}
		var held []string
		for _, p := range s.Permits {
			_, i, _ := recipekeys.ParsePermit(p.Resource)
			held = append(held, fmt.Sprintf("#%d %s@%d", i, p.Worker, p.Epoch))
		}
		if len(held) == 0 {
			held = []string{"-"}
		}
		semRows = append(semRows, []string{s.Name, fmt.Sprintf("%d/%s", len(s.Permits), limit), strings.Join(held, ", "), fmt.Sprint(s.Waiters)})
	}
	return elRows, semRows
}
