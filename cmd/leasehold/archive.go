package main

import (
	"database/sql"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// archiveHelp explains --archive; every command that reads the audit log
// or runs the recorder shares it.
const archiveHelp = "--archive names the SQL archive that retention moves old entries into, read together with\n" +
	"etcd as one log: sqlite:PATH (a file, created if missing) or a PostgreSQL URL\n" +
	"(postgres://user@host:5432/db?sslmode=...). Without it only what etcd still holds is read."

// validateArchive checks --archive's form without opening anything.
func validateArchive(dsn string) error {
	switch {
	case dsn == "":
		return nil
	case strings.HasPrefix(dsn, "sqlite:"):
		if strings.TrimPrefix(dsn, "sqlite:") == "" {
			return usagef("--archive sqlite: needs a file path, as in sqlite:/var/lib/leasehold/audit.db")
		}
		return nil
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		if _, err := pgx.ParseConfig(dsn); err != nil {
			return usagef("--archive: %v", err)
		}
		return nil
	}
	return usagef("--archive %q: want sqlite:PATH or a postgres:// URL", redactDSN(dsn))
}

// redactDSN keeps a password out of messages.
func redactDSN(dsn string) string {
	if i := strings.Index(dsn, "@"); i >= 0 {
		if j := strings.Index(dsn, "://"); j >= 0 && j < i {
			return dsn[:j+3] + "…" + dsn[i:]
		}
	}
	return dsn
}

// openArchive opens the archive --archive names; nil when it names none.
// close releases the database.
func (g *globals) openArchive() (a audit.Archive, close func(), err error) {
	if g.archive == "" {
		return nil, func() {}, nil
	}
	var db *sql.DB
	if path, ok := strings.CutPrefix(g.archive, "sqlite:"); ok {
		// The write lock at BEGIN, and a wait for it: recorders on one file
		// queue instead of failing with SQLITE_BUSY.
		db, err = sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_txlock=immediate")
	} else {
		var cfg *pgx.ConnConfig
		if cfg, err = pgx.ParseConfig(g.archive); err == nil {
			db = stdlib.OpenDB(*cfg)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("archive %s: %w", redactDSN(g.archive), err)
	}
	a, err = audit.NewSQLArchive(db)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("archive %s: %w", redactDSN(g.archive), err)
	}
	return a, func() { db.Close() }, nil
}

// auditLog returns the namespace's audit log over cli, reading the archive
// too when --archive names one, and the call that closes both. opts come
// after the archive.
func (g *globals) auditLog(cli *clientv3.Client, opts ...audit.Option) (*audit.Log, func(), error) {
	a, closeArchive, err := g.openArchive()
	if err != nil {
		return nil, nil, err
	}
	var all []audit.Option
	if a != nil {
		all = append(all, audit.WithArchive(a))
	}
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(g.namespace), lease.WithLogger(g.log))
	if err != nil {
		return nil, nil, err
	}
	log, err := audit.New(reg, append(all, opts...)...)
	if err != nil {
		_ = reg.Close()
		closeArchive()
		return nil, nil, err
	}
	return log, func() { _ = reg.Close(); closeArchive() }, nil
}
