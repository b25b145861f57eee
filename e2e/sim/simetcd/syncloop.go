package simetcd

import (
	"math"
	_ "unsafe" // for go:linkname
)

// mvcc's loop that syncs the watchers behind the store
// (watchable_store.go, syncWatchersLoop) yields, after a pass that synced
// some of them but left others behind, for as long as the pass took. On
// synctest's virtual clock a pass takes no time, and the loop panics
// resetting its ticker to 0. A watcher is left behind by a pass when more
// than watchBatchMaxRevs revisions wait for it — a watcher the store set
// aside while its channel was full, put back far behind — or when its
// compaction notice cannot be delivered (its channel full again). The
// first cannot happen here: the batch is unbounded, so a pass sends a
// watcher everything it is behind by. The second is made rare by draining
// the store's channels at once (watch.go), and a watch from a past
// revision never starts behind (watchConn.create).
//
//go:linkname mvccWatchBatchMaxRevs go.etcd.io/etcd/server/v3/storage/mvcc.watchBatchMaxRevs
var mvccWatchBatchMaxRevs int

func init() { mvccWatchBatchMaxRevs = math.MaxInt32 }
