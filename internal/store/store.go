// Package store keeps meshmark results in a SQLite database (modernc.org/sqlite, pure
// Go). It owns the schema and its migrations, the durability rules and the mapping
// between the tables and the results model.
//
// Durability: the database runs in WAL mode with synchronous=FULL. WAL alone already
// makes every committed transaction survive a crash of the writing process (kill -9),
// because the commit is in the WAL file before COMMIT returns; NORMAL would only risk
// losing the last commits on power loss or an OS crash. meshmark commits once per
// trial (seconds to minutes apart), so the extra fsync per commit that FULL costs is
// negligible and buys survival of power loss too. Every trial is written in its own
// transaction as it finishes; a run is therefore never half-written: it has exactly the
// trials that committed, and a run whose owner died is reported as incomplete.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/meshmark/meshmark/internal/results"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// EnvDB overrides the default database path.
const EnvDB = "MESHMARK_DB"

// ErrNotFound is returned when a run reference matches no run.
var ErrNotFound = errors.New("no such run")

// DefaultPath is $MESHMARK_DB, else $XDG_DATA_HOME/meshmark/results.db, else
// ~/.local/share/meshmark/results.db.
func DefaultPath() (string, error) {
	if p := os.Getenv(EnvDB); p != "" {
		return p, nil
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "meshmark", "results.db"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("results database: no %s, XDG_DATA_HOME or home directory: %w", EnvDB, err)
	}
	return filepath.Join(home, ".local", "share", "meshmark", "results.db"), nil
}

// Store is an open results database. It is safe for concurrent use, also by several
// processes on the same file.
type Store struct {
	db   *sql.DB
	path string
	self owner
	// abandoned are the runs Open found with a dead owner and marked incomplete.
	abandoned []string
}

// Open opens (creating if needed) the database at path, migrates it to the current
// schema and marks runs whose owner process is dead as incomplete. An empty path means
// DefaultPath().
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		var err error
		if path, err = DefaultPath(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("results database %s: %w", path, err)
	}
	q := url.Values{}
	for _, p := range []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(FULL)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	// Write transactions take the write lock up front, so two writers queue on the
	// busy timeout instead of failing with SQLITE_BUSY on lock upgrade.
	q.Set("_txlock", "immediate")
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("results database %s: %w", path, err)
	}
	s := &Store{db: db, path: path, self: currentOwner()}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("results database %s: %w", path, err)
	}
	if s.abandoned, err = s.MarkAbandoned(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("results database %s: %w", path, err)
	}
	return s, nil
}

// Abandoned lists the runs Open marked incomplete because their owner had died.
func (s *Store) Abandoned() []string { return s.abandoned }

// Path is the database file.
func (s *Store) Path() string { return s.path }

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// SchemaVersion is the schema version this build writes.
func SchemaVersion() int { return len(migrations) }

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	var v int
	err = tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version(version) VALUES (0)`); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	case err != nil:
		return fmt.Errorf("schema: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this meshmark understands (%d); use a newer meshmark", v, len(migrations))
	}
	for ; v < len(migrations); v++ {
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			return fmt.Errorf("schema migration %d→%d: %w", v, v+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, v); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	return tx.Commit()
}

func newRunID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("store: marshal %T: %v", v, err)) // only plain data types reach here
	}
	return string(b)
}

// CreateRun stores a new run with its meshes and generated configs, owned by the
// calling process and in status running. It fills run.ID (when empty), Status,
// Started (when zero), OwnerPID and OwnerHost.
func (s *Store) CreateRun(ctx context.Context, run *results.Run) error {
	if run.ID == "" {
		run.ID = newRunID()
	}
	if run.Study == "" {
		return errors.New("create run: study name is empty")
	}
	if run.Started.IsZero() {
		run.Started = time.Now().UTC()
	}
	seen := map[string]bool{}
	for _, m := range run.Meshes {
		if m.Label == "" {
			return fmt.Errorf("create run: mesh with profile %q has no label", m.Profile)
		}
		if seen[m.Label] {
			return fmt.Errorf("create run: mesh label %q appears twice", m.Label)
		}
		seen[m.Label] = true
	}
	run.Status = results.StatusRunning
	run.OwnerPID, run.OwnerHost = s.self.pid, s.self.host
	prov := run.Provenance
	prov.Configs = nil // stored in their own table
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create run: %w", err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT INTO runs (id, study, study_path, study_file, status, started_ns, seed,
		owner_pid, owner_host, owner_boot, owner_start, substrate, baseline, provenance)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		run.ID, run.Study, run.StudyPath, run.StudyFile, string(run.Status), unixNano(run.Started), run.Seed,
		s.self.pid, s.self.host, s.self.boot, s.self.start, run.Substrate, run.Baseline, mustJSON(prov))
	if err != nil {
		return fmt.Errorf("create run %s: %w", run.ID, err)
	}
	for i, m := range run.Meshes {
		if err := insertMesh(ctx, tx, run.ID, i, m); err != nil {
			return err
		}
	}
	for i := range run.Provenance.Configs {
		if err := insertConfig(ctx, tx, run.ID, i, &run.Provenance.Configs[i]); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create run %s: %w", run.ID, err)
	}
	return nil
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func insertMesh(ctx context.Context, tx execer, runID string, idx int, m results.Mesh) error {
	var enrollment any
	if len(m.Enrollment) > 0 {
		enrollment = string(m.Enrollment)
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO meshes (run_id, idx, label, profile, options, enrollment) VALUES (?,?,?,?,?,?)`,
		runID, idx, m.Label, m.Profile, mustJSON(m.Options), enrollment)
	if err != nil {
		return fmt.Errorf("run %s: mesh %q: %w", runID, m.Label, err)
	}
	return nil
}

func insertConfig(ctx context.Context, tx execer, runID string, seq int, c *results.GeneratedConfig) error {
	c.SHA256 = results.SHA256Hex(c.Content)
	content := c.Content
	if content == nil {
		content = []byte{}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO configs (run_id, seq, name, mesh, component, sha256, content) VALUES (?,?,?,?,?,?,?)`,
		runID, seq, c.Name, c.Mesh, c.Component, c.SHA256, content)
	if err != nil {
		return fmt.Errorf("run %s: config %q: %w", runID, c.Name, err)
	}
	return nil
}

// AddMesh adds a mesh to an existing run (for runners that learn meshes as they go).
func (s *Store) AddMesh(ctx context.Context, runID string, m results.Mesh) error {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM meshes WHERE run_id = ?`, runID).Scan(&n); err != nil {
		return fmt.Errorf("run %s: %w", runID, err)
	}
	return insertMesh(ctx, s.db, runID, n, m)
}

// SetEnrollment stores the equivalence check of one mesh (JSON).
func (s *Store) SetEnrollment(ctx context.Context, runID, mesh string, check json.RawMessage) error {
	if !json.Valid(check) {
		return fmt.Errorf("run %s: mesh %q: enrollment check is not valid JSON", runID, mesh)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE meshes SET enrollment = ? WHERE run_id = ? AND label = ?`, string(check), runID, mesh)
	if err != nil {
		return fmt.Errorf("run %s: mesh %q: %w", runID, mesh, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("run %s: no mesh %q", runID, mesh)
	}
	return nil
}

// AddConfigs stores generated configuration files (their SHA-256 is filled in).
func (s *Store) AddConfigs(ctx context.Context, runID string, configs ...results.GeneratedConfig) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM configs WHERE run_id = ?`, runID).Scan(&n); err != nil {
		return fmt.Errorf("run %s: %w", runID, err)
	}
	for i := range configs {
		if err := insertConfig(ctx, tx, runID, n+i, &configs[i]); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// SetProvenance replaces the run's provenance (configs excluded: see AddConfigs).
func (s *Store) SetProvenance(ctx context.Context, runID string, p results.Provenance) error {
	p.Configs = nil
	res, err := s.db.ExecContext(ctx, `UPDATE runs SET provenance = ? WHERE id = ?`, mustJSON(p), runID)
	if err != nil {
		return fmt.Errorf("run %s: provenance: %w", runID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("run %s: %w", runID, ErrNotFound)
	}
	return nil
}

// AddTrial stores one finished trial with everything it measured, in one transaction,
// and sets trial.ID. Interval P50/P99 are computed from the interval histograms.
func (s *Store) AddTrial(ctx context.Context, runID string, trial *results.Trial) error {
	if trial.Mesh == "" || trial.Experiment == "" {
		return fmt.Errorf("run %s: trial needs a mesh and an experiment (got mesh %q, experiment %q)", runID, trial.Mesh, trial.Experiment)
	}
	r := &trial.Result
	lat, err := results.EncodeHistogram(r.Latency)
	if err != nil {
		return err
	}
	svc, err := results.EncodeHistogram(r.ServiceTime)
	if err != nil {
		return err
	}
	answered, err := results.EncodeHistogram(r.AnsweredLatency)
	if err != nil {
		return err
	}
	failed, err := results.EncodeHistogram(r.FailedLatency)
	if err != nil {
		return err
	}
	if r.Generator.SendLag != nil {
		r.Generator.SendLagP99 = r.Generator.SendLag.ValueAtQuantile(99)
	}
	gen, err := json.Marshal(r.Generator)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("run %s: add trial: %w", runID, err)
	}
	defer tx.Rollback()
	var status string
	if err := tx.QueryRowContext(ctx, `SELECT status FROM runs WHERE id = ?`, runID).Scan(&status); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("run %s: %w", runID, ErrNotFound)
		}
		return fmt.Errorf("run %s: add trial: %w", runID, err)
	}
	if status != string(results.StatusRunning) {
		return fmt.Errorf("run %s is %s; trials can only be added to a running run", runID, status)
	}
	flags := r.Flags
	if flags == nil {
		flags = []string{}
	}
	faults := r.Faults
	if faults == nil {
		faults = []results.Fault{}
	}
	mix := r.Mix
	if mix == nil {
		mix = []results.VersionShare{}
	}
	security := r.Security
	if security == nil {
		security = []results.SecurityProbe{}
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO trials (run_id, repeat, mesh, experiment, kind, params, warmup_ns, cooldown_ns,
		start_ns, end_ns, error, requests, errors, latency_hdr, service_hdr, status_codes, errors_by_kind, generator, flags, faults, mix, security,
		answered_hdr, failed_hdr, in_window, saturation)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		runID, trial.Repeat, trial.Mesh, trial.Experiment, trial.Kind, mustJSON(trial.Params),
		int64(trial.WarmupTrimmed), int64(trial.CooldownTrimmed), unixNano(trial.Start), unixNano(trial.End), trial.Error,
		r.Requests, r.Errors, lat, svc, mustJSON(r.StatusCodes), mustJSON(r.ErrorsByKind), string(gen), mustJSON(flags), mustJSON(faults), mustJSON(mix), mustJSON(security),
		answered, failed, mustJSON(r.Window), mustJSON(r.Saturation))
	if err != nil {
		return fmt.Errorf("run %s: add trial: %w", runID, err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return err
	}
	for i := range r.Intervals {
		iv := &r.Intervals[i]
		if iv.Histogram != nil {
			iv.P50, iv.P99 = iv.Histogram.ValueAtQuantile(50), iv.Histogram.ValueAtQuantile(99)
		}
		h, err := results.EncodeHistogram(iv.Histogram)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO intervals VALUES (?,?,?,?,?,?,?,?,?,?,?)`,
			id, i, unixNano(iv.Start), int64(iv.Duration), iv.RequestedRate, iv.AchievedRate, iv.Count, iv.Errors, iv.P50, iv.P99, h); err != nil {
			return fmt.Errorf("run %s: trial interval %d: %w", runID, i, err)
		}
	}
	for i, rs := range r.Resources {
		if _, err := tx.ExecContext(ctx, `INSERT INTO resource_samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			id, i, rs.Component, rs.Role, rs.Pod, rs.Node, rs.Mesh, unixNano(rs.T), rs.CPUUserSeconds, rs.CPUSysSeconds,
			rs.RSSBytes, rs.PSSBytes, rs.Threads, rs.VoluntaryCtx, rs.InvoluntaryCtx); err != nil {
			return fmt.Errorf("run %s: trial resource sample %d: %w", runID, i, err)
		}
	}
	for i, ps := range r.ProxyStats {
		stats := string(ps.Stats)
		if stats == "" {
			stats = "null"
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO proxy_stats VALUES (?,?,?,?,?,?,?)`,
			id, i, ps.Component, ps.Pod, ps.Mesh, unixNano(ps.T), stats); err != nil {
			return fmt.Errorf("run %s: trial proxy stats %d: %w", runID, i, err)
		}
	}
	for i, ns := range r.Network {
		if _, err := tx.ExecContext(ctx, `INSERT INTO net_samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			id, i, ns.Pod, ns.Node, ns.Mesh, ns.Interface, unixNano(ns.T), ns.RxBytes, ns.TxBytes,
			ns.RxPackets, ns.TxPackets, ns.RxDropped, ns.TxDropped); err != nil {
			return fmt.Errorf("run %s: trial network sample %d: %w", runID, i, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("run %s: add trial: %w", runID, err)
	}
	trial.ID = id
	return nil
}

// FlagTrials adds a flag to stored trials of a running run (the runner marks the
// trials of an attempt a fault cut short as results.FlagSuperseded).
func (s *Store) FlagTrials(ctx context.Context, runID, flag string, ids ...int64) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("run %s: flag trials: %w", runID, err)
	}
	defer tx.Rollback()
	for _, id := range ids {
		var raw string
		if err := tx.QueryRowContext(ctx, `SELECT flags FROM trials WHERE run_id = ? AND id = ?`, runID, id).Scan(&raw); err != nil {
			return fmt.Errorf("run %s: flag trial %d: %w", runID, id, err)
		}
		var flags []string
		if err := json.Unmarshal([]byte(raw), &flags); err != nil {
			return fmt.Errorf("run %s: trial %d: flags: %w", runID, id, err)
		}
		if slices.Contains(flags, flag) {
			continue
		}
		flags = append(flags, flag)
		if _, err := tx.ExecContext(ctx, `UPDATE trials SET flags = ? WHERE id = ?`, mustJSON(flags), id); err != nil {
			return fmt.Errorf("run %s: flag trial %d: %w", runID, id, err)
		}
	}
	return tx.Commit()
}

// FinishRun closes a run with a final status (complete, incomplete or failed) and a
// reason (an error message, "interrupted", ...).
func (s *Store) FinishRun(ctx context.Context, runID string, status results.Status, reason string) error {
	if !status.Valid() || status == results.StatusRunning {
		return fmt.Errorf("finish run %s: invalid final status %q", runID, status)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE runs SET status = ?, status_reason = ?, ended_ns = ? WHERE id = ?`,
		string(status), reason, time.Now().UnixNano(), runID)
	if err != nil {
		return fmt.Errorf("finish run %s: %w", runID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("finish run %s: %w", runID, ErrNotFound)
	}
	return nil
}

// MarkAbandoned marks every running run whose owner process is gone as incomplete and
// returns their ids. Open calls it (see Abandoned).
func (s *Store) MarkAbandoned(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, owner_pid, owner_host, owner_boot, owner_start FROM runs WHERE status = ?`, string(results.StatusRunning))
	if err != nil {
		return nil, err
	}
	var dead []string
	for rows.Next() {
		var id string
		var o owner
		if err := rows.Scan(&id, &o.pid, &o.host, &o.boot, &o.start); err != nil {
			rows.Close()
			return nil, err
		}
		if !o.alive(s.self) {
			dead = append(dead, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, id := range dead {
		// The end time is that of the last committed trial: the best evidence of when
		// the owner stopped.
		_, err := s.db.ExecContext(ctx, `UPDATE runs SET status = ?, status_reason = ?,
			ended_ns = COALESCE((SELECT MAX(end_ns) FROM trials WHERE run_id = runs.id), started_ns)
			WHERE id = ? AND status = ?`,
			string(results.StatusIncomplete), "owner process died before finishing the run", id, string(results.StatusRunning))
		if err != nil {
			return nil, fmt.Errorf("mark run %s incomplete: %w", id, err)
		}
	}
	return dead, nil
}

// DeleteRun removes a run and everything it holds.
func (s *Store) DeleteRun(ctx context.Context, runID string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM runs WHERE id = ?`, runID)
	if err != nil {
		return fmt.Errorf("delete run %s: %w", runID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("delete run %s: %w", runID, ErrNotFound)
	}
	return nil
}

// RunSummary is one line of `meshmark ls`.
type RunSummary struct {
	ID           string
	Study        string
	Status       results.Status
	StatusReason string
	Started      time.Time
	Ended        time.Time
	Meshes       []string
	Experiments  []string
	Trials       int
}

// ListRuns returns every run, newest first.
func (s *Store) ListRuns(ctx context.Context) ([]RunSummary, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT r.id, r.study, r.status, r.status_reason, r.started_ns, r.ended_ns,
		COALESCE((SELECT group_concat(label, char(31)) FROM (SELECT label FROM meshes WHERE run_id = r.id ORDER BY idx)), ''),
		COALESCE((SELECT group_concat(experiment, char(31)) FROM (SELECT DISTINCT experiment FROM trials WHERE run_id = r.id ORDER BY experiment)), ''),
		(SELECT COUNT(*) FROM trials WHERE run_id = r.id)
		FROM runs r ORDER BY r.started_ns DESC, r.id`)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	defer rows.Close()
	var out []RunSummary
	for rows.Next() {
		var rs RunSummary
		var status, meshes, exps string
		var started, ended int64
		if err := rows.Scan(&rs.ID, &rs.Study, &status, &rs.StatusReason, &started, &ended, &meshes, &exps, &rs.Trials); err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		rs.Status, rs.Started, rs.Ended = results.Status(status), fromNano(started), fromNano(ended)
		rs.Meshes, rs.Experiments = splitUnit(meshes), splitUnit(exps)
		out = append(out, rs)
	}
	return out, rows.Err()
}

func splitUnit(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\x1f")
}

// ResolveRun turns a reference into a run id: "last" (the most recently started run),
// a full id or a unique id prefix.
func (s *Store) ResolveRun(ctx context.Context, ref string) (string, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return "", errors.New("empty run reference (give a run id, a unique prefix or \"last\")")
	}
	if ref == "last" {
		var id string
		err := s.db.QueryRowContext(ctx, `SELECT id FROM runs ORDER BY started_ns DESC, id DESC LIMIT 1`).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return "", fmt.Errorf("run \"last\": the database %s holds no runs: %w", s.path, ErrNotFound)
		}
		return id, err
	}
	escaped := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(ref)
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM runs WHERE id LIKE ? ESCAPE '\' ORDER BY id LIMIT 6`, escaped+"%")
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return "", err
		}
		if id == ref {
			return id, nil
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("run %q: %w in %s", ref, ErrNotFound, s.path)
	case 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("run %q is ambiguous: matches %s", ref, strings.Join(ids, ", "))
}
