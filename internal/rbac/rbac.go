// Package rbac defines the least-privilege etcd roles for leasehold, as
// data, and creates them with etcd's auth API.
//
// etcd grants permissions to roles as key ranges with read, write or
// readwrite access, and checks every key a request touches — for a
// transaction, every compare and every operation of both branches,
// including nested transactions, whichever branch runs. A leasehold
// transaction therefore needs access to everything it might touch: an
// Acquire compares the audit entry's key, Complete's Else branch writes a
// rejection entry, and so on. The roles, for a namespace N:
//
//	leasehold-worker    readwrite N/lease/ N/done/ N/audit/ N/fence/
//	leasehold-operator  readwrite N/lease/ N/done/ N/audit/ N/fence/ N/%drill-
//	leasehold-auditor   read      N/lease/ N/done/ N/audit/ N/fence/
//
// Roles exposes each permission with the reason it is needed. Apply
// creates the roles (or corrects them) as etcd's root user; `leasehold
// roles` prints the equivalent etcdctl commands.
//
// The roles scope a namespace, not a worker: etcd cannot tell one worker's
// lease keys from another's, so any holder of the worker role can end or
// forge any lease of the namespace. Fencing against a worker that is
// merely late needs no more; against one that is malicious, see
// SECURITY.md. Namespaces are isolated from each other, nested ones
// included: a namespace may not have a segment named lease, done, audit
// or fence (keys.ValidateNamespace), so no namespace's keys fall under
// another's prefixes ("/a" and "/a/b" are isolated; "/a/lease" is refused).
//
// The operator's N/%drill- is the range of `leasehold drill`'s scratch
// namespaces N/%drill-<n>. keys.ValidateNamespace allows a segment
// beginning "%drill-" only as a namespace's last, followed by digits, so
// the only namespaces with keys in that range are N's drill namespaces;
// Roles refuses them, so none has roles, or users, of its own ("/a/drill-x"
// and "/a/b" are isolated from "/a"'s operator; "/a/%drill-x" is refused).
package rbac

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/leasehold/leasehold/internal/keys"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The roles' base names. In the default namespace ("/leasehold") a role's
// name is its base name; in another namespace N it is "<base>:N" (see
// RoleName), so each namespace has its own roles.
const (
	Worker   = "leasehold-worker"
	Operator = "leasehold-operator"
	Auditor  = "leasehold-auditor"
)

// Access is the kind of access a permission grants, spelled as etcdctl
// spells it.
type Access string

// The access kinds.
const (
	Read      Access = "read"
	Write     Access = "write"
	ReadWrite Access = "readwrite"
)

func (a Access) etcd() clientv3.PermissionType {
	switch a {
	case Read:
		return clientv3.PermissionType(clientv3.PermRead)
	case Write:
		return clientv3.PermissionType(clientv3.PermWrite)
	default:
		return clientv3.PermissionType(clientv3.PermReadWrite)
	}
}

// Permission grants access to every key that starts with Prefix.
type Permission struct {
	Prefix string
	Access Access
	// Why names the operations that need it.
	Why string
}

// RangeEnd is the etcd range end of the permission: the first key after
// every key with the prefix.
func (p Permission) RangeEnd() string { return clientv3.GetPrefixRangeEnd(p.Prefix) }

// Role is a named set of permissions.
type Role struct {
	Name        string
	Base        string // Worker, Operator or Auditor
	Namespace   string
	Permissions []Permission
}

// RoleName returns the name of a role in a namespace: base in the default
// namespace, "<base>:<namespace>" in any other.
func RoleName(base, namespace string) string {
	if namespace == keys.DefaultNamespace {
		return base
	}
	return base + ":" + namespace
}

// Roles returns the worker, operator and auditor roles of a namespace. A
// scratch namespace of `leasehold drill` (keys.Space.IsDrill) has none:
// its keys are its parent's operator's.
func Roles(namespace string) ([]Role, error) {
	sp, err := keys.New(namespace)
	if err != nil {
		return nil, fmt.Errorf("rbac: %w", err)
	}
	ns := sp.Namespace()
	if sp.IsDrill() {
		return nil, fmt.Errorf("rbac: %q is a scratch namespace of `leasehold drill`, in the range of its parent's operator role; it has no roles of its own", ns)
	}
	var (
		leaseRW = Permission{sp.LeasePrefix(), ReadWrite, "" +
			"TryAcquire puts the lease key attached to the session's etcd lease and every transaction compares it; " +
			"Complete, Release and Revoke delete it; the registry watches the prefix; " +
			"a session's first claim puts its marker <namespace>/lease/%session/<lease id> there, attached to the session's etcd lease, " +
			"and the recorder watches the markers and reads the lease keys a session held when its marker went; " +
			"etcd lets a session renew or revoke its etcd lease only with write access to every key attached to it"}
		doneRW = Permission{sp.DonePrefix(), ReadWrite, "" +
			"TryAcquire compares and reads the done record; Complete puts it, and its Else branch compares its value to recognise a retry; " +
			"the recorder's retention deletes it with its epoch's entries"}
		auditRW = Permission{sp.AuditPrefix(), ReadWrite, "" +
			"every transition puts its entry create-only (a compare, then a put) in the same transaction — " +
			"Complete's and Release's Else branches put the rejection entry; Revoke puts the revoked entry; " +
			"the recorder lists the prefix and puts expired entries, and its retention deletes entries it archived"}
		fenceRW = Permission{sp.FencePrefix(), ReadWrite, "" +
			"fenceetcd.Guard compares, reads and puts the highest epoch admitted per resource, and reads the floor <namespace>/fence/%floor; " +
			"fenceetcd.Guard.Prune raises the floor and deletes the keys below it"}
		drillRW = Permission{sp.DrillPrefix(), ReadWrite, "" +
			"`leasehold drill` acquires, revokes, fences and completes in a scratch namespace <namespace>/%drill-<n> and deletes it afterwards; " +
			"no other namespace's keys are in this range"}
	)
	read := func(p Permission, why string) Permission { return Permission{p.Prefix, Read, why} }
	roles := []Role{
		{Base: Worker, Permissions: []Permission{leaseRW, doneRW, auditRW, fenceRW}},
		{Base: Operator, Permissions: []Permission{
			{leaseRW.Prefix, ReadWrite, "`leasehold holders` reads the lease keys and their sessions' TTLs; Revoke reads the lease key, compares and deletes it"},
			{doneRW.Prefix, ReadWrite, "inspection of finished resources; `leasehold recorder --retention` deletes done records with their epochs' entries"},
			{auditRW.Prefix, ReadWrite, "`leasehold audit` and `timeline` list the prefix; Revoke puts the revoked entry create-only; the recorder puts expired entries, and with retention deletes the entries it archived"},
			{fenceRW.Prefix, ReadWrite, "inspection of the epochs admitted downstream; fenceetcd.Guard.Prune raises the floor and deletes fence keys below it"},
			drillRW,
		}},
		{Base: Auditor, Permissions: []Permission{
			read(leaseRW, "`leasehold holders`, and fenceetcd.Verifier or fenceetcd.LeaseGuard's reads of the live epoch"),
			read(doneRW, "inspection of finished resources"),
			read(auditRW, "`leasehold audit` and `timeline`, audit.List and audit.Watch"),
			read(fenceRW, "inspection of the epochs admitted downstream"),
		}},
	}
	for i := range roles {
		roles[i].Name = RoleName(roles[i].Base, ns)
		roles[i].Namespace = ns
	}
	return roles, nil
}

// Apply creates the namespace's roles and makes each role's permissions
// exactly those of Roles: missing ones are granted, a different access is
// corrected, and any other permission of the role is revoked. It is
// idempotent. cli must be authorised to manage roles (etcd's root user, or
// any client before auth is enabled). Users are not touched: grant them a
// role with `etcdctl user grant-role <user> <role>` or
// clientv3.Auth.UserGrantRole.
func Apply(ctx context.Context, cli *clientv3.Client, namespace string) error {
	if cli == nil {
		return errors.New("rbac: Apply: nil client")
	}
	roles, err := Roles(namespace)
	if err != nil {
		return err
	}
	for _, r := range roles {
		if err := apply(ctx, cli, r); err != nil {
			return err
		}
	}
	return nil
}

type permKey struct{ key, end string }

func apply(ctx context.Context, cli *clientv3.Client, r Role) error {
	if _, err := cli.RoleAdd(ctx, r.Name); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("rbac: add role %q: %w", r.Name, err)
	}
	got, err := cli.RoleGet(ctx, r.Name)
	if err != nil {
		return fmt.Errorf("rbac: read role %q: %w", r.Name, err)
	}
	want := map[permKey]Permission{}
	for _, p := range r.Permissions {
		want[permKey{p.Prefix, p.RangeEnd()}] = p
	}
	have := map[permKey]clientv3.PermissionType{}
	for _, p := range got.Perm {
		k := permKey{string(p.Key), string(p.RangeEnd)}
		have[k] = clientv3.PermissionType(p.PermType)
		if _, ok := want[k]; ok {
			continue
		}
		if _, err := cli.RoleRevokePermission(ctx, r.Name, k.key, k.end); err != nil {
			return fmt.Errorf("rbac: role %q: revoke permission on [%q, %q): %w", r.Name, k.key, k.end, err)
		}
	}
	for _, p := range r.Permissions {
		if t, ok := have[permKey{p.Prefix, p.RangeEnd()}]; ok && t == p.Access.etcd() {
			continue
		}
		if _, err := cli.RoleGrantPermission(ctx, r.Name, p.Prefix, p.RangeEnd(), p.Access.etcd()); err != nil {
			return fmt.Errorf("rbac: role %q: grant %s on prefix %q: %w", r.Name, p.Access, p.Prefix, err)
		}
	}
	return nil
}

// EtcdctlCommands returns the etcdctl commands that create the role on a
// cluster where it does not exist yet, shell-quoted where needed.
func (r Role) EtcdctlCommands() []string {
	cmds := []string{"etcdctl role add " + shellQuote(r.Name)}
	for _, p := range r.Permissions {
		cmds = append(cmds, fmt.Sprintf("etcdctl role grant-permission %s --prefix=true %s %s", shellQuote(r.Name), p.Access, shellQuote(p.Prefix)))
	}
	return cmds
}

// shellQuote quotes s for a POSIX shell unless it is made only of
// characters that need no quoting.
func shellQuote(s string) string {
	safe := s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=,", r))
	})
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
