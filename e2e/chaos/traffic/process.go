package traffic

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/etcdclient"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// Helper processes are the test binary (or any binary whose main calls
// RunWorkerProcess first) started with these variables set.
const (
	workerEnv = "LEASEHOLD_CHAOS_WORKER"
	configEnv = "LEASEHOLD_CHAOS_WORKER_CONFIG"
)

// IsWorkerProcess reports whether this process was started as a chaos
// helper worker. TestMain calls it first:
//
//	func TestMain(m *testing.M) {
//		if chaos.IsWorkerProcess() {
//			os.Exit(chaos.RunWorkerProcess())
//		}
//		goleak.VerifyTestMain(m)
//	}
func IsWorkerProcess() bool { return os.Getenv(workerEnv) == "1" }

// RunWorkerProcess runs a helper worker until its stdin is closed, writing
// its history to stdout as JSON lines, and returns the exit code.
func RunWorkerProcess() int {
	var cfg WorkerConfig
	if err := json.Unmarshal([]byte(os.Getenv(configEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "chaos worker: bad %s: %v\n", configEnv, err)
		return 2
	}
	cli, err := newWorkerClient(cfg.Endpoints)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos worker %s: %v\n", cfg.Name, err)
		return 1
	}
	defer cli.Close()
	skewClock(cli, cfg.ClockSkew)
	sink := &model.LineSink{Out: os.Stdout}
	w, err := NewWorker(cfg, cli, sink.Emit)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos worker %s: %v\n", cfg.Name, err)
		return 1
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		// The parent closes stdin to stop the worker; a parent that died
		// closes it too (and Pdeathsig kills a stopped child).
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	w.run(ctx)
	return 0
}

// newWorkerClient is a worker's client: the one package etcdclient
// recommends (keepalive, dial timeout, quiet logs), to every member — each
// through the worker's own proxy, so that the balancer has a next member
// for a retry — with dialOptions, and without auto-sync, which would
// replace the proxies with the members' own URLs and take the worker out
// of reach of its faults.
func newWorkerClient(endpoints []string) (*clientv3.Client, error) {
	cfg, err := etcdclient.Config(endpoints, etcdclient.WithAutoSync(0), etcdclient.WithDialOptions(DialOptions...))
	if err != nil {
		return nil, err
	}
	return clientv3.New(cfg)
}

// DialOptions make every client of a run reconnect soon after a fault
// heals: by default gRPC backs off for up to two minutes between attempts
// and gives one attempt 20 s, so a worker whose member was down or whose
// proxy was blackholed would sit out much of the run.
var DialOptions = []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 2 * time.Second,
})}

// helperProc is the parent's handle on a helper process.
type helperProc struct {
	name     string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	stderr   string        // path of the file receiving the child's stderr
	readDone chan struct{} // closed when the child's stdout reached EOF

	mu     sync.Mutex
	exited bool
	err    error // from Wait
}

// startHelper starts a helper process for cfg, recording its history in h.
func startHelper(cfg WorkerConfig, h *model.History, dir string) (*helperProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), workerEnv+"=1", configEnv+"="+string(b))
	// Killed with the parent, even while stopped by SIGSTOP.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	errPath := filepath.Join(dir, cfg.Name+".stderr")
	errFile, err := os.Create(errPath)
	if err != nil {
		return nil, err
	}
	defer errFile.Close() // the child has its own descriptor
	cmd.Stderr = errFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start helper %s: %w", cfg.Name, err)
	}
	p := &helperProc{name: cfg.Name, cmd: cmd, stdin: stdin, stderr: errPath, readDone: make(chan struct{})}
	go func() {
		defer close(p.readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var ev model.Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				h.Unreadable(fmt.Sprintf("%s: unreadable line %q", cfg.Name, model.Truncate(sc.Text(), 200)))
				continue
			}
			h.Record(ev)
		}
	}()
	return p, nil
}

// Name is the process's worker name, <slot>.<generation>.
func (p *helperProc) Name() string { return p.name }

// Signal sends sig to the process.
func (p *helperProc) Signal(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
}

// wait reaps the process once its stdout is drained (Wait closes the pipe,
// so reading must be finished first).
func (p *helperProc) wait() error {
	<-p.readDone
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		p.exited = true
		p.err = p.cmd.Wait()
	}
	return p.err
}

// Kill SIGKILLs the process and reaps it; a reaped process is left alone.
func (p *helperProc) Kill() {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if !exited {
		p.Signal(syscall.SIGKILL)
	}
	_ = p.wait()
}

// Stop asks the process to finish (closes its stdin) and reaps it; after
// timeout it is killed, and Stop reports that.
func (p *helperProc) Stop(timeout time.Duration) error {
	p.Signal(syscall.SIGCONT)
	_ = p.stdin.Close()
	select {
	case <-p.readDone:
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("helper %s did not stop within %v and was killed (stderr: %s)", p.name, timeout, p.stderr)
	}
	if err := p.wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("helper %s exited with %v (stderr: %s)%s", p.name, err, p.stderr, tail(p.stderr))
		}
		return err
	}
	return nil
}

// tail returns the end of a file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return ":\n" + string(b)
}
