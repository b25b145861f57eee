// Package recipekeys names the resources the recipes (packages election
// and semaphore) hold, and reads them back: the recipes build them, and
// the CLI and the chaos suite recognise a recipe's holdings among a
// namespace's holders by them (docs/protocol.md §3.11, §3.12).
package recipekeys

import (
	"strconv"
	"strings"
)

// ElectionKind is the recipe kind of an election's holdings: the Kind of
// the lease.Holder that leads.
const ElectionKind = "election"

// ElectionPrefix begins the resource of every election: the election named
// name is the resource ElectionPrefix + name.
const ElectionPrefix = ElectionKind + "/"

// Election returns the resource of the election named name.
func Election(name string) string { return ElectionPrefix + name }

// ElectionName returns the name of the election whose resource is
// resource, and false when resource is not an election's.
func ElectionName(resource string) (name string, ok bool) {
	name, ok = strings.CutPrefix(resource, ElectionPrefix)
	return name, ok && name != ""
}

// The kinds of the holdings a semaphore takes: permits, and the turnstile
// its head waiter holds.
const (
	PermitKind    = "permit"
	TurnstileKind = "turnstile"
)

// MaxLimit is the largest limit a semaphore may have (semaphore.MaxLimit).
const MaxLimit = 1024

// semaphorePrefix starts the resources of every semaphore.
const semaphorePrefix = "semaphore/"

// permitSeparator separates a semaphore's name from a permit's index.
const permitSeparator = "/permit/"

// Permit is the resource of permit i of the semaphore name:
// "semaphore/<name>/permit/<i>", i in decimal. Its lease key is the permit.
func Permit(name string, i int) string {
	return semaphorePrefix + name + permitSeparator + strconv.Itoa(i)
}

// PermitPrefix begins the resources of the semaphore's permits.
func PermitPrefix(name string) string { return semaphorePrefix + name + permitSeparator }

// Turnstile is the resource of the semaphore's turnstile,
// "semaphore/<name>/turnstile": the first Acquire call waiting for a
// permit holds it, and the others wait in its queue.
func Turnstile(name string) string { return semaphorePrefix + name + "/turnstile" }

// Limit names the semaphore in its limit key (keys.Space.Limit).
func Limit(name string) string { return semaphorePrefix + name }

// ParseLimit returns the semaphore whose limit key names resource, and
// false for any other recipe's.
func ParseLimit(resource string) (name string, ok bool) {
	name, ok = strings.CutPrefix(resource, semaphorePrefix)
	return name, ok && name != ""
}

// ParseTurnstile returns the semaphore whose turnstile is resource, and
// false for any other resource.
func ParseTurnstile(resource string) (name string, ok bool) {
	rest, ok := strings.CutPrefix(resource, semaphorePrefix)
	if !ok {
		return "", false
	}
	name, ok = strings.CutSuffix(rest, "/turnstile")
	return name, ok && name != ""
}

// ParsePermit returns the semaphore and the index of a permit's resource,
// and ok = false for any other resource. It splits at the last "/permit/",
// which is followed by the index alone (decimal without a sign or leading
// zeros, below MaxLimit), so a name containing "/permit/" is read back
// whole and no two semaphores' permits share a resource.
func ParsePermit(resource string) (name string, i int, ok bool) {
	rest, found := strings.CutPrefix(resource, semaphorePrefix)
	if !found {
		return "", 0, false
	}
	at := strings.LastIndex(rest, permitSeparator)
	if at <= 0 {
		return "", 0, false
	}
	digits := rest[at+len(permitSeparator):]
	i, err := strconv.Atoi(digits)
	if err != nil || i < 0 || i >= MaxLimit || strconv.Itoa(i) != digits {
		return "", 0, false
	}
	return rest[:at], i, true
}

// Reserved reports whether resource is in the recipes' part of the
// resource names — an election's ("election/…") or a semaphore's
// ("semaphore/…") — which only a recipe's registry may claim: a task
// named like a recipe's resource, claimed and completed through a task
// registry, would write a done record that ends the recipe for good
// (docs/protocol.md §1).
func Reserved(resource string) bool {
	return strings.HasPrefix(resource, ElectionPrefix) || strings.HasPrefix(resource, semaphorePrefix)
}
