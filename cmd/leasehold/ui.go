package main

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The console (`leasehold ui`) is server-rendered HTML: html/template
// escapes every name from etcd for the context it lands in (text,
// attribute, URL query), the timeline picture is timelineSVG's (which
// escapes its own), and the one script, console.js, only fills the audit
// stream's table with textContent from server-sent events. Its files are
// embedded: the binary is the whole console. See docs/design.md §Console.

//go:embed ui
var uiFiles embed.FS

// consolePages are the console's pages; each is ui/layout.html with its
// own ui/<page>.html.
var consolePages = []string{"overview", "holders", "audit", "resource", "worker"}

// console serves the pages of one namespace, reading etcd and never
// writing it.
type console struct {
	g        *globals
	cli      *clientv3.Client
	reg      *lease.Registry
	log      *audit.Log
	sp       keys.Space
	prefixes []string
	maxRows  int
	pages    map[string]*template.Template
	stream   *auditStream
}

func newUICmd(g *globals) *cobra.Command {
	var (
		listen   string
		prefixes []string
		maxRows  int
	)
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve a read-only web console: overview, holders, a live audit stream, resources, workers",
		Long: "Serve a web console for operators on --listen (loopback by default): an overview of the\n" +
			"namespace, every holder with its queue, the audit trail as a live stream (pushed from etcd's\n" +
			"watch, filtered by resource, worker and kind), a resource's timeline, entries, completion and\n" +
			"waiters, and a worker's sessions, holdings and recent ends. It only reads etcd: the\n" +
			"leasehold-auditor role `leasehold roles` prints is enough. Stops on SIGINT or SIGTERM.\n\n" +
			"The console has no login of its own: anyone who can reach --listen sees what the etcd user\n" +
			"may read. Listen on loopback, or put it behind a proxy that authenticates.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if maxRows < 1 {
				return usagef("--max-rows must be at least 1, not %d", maxRows)
			}
			for _, p := range prefixes {
				if p == "" {
					return usagef("--prefix must not be empty")
				}
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return usageError{fmt.Errorf("--listen %s: %w", listen, err)}
			}
			defer ln.Close()
			return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				c, closeConsole, err := g.newConsole(ctx, cli, prefixes, maxRows)
				if err != nil {
					return err
				}
				defer closeConsole()
				if host, _, _ := net.SplitHostPort(ln.Addr().String()); !isLoopback(host) {
					fmt.Fprintf(g.errOut, "warning: the console listens on %s, beyond this host, with no login of its own\n", ln.Addr())
				}
				fmt.Fprintf(g.out, "console of namespace %s at http://%s/ (Ctrl-C stops it)\n", g.namespace, ln.Addr())
				srv := &http.Server{Handler: c.handler(), ReadHeaderTimeout: 10 * time.Second}
				done := make(chan error, 1)
				go func() { done <- srv.Serve(ln) }()
				select {
				case err := <-done:
					return err
				case <-ctx.Done():
				}
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx) // the streams end with ctx; Shutdown waits for them
				if err := <-done; !errors.Is(err, http.ErrServerClosed) {
					return err
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:7380", "address to serve the console on (host:port)")
	f.StringSliceVar(&prefixes, "prefix", nil, "a worker.Prefix's etcd prefix whose backlog the overview shows (repeatable)")
	f.IntVar(&maxRows, "max-rows", 500, "most rows a table shows; the holders page filters with its search box")
	return cmd
}

// newConsole starts the console's audit stream under ctx and returns the
// console and the call that stops it.
func (g *globals) newConsole(ctx context.Context, cli *clientv3.Client, prefixes []string, maxRows int) (*console, func(), error) {
	log, closeLog, err := g.auditLog(cli)
	if err != nil {
		return nil, nil, err
	}
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(g.namespace), lease.WithLogger(g.log))
	if err != nil {
		closeLog()
		return nil, nil, err
	}
	c := &console{g: g, cli: cli, reg: reg, log: log, sp: g.space(), prefixes: prefixes, maxRows: maxRows, pages: map[string]*template.Template{}}
	funcs := template.FuncMap{"stamp": stamp, "age": age,
		"short": func(s string) string { return truncate(s, 80) },
		"current": func(epoch *int64) string {
			if epoch == nil {
				return ""
			}
			return current(*epoch)
		}}
	for _, p := range consolePages {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(uiFiles, "ui/layout.html", "ui/"+p+".html")
		if err != nil {
			_ = reg.Close()
			closeLog()
			return nil, nil, err
		}
		c.pages[p] = t
	}
	sctx, cancel := context.WithCancel(ctx)
	c.stream, err = startAuditStream(sctx, cli, c.sp, log)
	if err != nil {
		cancel()
		_ = reg.Close()
		closeLog()
		return nil, nil, err
	}
	return c, func() { cancel(); c.stream.wait(); _ = reg.Close(); closeLog() }, nil
}

// handler routes the console's pages. Only GET and HEAD are served, and
// only to a Host naming loopback or the console's own address, so a page
// on another site cannot read the console through a DNS name rebound to
// 127.0.0.1.
func (c *console) handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(uiFiles, "ui/static")
	mux.Handle("/static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("/{$}", c.page("overview", c.overview))
	mux.HandleFunc("/holders", c.page("holders", c.holders))
	mux.HandleFunc("/audit", c.page("audit", c.auditPage))
	mux.HandleFunc("/resource", c.page("resource", c.resource))
	mux.HandleFunc("/worker", c.page("worker", c.worker))
	mux.HandleFunc("/events", c.events)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the console is read-only", http.StatusMethodNotAllowed)
			return
		}
		if !allowedHost(r.Host) {
			http.Error(w, "unexpected Host header", http.StatusMisdirectedRequest)
			return
		}
		h := w.Header()
		// Defence in depth behind the escaping: no inline script runs, and
		// nothing loads from elsewhere.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		mux.ServeHTTP(w, r)
	})
}

// allowedHost reports whether a request's Host is a loopback name or
// address (any port), or an IP address: a rebound DNS name is neither.
func allowedHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	host = strings.Trim(host, "[]")
	return host == "localhost" || strings.HasSuffix(host, ".localhost") || net.ParseIP(host) != nil
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// pageData is what every page's layout shows; Body is the page's own.
type pageData struct {
	Title     string
	Nav       string
	Namespace string
	Now       time.Time
	Body      any
	Error     string // the page's read failed: shown instead of Body
}

// page renders a page from what load reads. A read that fails is shown on
// the page (502): etcd is down, or the user may not read it.
func (c *console) page(name string, load func(ctx context.Context, r *http.Request) (string, any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), c.g.cmdTimeout)
		defer cancel()
		title, body, err := load(ctx, r)
		data := pageData{Title: title, Nav: name, Namespace: c.g.namespace, Now: time.Now(), Body: body}
		status := http.StatusOK
		if err != nil {
			var nf notFound
			status = http.StatusBadGateway
			if errors.As(err, &nf) {
				status = http.StatusNotFound
			}
			data.Title, data.Body, data.Error = "error", nil, err.Error()
		}
		var buf bytes.Buffer
		if err := c.pages[name].ExecuteTemplate(&buf, "layout.html", data); err != nil {
			http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write(buf.Bytes())
	}
}

// notFound is a page about a name etcd knows nothing of.
type notFound struct{ what string }

func (n notFound) Error() string { return n.what }

// stamp is how pages show an instant: UTC, to the millisecond.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

// firstRows is at most n of rows, and how many were left out.
func firstRows[T any](rows []T, n int) ([]T, int) {
	if len(rows) <= n {
		return rows, 0
	}
	return slices.Clip(rows[:n]), len(rows) - n
}
