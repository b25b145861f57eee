// Package keys is the one place that spells leasehold's etcd keys.
//
// Layout under a namespace N (default "/leasehold"):
//
//	N/lease/<res>                         holder record, attached to the session's etcd lease
//	N/lease/%revoked/<session>/<res>      revocation signal to the holder's session, attached to it
//	N/lease/%queue/<res>/<ticket>         a waiting Acquire's queue entry (holder record to hand
//	                                      over), attached to the waiter's session; the entries'
//	                                      create revisions are the queue's order
//	N/lease/%gone/<ticket>                the marker of an Acquire call that gave up, attached
//	                                      to its session
//	N/lease/%limit/<res>                  a recipe's limit (package semaphore's permit count),
//	                                      decimal; no etcd lease, written once by the first user
//	N/lease/%delay/<res>                  a lock-delay: while it exists nobody may claim res;
//	                                      attached to a lease that outlives the holder's
//	                                      session (or to one granted by Revoke)
//	N/lease/%clock/<lease id>             a retention clock marker: the revision current when
//	                                      its etcd lease was granted, and the lease's TTL;
//	                                      attached to that lease, so etcd ends it
//	N/lease/%live/<lease id>              a worker pool's session is alive: the pool's worker,
//	                                      attached to the session's etcd lease, so its deletion
//	                                      is the session's end (docs/protocol.md §3.14)
//	N/lease/%session/<lease id>           a session that claims in the namespace: its worker,
//	                                      attached to the session's etcd lease before its first
//	                                      claim, so its deletion is the session's end, which
//	                                      the recorder watches for (docs/protocol.md §3.6)
//	N/done/<res>                          terminal record (status, epoch, worker)
//	N/audit/<res>/start/<id>              "acquired" entry; its epoch is its own mod revision
//	N/audit/<res>/end/<epoch>             the one end entry of an epoch (completed, released,
//	                                      expired, revoked): one key per epoch, so at most one
//	                                      end entry per epoch exists by construction
//	N/audit/<res>/rejected/<epoch>/<id>   one entry per rejected stale attempt
//	N/fence/<res>                         the highest epoch fenceetcd.Guard has admitted,
//	                                      20-digit zero-padded decimal so that etcd's
//	                                      byte-wise value compare is numeric order
//	N/fence/%floor                        fenceetcd.Guard's floor: the highest epoch whose
//	                                      fence keys were pruned, same encoding; no
//	                                      resource escapes to "%floor"
//
// <res> is the resource name with '%' and '/' percent-escaped, so an escaped
// name never contains '/' and "N/audit/<res>/" is a prefix of exactly one
// resource's entries: "a" can never list "a/b"'s entries. <epoch> is zero
// padded to 20 digits so keys sort by epoch.
package keys

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultNamespace is the namespace used when none is configured.
const DefaultNamespace = "/leasehold"

// MaxResourceLen is the largest resource name, in bytes.
const MaxResourceLen = 512

// ErrInvalidResource is returned for a resource name that is empty, longer
// than MaxResourceLen bytes, not valid UTF-8, or contains control characters.
var ErrInvalidResource = errors.New("invalid resource name")

// ErrInvalidNamespace is returned for a namespace that is empty, does not
// start with '/', ends with '/', contains control characters, or has a
// reserved segment (see ValidateNamespace).
var ErrInvalidNamespace = errors.New("invalid namespace")

// ErrMalformedKey is returned when a key under a namespace does not have the
// shape this package writes.
var ErrMalformedKey = errors.New("malformed key")

// ValidateResource reports whether name is a valid resource name.
func ValidateResource(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidResource)
	case len(name) > MaxResourceLen:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidResource, len(name), MaxResourceLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidResource)
	}
	for i, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character %U at byte %d", ErrInvalidResource, r, i)
		}
	}
	return nil
}

// reserved are the segments under which a namespace keeps its keys
// (N/lease/, N/done/, N/audit/, N/fence/).
var reserved = []string{"lease", "done", "audit", "fence"}

// drillSegment begins the last segment of a scratch namespace of
// `leasehold drill`: "N/%drill-<n>", n decimal. The operator role of N is
// granted the range "N/%drill-" for them (see DrillPrefix).
const drillSegment = "%drill-"

// ValidateNamespace reports whether ns is a usable namespace.
//
// No segment of a namespace may be one of the SDK's own (lease, done,
// audit, fence). That keeps any two namespaces apart, nested or not: the
// keys of "/a/b" are never under a prefix of "/a" — only a namespace
// "/a/lease…" or "/a/audit…" could put keys there, and those are refused.
//
// A segment beginning "%drill-" is allowed only as the last one, followed
// by decimal digits only: "N/%drill-<n>" is a scratch namespace of
// `leasehold drill` under N (IsDrill), and "N/%drill-" the range N's
// operator role is granted for them. So the only namespaces whose keys lie
// in that range are N's own drill namespaces, which have no roles of their
// own (package rbac refuses them), and no drill namespace has a namespace
// nested in it.
func ValidateNamespace(ns string) error {
	switch {
	case ns == "":
		return fmt.Errorf("%w: empty", ErrInvalidNamespace)
	case ns[0] != '/':
		return fmt.Errorf("%w: %q must start with '/'", ErrInvalidNamespace, ns)
	case len(ns) > 1 && ns[len(ns)-1] == '/':
		return fmt.Errorf("%w: %q must not end with '/'", ErrInvalidNamespace, ns)
	case !utf8.ValidString(ns):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidNamespace)
	}
	for _, r := range ns {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character %U", ErrInvalidNamespace, r)
		}
	}
	segs := strings.Split(ns[1:], "/")
	for i, seg := range segs {
		if slices.Contains(reserved, seg) {
			return fmt.Errorf("%w: %q has the segment %q, where the keys of an enclosing namespace live; choose another name", ErrInvalidNamespace, ns, seg)
		}
		if n, ok := strings.CutPrefix(seg, drillSegment); ok && (i != len(segs)-1 || !decimal(n)) {
			return fmt.Errorf("%w: %q has the segment %q: segments beginning %q are reserved for the scratch namespaces of `leasehold drill` (%q, last); choose another name",
				ErrInvalidNamespace, ns, seg, drillSegment, drillSegment+"<n>")
		}
	}
	return nil
}

// decimal reports whether s is one or more ASCII digits.
func decimal(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool { return r < '0' || r > '9' })
}

// Escape returns the key segment for a resource name: '%' and '/' are
// percent-escaped, every other byte stands for itself.
func Escape(name string) string {
	if !strings.ContainsAny(name, "%/") {
		return name
	}
	var b strings.Builder
	b.Grow(len(name) + 8)
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '%':
			b.WriteString("%25")
		case '/':
			b.WriteString("%2F")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Unescape reverses Escape. It accepts only what Escape produces: a segment
// with a bare '/', or an escape other than "%25" and "%2F", is malformed.
func Unescape(seg string) (string, error) {
	if strings.IndexByte(seg, '/') >= 0 {
		return "", fmt.Errorf("%w: unescaped '/' in %q", ErrMalformedKey, seg)
	}
	if strings.IndexByte(seg, '%') < 0 {
		return seg, nil
	}
	var b strings.Builder
	b.Grow(len(seg))
	for i := 0; i < len(seg); i++ {
		if seg[i] != '%' {
			b.WriteByte(seg[i])
			continue
		}
		switch {
		case strings.HasPrefix(seg[i:], "%25"):
			b.WriteByte('%')
		case strings.HasPrefix(seg[i:], "%2F"):
			b.WriteByte('/')
		default:
			return "", fmt.Errorf("%w: bad escape in %q", ErrMalformedKey, seg)
		}
		i += 2
	}
	return b.String(), nil
}

// Space is a namespace's key layout. The zero value is not usable; use New.
type Space struct {
	ns string
}

// New returns the layout under namespace ns.
func New(ns string) (Space, error) {
	if err := ValidateNamespace(ns); err != nil {
		return Space{}, err
	}
	if ns == "/" {
		ns = ""
	}
	return Space{ns: ns}, nil
}

// MustNew is New for namespaces already validated; it panics on error and is
// meant for package-level defaults only.
func MustNew(ns string) Space {
	s, err := New(ns)
	if err != nil {
		panic(err)
	}
	return s
}

// Namespace returns the namespace this layout was built for.
func (s Space) Namespace() string {
	if s.ns == "" {
		return "/"
	}
	return s.ns
}

// LeasePrefix is the prefix of every lease key.
func (s Space) LeasePrefix() string { return s.ns + "/lease/" }

// DonePrefix is the prefix of every done record.
func (s Space) DonePrefix() string { return s.ns + "/done/" }

// AuditPrefix is the prefix of every audit entry.
func (s Space) AuditPrefix() string { return s.ns + "/audit/" }

// FencePrefix is the prefix of every fence key (fenceetcd.Guard's record of
// the highest epoch admitted per resource).
func (s Space) FencePrefix() string { return s.ns + "/fence/" }

// DrillPrefix is the prefix of the keys of every scratch namespace
// `leasehold drill` makes under this namespace, "N/%drill-" ("/%drill-"
// under "/"): the range N's operator role is granted for them. No key of
// any other valid namespace lies under it (see ValidateNamespace).
func (s Space) DrillPrefix() string { return s.ns + "/" + drillSegment }

// DrillNamespace returns the scratch namespace number n of `leasehold
// drill` under this namespace: "N/%drill-<n>". It is not valid under a
// namespace that is itself a drill's (IsDrill).
func (s Space) DrillNamespace(n uint64) string { return s.DrillPrefix() + strconv.FormatUint(n, 10) }

// IsDrill reports whether this namespace is a scratch namespace of
// `leasehold drill`, "P/%drill-<n>": its keys lie in the drill range of
// its parent P, whose operator role may read and write them.
func (s Space) IsDrill() bool {
	last := s.ns[strings.LastIndexByte(s.ns, '/')+1:]
	return strings.HasPrefix(last, drillSegment)
}

// claimed returns the prefixes whose keys a namespace claims. A namespace
// N other than "/" claims its whole directory, "N/": its own keys, and
// those of any namespace nested in it (such as `leasehold drill`'s
// scratch namespaces). The root namespace's directory would be the whole
// keyspace, where callers keep keys of their own, so it claims the
// prefixes its keys are spelled under: "/lease/", "/done/", "/audit/",
// "/fence/". Every key this package spells is under one of them.
func (s Space) claimed() []string {
	if s.ns != "" {
		return []string{s.ns + "/"}
	}
	return []string{s.LeasePrefix(), s.DonePrefix(), s.AuditPrefix(), s.FencePrefix()}
}

// Overlaps reports whether the keys under prefix — a range a caller lists,
// watches or deletes, such as a worker pool's task prefix — and the keys
// the namespace claims share a key: either prefix is under one of the
// namespace's prefixes ("N/…"; for "/", "/lease/…", "/done/…",
// "/audit/…", "/fence/…"), or one of those is under prefix. So for the
// namespace "/a", "/a/x", "/a" and "/" overlap and "/ab/" does not; for
// "/", "/fence/x", "/l" and "/" overlap and "/jobs/" and "/leases/" do
// not. The empty prefix overlaps every namespace.
func (s Space) Overlaps(prefix string) bool {
	for _, p := range s.claimed() {
		if strings.HasPrefix(prefix, p) || strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}

// fenceFloorSegment is the last segment of the fence floor's key. Escape
// writes '%' only as "%25" or "%2F", so no resource name escapes to it (and
// Unescape refuses it): the floor is never a resource's fence key.
const fenceFloorSegment = "%floor"

// FenceFloor is the key of fenceetcd.Guard's floor: the highest epoch whose
// fence keys were pruned; every token at or below it is refused. It is
// "N/fence/%floor", under FencePrefix so that whoever may read or write the
// fence keys (every role granted the prefix) may read or write the floor,
// which every admission reads; and no resource's fence key, see
// fenceFloorSegment. A scan of FencePrefix returns it: skip it with
// IsFenceFloor.
func (s Space) FenceFloor() string { return s.FencePrefix() + fenceFloorSegment }

// IsFenceFloor reports whether key is this namespace's fence floor.
func (s Space) IsFenceFloor(key string) bool { return key == s.FenceFloor() }

// Lease is the lease key of a resource.
func (s Space) Lease(res string) string { return s.LeasePrefix() + Escape(res) }

// revokedSegment starts the keys of revocation signals under LeasePrefix.
// No resource's lease key starts with it: Escape writes '%' only as %25 or
// %2F, and a signal key has more segments than a lease key.
const revokedSegment = "%revoked/"

// RevocationsPrefix is the prefix of the revocation signals addressed to
// one session, "N/lease/%revoked/<session lease id, 16 hex digits>/": a
// Revoke writes one, attached to the holder's session lease, in the
// transaction that ends the epoch, and the holder's registry watches this
// prefix for its own sessions only.
func (s Space) RevocationsPrefix(session int64) string {
	return fmt.Sprintf("%s%s%016x/", s.LeasePrefix(), revokedSegment, uint64(session))
}

// Revocation is the key of the revocation signal of res addressed to a
// session.
func (s Space) Revocation(session int64, res string) string {
	return s.RevocationsPrefix(session) + Escape(res)
}

// IsRevocation reports whether key is a revocation signal of this
// namespace. A scan or watch of LeasePrefix sees them; skip them with it.
func (s Space) IsRevocation(key string) bool {
	return strings.HasPrefix(key, s.LeasePrefix()+revokedSegment)
}

// ResourceFromRevocation returns the resource a revocation signal key
// names.
func (s Space) ResourceFromRevocation(key string) (string, error) {
	rest, ok := strings.CutPrefix(key, s.LeasePrefix()+revokedSegment)
	if !ok {
		return "", fmt.Errorf("%w: %q is not a revocation signal", ErrMalformedKey, key)
	}
	_, seg, ok := strings.Cut(rest, "/")
	if !ok {
		return "", fmt.Errorf("%w: revocation signal %q has no resource", ErrMalformedKey, key)
	}
	res, err := Unescape(seg)
	if err != nil {
		return "", err
	}
	if err := ValidateResource(res); err != nil {
		return "", fmt.Errorf("%w: revocation signal %q: %w", ErrMalformedKey, key, err)
	}
	return res, nil
}

// queueSegment starts the keys of Acquire's waiting queue under
// LeasePrefix. Like revokedSegment, no lease key starts with it.
const queueSegment = "%queue/"

// QueuePrefix is the prefix of one resource's waiting queue,
// "N/lease/%queue/<res>/": a waiting Acquire puts one entry under it,
// attached to its session's etcd lease, and the entries' create revisions
// are the queue's order (docs/protocol.md §3.2). <res> is escaped, so the
// prefix holds exactly one resource's entries.
func (s Space) QueuePrefix(res string) string {
	return s.LeasePrefix() + queueSegment + Escape(res) + "/"
}

// QueuesPrefix is the prefix of every resource's waiting queue,
// "N/lease/%queue/": one read of it counts (or lists) all the namespace's
// waiters, where QueuePrefix reads one resource's.
func (s Space) QueuesPrefix() string { return s.LeasePrefix() + queueSegment }

// Queue is the key of one waiting Acquire's queue entry; ticket is unique
// per Acquire call.
func (s Space) Queue(res, ticket string) string { return s.QueuePrefix(res) + ticket }

// ParseQueue returns the resource and ticket a queue entry's key names.
func (s Space) ParseQueue(key string) (res, ticket string, err error) {
	rest, ok := strings.CutPrefix(key, s.LeasePrefix()+queueSegment)
	if !ok {
		return "", "", fmt.Errorf("%w: %q is not a queue entry", ErrMalformedKey, key)
	}
	seg, ticket, ok := strings.Cut(rest, "/")
	if !ok || ticket == "" || strings.IndexByte(ticket, '/') >= 0 {
		return "", "", fmt.Errorf("%w: queue entry %q needs a resource and a ticket", ErrMalformedKey, key)
	}
	if res, err = Unescape(seg); err != nil {
		return "", "", err
	}
	if err := ValidateResource(res); err != nil {
		return "", "", fmt.Errorf("%w: queue entry %q: %w", ErrMalformedKey, key, err)
	}
	return res, ticket, nil
}

// IsQueue reports whether key is a queue entry of this namespace.
func (s Space) IsQueue(key string) bool {
	return strings.HasPrefix(key, s.LeasePrefix()+queueSegment)
}

// goneSegment starts the keys of the "gave up" markers under LeasePrefix.
const goneSegment = "%gone/"

// Gone is the key of the marker an Acquire call that gave up leaves when
// its queue entry is not there to remove — its queueing transaction may
// still land — "N/lease/%gone/<ticket>", attached to the caller's session
// lease. The queueing transaction requires it absent.
func (s Space) Gone(ticket string) string { return s.LeasePrefix() + goneSegment + ticket }

// limitSegment starts the keys of recipes' limits under LeasePrefix. Like
// revokedSegment, no lease key starts with it.
const limitSegment = "%limit/"

// Limit is the key of the limit of the recipe that res names — package
// semaphore's permit count, with res "semaphore/<name>" —
// "N/lease/%limit/<res>", its value the limit in decimal. The first user of
// the name creates it and every later one compares its own limit with it
// (docs/protocol.md §3.12). It has no etcd lease: it outlives every session,
// and the SDK never deletes it. It lives under LeasePrefix so that the
// permissions a worker already has cover it.
func (s Space) Limit(res string) string { return s.LeasePrefix() + limitSegment + Escape(res) }

// LimitPrefix is the prefix of every limit key of the namespace.
func (s Space) LimitPrefix() string { return s.LeasePrefix() + limitSegment }

// ResourceFromLimit returns the resource a limit key names.
func (s Space) ResourceFromLimit(key string) (string, error) {
	return s.resourceFrom(key, s.LimitPrefix())
}

// IsLimit reports whether key is a recipe's limit key in this namespace.
func (s Space) IsLimit(key string) bool {
	return strings.HasPrefix(key, s.LeasePrefix()+limitSegment)
}

// delaySegment starts the keys of lock-delays under LeasePrefix. Like
// revokedSegment, no lease key starts with it.
const delaySegment = "%delay/"

// Delay is the key of res's lock-delay, "N/lease/%delay/<res>": while it
// exists, no claim of res succeeds (docs/protocol.md §3.13). A claim
// through a registry with lock-delay puts it attached to a lease that
// trails the holder's session lease, so it outlives an expired session by
// the delay; Complete and Release delete it, Revoke re-attaches it to a
// lease of its own. It lives under LeasePrefix so that the permissions a
// worker already has cover it.
func (s Space) Delay(res string) string { return s.LeasePrefix() + delaySegment + Escape(res) }

// IsDelay reports whether key is a lock-delay key of this namespace.
func (s Space) IsDelay(key string) bool {
	return strings.HasPrefix(key, s.LeasePrefix()+delaySegment)
}

// clockSegment starts the keys of retention's clock markers under
// LeasePrefix. Like revokedSegment, no lease key starts with it.
const clockSegment = "%clock/"

// ClockPrefix is the prefix of retention's clock markers,
// "N/lease/%clock/" (docs/protocol.md §3.9).
func (s Space) ClockPrefix() string { return s.LeasePrefix() + clockSegment }

// Clock is the key of the retention clock marker attached to etcd lease
// id, "N/lease/%clock/<id, 16 hex digits>": its value is the revision
// current when the lease was granted, so once etcd has expired the lease
// every revision up to that one is at least the lease's TTL old on etcd's
// clock (docs/protocol.md §3.9). It lives under LeasePrefix so that the
// permissions a recorder already has cover it.
func (s Space) Clock(id int64) string {
	return fmt.Sprintf("%s%016x", s.ClockPrefix(), uint64(id))
}

// IsClock reports whether key is a retention clock marker of this
// namespace.
func (s Space) IsClock(key string) bool { return strings.HasPrefix(key, s.ClockPrefix()) }

// liveSegment starts the keys of worker pools' session markers under
// LeasePrefix. Like revokedSegment, no lease key starts with it.
const liveSegment = "%live/"

// LivePrefix is the prefix of the worker pools' session markers,
// "N/lease/%live/" (docs/protocol.md §3.14).
func (s Space) LivePrefix() string { return s.LeasePrefix() + liveSegment }

// Live is the key of the marker of a pool session whose etcd lease is id,
// "N/lease/%live/<id, 16 hex digits>", attached to that lease: etcd
// deletes it with the session's lease keys, at the same revision, which
// tells the other pools which tasks that session held.
func (s Space) Live(id int64) string {
	return fmt.Sprintf("%s%016x", s.LivePrefix(), uint64(id))
}

// LiveLeaseID returns the etcd lease id a Live key names.
func (s Space) LiveLeaseID(key string) (int64, error) {
	return leaseIDAfter(key, s.LivePrefix(), s.ns)
}

// IsLive reports whether key is a pool session's marker of this
// namespace.
func (s Space) IsLive(key string) bool { return strings.HasPrefix(key, s.LivePrefix()) }

// sessionSegment starts the keys of the session markers under
// LeasePrefix. Like revokedSegment, no lease key starts with it.
const sessionSegment = "%session/"

// SessionPrefix is the prefix of the session markers,
// "N/lease/%session/" (docs/protocol.md §3.6).
func (s Space) SessionPrefix() string { return s.LeasePrefix() + sessionSegment }

// Session is the key of the marker of a session whose etcd lease is id,
// "N/lease/%session/<id, 16 hex digits>": a registry puts it, attached to
// that lease, before the session's first claim in the namespace, so every
// lease key the session holds there is attached to a lease that has one.
// etcd deletes it with the session's lease keys, at the same revision,
// which tells the recorder which session ended and when.
func (s Space) Session(id int64) string {
	return fmt.Sprintf("%s%016x", s.SessionPrefix(), uint64(id))
}

// SessionLeaseID returns the etcd lease id a Session key names.
func (s Space) SessionLeaseID(key string) (int64, error) {
	return leaseIDAfter(key, s.SessionPrefix(), s.ns)
}

// IsSession reports whether key is a session marker of this namespace.
func (s Space) IsSession(key string) bool { return strings.HasPrefix(key, s.SessionPrefix()) }

// leaseIDAfter reads the etcd lease id, 16 hex digits, that follows prefix
// in a marker key of namespace ns.
func leaseIDAfter(key, prefix, ns string) (int64, error) {
	hex, ok := strings.CutPrefix(key, prefix)
	if !ok || len(hex) != 16 {
		return 0, fmt.Errorf("%w: %q is not a session marker of %q", ErrMalformedKey, key, ns)
	}
	id, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not a session marker of %q", ErrMalformedKey, key, ns)
	}
	return int64(id), nil
}

// ControlRange is the key range [from, to) of LeasePrefix that holds every
// control key and no lease key: "N/lease/%a" up to "N/lease/%{". Every
// control segment is '%' and a lowercase letter; a resource's key segment
// begins with '%' only as the escape "%25" or "%2F", whose '2' sorts
// before 'a'. So the lease keys are exactly the keys of LeasePrefix below
// from or at and above to: a reader that wants lease keys alone reads the
// two ranges and skips the control keys without reading them.
func (s Space) ControlRange() (from, to string) {
	return s.LeasePrefix() + "%a", s.LeasePrefix() + "%{"
}

// IsControl reports whether key, under LeasePrefix, is one of the SDK's
// control keys kept there rather than a lease key: a revocation signal, a
// queue entry, a "gave up" marker, a recipe's limit, a lock-delay, a
// retention clock marker, a pool session's marker or a session marker. A
// scan or watch of LeasePrefix sees them; skip them with it.
func (s Space) IsControl(key string) bool {
	return s.IsRevocation(key) || s.IsQueue(key) || strings.HasPrefix(key, s.LeasePrefix()+goneSegment) || s.IsLimit(key) ||
		s.IsDelay(key) || s.IsClock(key) || s.IsLive(key) || s.IsSession(key)
}

// Done is the done record key of a resource.
func (s Space) Done(res string) string { return s.DonePrefix() + Escape(res) }

// Fence is the fence key of a resource. It is not the lease key because
// the highest admitted epoch must outlive the lease that issued it: the
// lease key is deleted when the lease ends, and an older token must still be
// refused afterwards.
func (s Space) Fence(res string) string { return s.FencePrefix() + Escape(res) }

// ResourceAudit is the prefix of one resource's audit entries.
func (s Space) ResourceAudit(res string) string { return s.AuditPrefix() + Escape(res) + "/" }

// AuditStart is the key of an "acquired" entry with a unique id.
func (s Space) AuditStart(res, id string) string { return s.ResourceAudit(res) + "start/" + id }

// AuditEnd is the key of the single end entry of an epoch.
func (s Space) AuditEnd(res string, epoch int64) string {
	return s.ResourceAudit(res) + "end/" + padEpoch(epoch)
}

// AuditRejected is the key of one rejected attempt against an epoch.
func (s Space) AuditRejected(res string, epoch int64, id string) string {
	return s.ResourceAudit(res) + "rejected/" + padEpoch(epoch) + "/" + id
}

func padEpoch(e int64) string { return fmt.Sprintf("%020d", e) }

// ResourceFromLease returns the resource a lease key belongs to.
func (s Space) ResourceFromLease(key string) (string, error) {
	return s.resourceFrom(key, s.LeasePrefix())
}

// ResourceFromDone returns the resource a done record key belongs to.
func (s Space) ResourceFromDone(key string) (string, error) {
	return s.resourceFrom(key, s.DonePrefix())
}

func (s Space) resourceFrom(key, prefix string) (string, error) {
	seg, ok := strings.CutPrefix(key, prefix)
	if !ok || seg == "" {
		return "", fmt.Errorf("%w: %q is not under %q", ErrMalformedKey, key, prefix)
	}
	res, err := Unescape(seg)
	if err != nil {
		return "", err
	}
	if err := ValidateResource(res); err != nil {
		return "", fmt.Errorf("%w: %w", ErrMalformedKey, err)
	}
	return res, nil
}

// AuditKind says which of the three audit key shapes a key has.
type AuditKind int

// The audit key shapes.
const (
	AuditKindStart AuditKind = iota + 1
	AuditKindEnd
	AuditKindRejected
)

// AuditKey is a parsed audit key.
type AuditKey struct {
	Resource string
	Kind     AuditKind
	Epoch    int64  // End and Rejected; 0 for Start (its epoch is its mod revision)
	ID       string // Start and Rejected
}

// ParseAudit parses an audit key written by this layout.
func (s Space) ParseAudit(key string) (AuditKey, error) {
	rest, ok := strings.CutPrefix(key, s.AuditPrefix())
	if !ok {
		return AuditKey{}, fmt.Errorf("%w: %q is not under %q", ErrMalformedKey, key, s.AuditPrefix())
	}
	parts := strings.Split(rest, "/")
	bad := func(why string) (AuditKey, error) {
		return AuditKey{}, fmt.Errorf("%w: audit key %q: %s", ErrMalformedKey, key, why)
	}
	if len(parts) < 3 {
		return bad("too few segments")
	}
	res, err := Unescape(parts[0])
	if err != nil {
		return bad("resource segment: " + strings.TrimPrefix(err.Error(), ErrMalformedKey.Error()+": "))
	}
	if err := ValidateResource(res); err != nil {
		return bad(err.Error())
	}
	k := AuditKey{Resource: res}
	switch parts[1] {
	case "start":
		if len(parts) != 3 || parts[2] == "" {
			return bad("start entry needs one id")
		}
		k.Kind, k.ID = AuditKindStart, parts[2]
	case "end":
		if len(parts) != 3 {
			return bad("end entry needs one epoch")
		}
		k.Kind = AuditKindEnd
		if k.Epoch, err = parseEpoch(parts[2]); err != nil {
			return bad(err.Error())
		}
	case "rejected":
		if len(parts) != 4 || parts[3] == "" {
			return bad("rejected entry needs an epoch and an id")
		}
		k.Kind, k.ID = AuditKindRejected, parts[3]
		if k.Epoch, err = parseEpoch(parts[2]); err != nil {
			return bad(err.Error())
		}
	default:
		return bad("unknown entry shape " + strconv.Quote(parts[1]))
	}
	return k, nil
}

func parseEpoch(s string) (int64, error) {
	if len(s) != 20 {
		return 0, fmt.Errorf("epoch %q is not 20 digits", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("epoch %q is not decimal", s)
		}
	}
	e, err := strconv.ParseInt(s, 10, 64)
	if err != nil || e <= 0 {
		return 0, fmt.Errorf("epoch %q out of range", s)
	}
	return e, nil
}
