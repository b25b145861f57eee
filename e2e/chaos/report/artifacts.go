package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// WriteArtifacts writes the seed, the fault log, the history, the
// workers' sessions, the violations and porcupine's visualisation of
// illegal partitions to a new folder, which it notes in r.OutDir.
func WriteArtifacts(r *checks.Result, cfg model.Config, ops []model.Op) error {
	dir := cfg.OutDir
	if dir == "" {
		dir = os.Getenv("LEASEHOLD_CHAOS_OUT")
	}
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", fmt.Sprintf("leasehold-chaos-%d-", cfg.Seed))
	} else {
		dir = filepath.Join(dir, fmt.Sprintf("seed-%d-%s-%s", cfg.Seed, controlName(cfg.Control), time.Now().Format("20060102-150405")))
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return err
	}
	r.OutDir = dir
	write := func(name string, fill func(*strings.Builder)) error {
		var b strings.Builder
		fill(&b)
		return os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644)
	}
	errs := []error{
		write("seed.txt", func(b *strings.Builder) {
			fmt.Fprintf(b, "seed %d\ncontrol %s\ncontended %v\nduration %v\n", cfg.Seed, controlName(cfg.Control), cfg.Contended, cfg.Duration)
		}),
		write("faults.log", func(b *strings.Builder) {
			fs := slices.Clone(r.Faults)
			slices.SortFunc(fs, func(a, b model.Fault) int { return model.CompareInt(a.Start, b.Start) })
			for _, f := range fs {
				fmt.Fprintln(b, f)
			}
		}),
		write("history.jsonl", func(b *strings.Builder) {
			enc := json.NewEncoder(b)
			for _, op := range ops {
				_ = enc.Encode(op)
			}
		}),
		write("sessions.jsonl", func(b *strings.Builder) {
			enc := json.NewEncoder(b)
			for _, sr := range r.Sessions {
				_ = enc.Encode(sr)
			}
		}),
		write("violations.txt", func(b *strings.Builder) {
			for _, v := range r.Violations {
				fmt.Fprintln(b, v)
			}
		}),
		write("summary.txt", func(b *strings.Builder) { b.WriteString(r.Summary()) }),
		write("recipes.jsonl", func(b *strings.Builder) {
			enc := json.NewEncoder(b)
			for _, op := range r.RecipeOps {
				_ = enc.Encode(op)
			}
		}),
	}
	if r.Fleet != nil {
		errs = append(errs, write("fleet-takeovers.jsonl", func(b *strings.Builder) {
			enc := json.NewEncoder(b)
			for _, t := range r.Fleet.Takeovers {
				_ = enc.Encode(t)
			}
		}))
	}
	if _, err := r.Porcupine.Visualize(dir, 10); err != nil {
		errs = append(errs, err)
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func controlName(c model.Control) string {
	if c == model.ControlNone {
		return "none"
	}
	return string(c)
}
