package simetcd

import (
	"errors"
	_ "unsafe" // for go:linkname

	_ "go.etcd.io/etcd/client/v3" // defines the variable linked below
)

// clientWatchDone is clientv3's valCtxCh: the Done channel of the
// context that clientv3's watcher derives every watch stream's context
// from, which is never closed. Made at clientv3's initialisation, outside
// any bubble, it keeps the goroutine that the context package starts to
// propagate its cancellation from ever blocking durably, and with it the
// bubble's clock from moving while a watch is open (see the package
// documentation). Set to nil, it means the same — never done — and the
// context package starts no goroutine for it.
//
//go:linkname clientWatchDone go.etcd.io/etcd/client/v3.valCtxCh
var clientWatchDone chan struct{}

// errWatchDoneUnlinked is New's error when the link above is to nothing:
// clientv3 renamed the variable, and watches would stop the clock.
var errWatchDoneUnlinked error

func init() {
	// clientv3, imported above, is initialised first: a linked variable
	// holds its channel by now.
	if clientWatchDone == nil {
		errWatchDoneUnlinked = errors.New("simetcd: clientv3's valCtxCh is gone; its watches would stop a synctest bubble's clock (see watchctx.go)")
		return
	}
	clientWatchDone = nil
}
