package store

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/meshmark/meshmark/internal/results"
)

// ExportFormat names of WriteExport.
const (
	FormatJSON = "json"
	FormatCSV  = "csv"
)

// JSONSchemaID identifies the layout of a JSON export.
const JSONSchemaID = "meshmark.run/v1"

// WriteExport writes a run as JSON (everything, histograms as HdrHistogram V2 base64)
// or CSV (one row per trial and one per interval).
func WriteExport(w io.Writer, run *results.Run, format string) error {
	switch format {
	case FormatJSON:
		return WriteJSON(w, run)
	case FormatCSV:
		return WriteCSV(w, run)
	}
	return fmt.Errorf("unknown export format %q (want json or csv)", format)
}

// WriteJSON writes the whole run. ReadJSON reads it back losslessly.
func WriteJSON(w io.Writer, run *results.Run) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Schema string       `json:"schema"`
		Run    *results.Run `json:"run"`
	}{JSONSchemaID, run})
}

// ReadJSON reads what WriteJSON wrote.
func ReadJSON(r io.Reader) (*results.Run, error) {
	var v struct {
		Schema string       `json:"schema"`
		Run    *results.Run `json:"run"`
	}
	if err := json.NewDecoder(r).Decode(&v); err != nil {
		return nil, fmt.Errorf("read run export: %w", err)
	}
	if v.Schema != JSONSchemaID {
		return nil, fmt.Errorf("read run export: schema %q, want %q", v.Schema, JSONSchemaID)
	}
	if v.Run == nil {
		return nil, fmt.Errorf("read run export: no run")
	}
	return v.Run, nil
}

// CSVHeader is the header row of WriteCSV.
var CSVHeader = []string{"run_id", "row", "trial_id", "repeat", "mesh", "experiment", "kind", "step", "requested_rate",
	"connections", "users", "interval", "start", "duration_s", "requests", "errors", "achieved_rate",
	"p50_us", "p90_us", "p99_us", "p999_us", "max_us", "error"}

// WriteCSV writes one "trial" row per trial followed by one "interval" row per
// interval of that trial. Percentiles come from the trial's or interval's histogram.
func WriteCSV(w io.Writer, run *results.Run) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	i64 := func(v int64) string { return strconv.FormatInt(v, 10) }
	pcts := func(h *hdrhistogram.Histogram) []string {
		if h == nil || h.TotalCount() == 0 {
			return []string{"", "", "", "", ""}
		}
		return []string{i64(h.ValueAtQuantile(50)), i64(h.ValueAtQuantile(90)), i64(h.ValueAtQuantile(99)),
			i64(h.ValueAtQuantile(99.9)), i64(h.ValueAtQuantile(100))}
	}
	for _, t := range run.Trials {
		p := t.Params
		head := []string{run.ID, "", i64(t.ID), strconv.Itoa(t.Repeat), t.Mesh, t.Experiment, t.Kind, strconv.Itoa(p.Step),
			f(p.RequestedRate), strconv.Itoa(p.Connections), strconv.Itoa(p.Users)}
		row := append(append([]string{}, head...), "", t.Start.UTC().Format(time.RFC3339Nano), f(t.Duration().Seconds()),
			i64(t.Result.Requests), i64(t.Result.Errors), f(t.Throughput()))
		row[1] = "trial"
		row = append(append(row, pcts(t.Result.Latency)...), t.Error)
		if err := cw.Write(row); err != nil {
			return err
		}
		for i, iv := range t.Result.Intervals {
			row := append(append([]string{}, head...), strconv.Itoa(i), iv.Start.UTC().Format(time.RFC3339Nano), f(iv.Duration.Seconds()),
				i64(iv.Count), i64(iv.Errors), f(iv.AchievedRate))
			row[1] = "interval"
			ps := pcts(iv.Histogram)
			if iv.Histogram == nil {
				ps[0], ps[2] = i64(iv.P50), i64(iv.P99)
			}
			row = append(append(row, ps...), "")
			if err := cw.Write(row); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}
