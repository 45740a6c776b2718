// Package report owns meshmark's reports: it turns a stored run and its analysis into
// one analysed Summary and renders it as a self-contained HTML page (charts by an
// embedded copy of Apache ECharts, no network), GitHub-flavoured Markdown, JSON, CSV,
// or an export in the Service Mesh Performance (SMP) specification's shape.
package report

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/meshmark/meshmark/internal/analysis"
	"github.com/meshmark/meshmark/internal/cost"
	"github.com/meshmark/meshmark/internal/results"
)

// Format is an output format.
type Format string

const (
	HTML     Format = "html"
	Markdown Format = "md"
	JSON     Format = "json"
	CSV      Format = "csv"
	SMP      Format = "smp"
)

// Formats lists every format, in the order Write produces them by default.
var Formats = []Format{HTML, Markdown, JSON, CSV, SMP}

// ParseFormat accepts a format name (also "markdown" and "htm").
func ParseFormat(s string) (Format, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "html", "htm":
		return HTML, nil
	case "md", "markdown":
		return Markdown, nil
	case "json":
		return JSON, nil
	case "csv":
		return CSV, nil
	case "smp":
		return SMP, nil
	}
	return "", fmt.Errorf("unknown report format %q (want html, md, json, csv or smp)", s)
}

// FileName is the file a format is written to inside a report directory.
func (f Format) FileName() string {
	switch f {
	case Markdown:
		return "report.md"
	case SMP:
		return "report.smp.json"
	}
	return "report." + string(f)
}

// Options tune rendering. The zero value means the defaults.
type Options struct {
	// Prices is the price table the overhead is priced with; nil means cost.Default().
	Prices *cost.Table
	// Instance is the instance type of Prices to price on; empty means DefaultInstance.
	Instance string
	// MeshmarkVersion is written into the SMP export's load generator; empty means the
	// version recorded in the run's provenance.
	MeshmarkVersion string
}

// Render writes one format of the report of run to w. an is the run's analysis; nil
// analyses the run here with the default options and SLO.
func Render(w io.Writer, f Format, run *results.Run, an *analysis.Report, opts Options) error {
	if run == nil {
		return fmt.Errorf("report: no run")
	}
	return render(w, f, run, Summarize(run, an, opts), opts)
}

// render writes one format of an analysed summary of run.
func render(w io.Writer, f Format, run *results.Run, s *Summary, opts Options) error {
	switch f {
	case HTML:
		return renderHTML(w, s)
	case Markdown:
		return renderMarkdown(w, s)
	case JSON:
		return renderJSON(w, s)
	case CSV:
		return renderCSV(w, s)
	case SMP:
		return renderSMP(w, run, s, opts)
	}
	return fmt.Errorf("report: unknown format %q", f)
}

// Write renders the given formats (all of Formats when none are given) of run into
// dir, creating it, and returns the paths written, HTML first. Each file is written
// to a temporary name and renamed, so a reader never sees half a report.
func Write(ctx context.Context, run *results.Run, an *analysis.Report, dir string, opts Options, formats ...Format) ([]string, error) {
	if len(formats) == 0 {
		formats = Formats
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if an == nil {
		an = analysis.Analyze(run, analysis.Options{Seed: uint64(run.Seed)}, nil)
	}
	var paths []string
	// One summary for every format: the answer's rankings cost a comparison each.
	s := Summarize(run, an, opts)
	for _, f := range formats {
		if err := ctx.Err(); err != nil {
			return paths, err
		}
		var buf bytes.Buffer
		if err := render(&buf, f, run, s, opts); err != nil {
			return paths, fmt.Errorf("report %s: %w", f, err)
		}
		path := filepath.Join(dir, f.FileName())
		if err := writeFileAtomic(path, buf.Bytes()); err != nil {
			return paths, fmt.Errorf("report %s: %w", f, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
