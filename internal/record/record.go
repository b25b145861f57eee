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
