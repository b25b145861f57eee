// Package record defines the values stored at lease and done keys. Their
// encodings are fixed here so that every package reads them the same way.
package record

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrCorrupt is returned for a value that is not a record this package wrote.
var ErrCorrupt = errors.New("corrupt record")

// Holder is the value of a lease key: who holds the resource. It is written
// once per epoch and never rewritten while the epoch holds, so the key's
// mod revision — the epoch — never changes while it is held; a handoff
// writes the next holder's record in the transaction that ends the epoch.
// A waiting Acquire's queue entry holds the record a handoff writes for it.
type Holder struct {
	Worker     string    `json:"worker"`
	LeaseID    int64     `json:"lease_id"`
	AcquiredAt time.Time `json:"acquired_at"`
	// Ticket names the Acquire call a queue entry belongs to: the record
	// handed to that call carries it, which is how the call recognises its
	// grant. Empty for a claim made without queueing.
	Ticket string `json:"ticket,omitempty"`
	// Kind names the recipe holding the resource (an election, a
	// semaphore's permit; lease.Registry.Recipe); empty for a task.
	Kind string `json:"kind,omitempty"`
	// LockDelayLease and LockDelayMS are set when the holding was claimed
	// through a registry with lock-delay (lease.WithLockDelay): the etcd
	// lease that trails the holder's session, to which the claim attaches
	// the resource's delay key, and the delay in milliseconds. A queue
	// entry carries them so that a handoff can put the delay key for its
	// waiter.
	LockDelayLease int64 `json:"lock_delay_lease,omitempty"`
	LockDelayMS    int64 `json:"lock_delay_ms,omitempty"`
}

// Encode returns the holder record's bytes.
func (h Holder) Encode() string {
	b, _ := json.Marshal(h) // a struct of strings, ints and a time cannot fail
	return string(b)
}

// DecodeHolder parses a lease key's value.
func DecodeHolder(v []byte) (Holder, error) {
	var h Holder
	if err := json.Unmarshal(v, &h); err != nil {
		return Holder{}, fmt.Errorf("%w: holder: %w", ErrCorrupt, err)
	}
	if h.Worker == "" {
		return Holder{}, fmt.Errorf("%w: holder without worker", ErrCorrupt)
	}
	return h, nil
}

// Done is the value of a done key: how a resource finished. Its bytes are a
// pure function of (status, epoch, worker) — no timestamp — so a retried
// completion produces the same bytes and a transaction can recognise it
// with a value compare.
type Done struct {
	Status string `json:"status"`
	Epoch  int64  `json:"epoch"`
	Worker string `json:"worker"`
}

// Encode returns the done record's bytes; equal records encode equally.
func (d Done) Encode() string {
	b, _ := json.Marshal(d)
	return string(b)
}

// DecodeDone parses a done key's value.
func DecodeDone(v []byte) (Done, error) {
	var d Done
	if err := json.Unmarshal(v, &d); err != nil {
		return Done{}, fmt.Errorf("%w: done: %w", ErrCorrupt, err)
	}
	if d.Epoch <= 0 || d.Status == "" {
		return Done{}, fmt.Errorf("%w: done record without epoch or status", ErrCorrupt)
	}
	return d, nil
}

// Delay is the value of a lock-delay key (N/lease/%delay/<res>): whose
// involuntary end it follows and how long it lasts. The key's etcd lease,
// not the value, decides when it goes; Revoke reads Delay to grant a lease
// of that length.
type Delay struct {
	// Worker is the holder the delay follows.
	Worker string
	// Epoch is the epoch the delay guards, when known: a claim writes the
	// key in the transaction that begins the epoch, so the key's own mod
	// revision is the epoch and Epoch is 0; Revoke, which rewrites it, sets
	// it.
	Epoch int64
	// Delay is the lock-delay, encoded in whole milliseconds (rounded up).
	Delay time.Duration
}

type delayWire struct {
	Worker  string `json:"worker"`
	Epoch   int64  `json:"epoch,omitempty"`
	DelayMS int64  `json:"delay_ms"`
}

// Millis is d in whole milliseconds, rounded up, so that an encoded delay
// is never shorter than the one configured.
func Millis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// Encode returns the delay record's bytes.
func (d Delay) Encode() string {
	b, _ := json.Marshal(delayWire{Worker: d.Worker, Epoch: d.Epoch, DelayMS: Millis(d.Delay)})
	return string(b)
}

// DecodeDelay parses a delay key's value.
func DecodeDelay(v []byte) (Delay, error) {
	var w delayWire
	if err := json.Unmarshal(v, &w); err != nil {
		return Delay{}, fmt.Errorf("%w: delay: %w", ErrCorrupt, err)
	}
	if w.Worker == "" || w.DelayMS <= 0 || w.Epoch < 0 {
		return Delay{}, fmt.Errorf("%w: delay record without worker or positive delay", ErrCorrupt)
	}
	return Delay{Worker: w.Worker, Epoch: w.Epoch, Delay: time.Duration(w.DelayMS) * time.Millisecond}, nil
}
