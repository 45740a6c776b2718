package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/meshmark/meshmark/internal/results"
)

// LoadRun reads a whole run (meshes, configs, every trial with its histograms,
// intervals, resource and network samples and proxy stats). ref is resolved like ResolveRun.
func (s *Store) LoadRun(ctx context.Context, ref string) (*results.Run, error) {
	id, err := s.ResolveRun(ctx, ref)
	if err != nil {
		return nil, err
	}
	run := &results.Run{ID: id}
	var status, prov string
	var started, ended int64
	err = s.db.QueryRowContext(ctx, `SELECT study, study_path, study_file, status, status_reason, started_ns, ended_ns, seed,
		owner_pid, owner_host, substrate, baseline, provenance FROM runs WHERE id = ?`, id).Scan(
		&run.Study, &run.StudyPath, &run.StudyFile, &status, &run.StatusReason, &started, &ended, &run.Seed,
		&run.OwnerPID, &run.OwnerHost, &run.Substrate, &run.Baseline, &prov)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("run %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load run %s: %w", id, err)
	}
	run.Status, run.Started, run.Ended = results.Status(status), fromNano(started), fromNano(ended)
	if err := json.Unmarshal([]byte(prov), &run.Provenance); err != nil {
		return nil, fmt.Errorf("load run %s: provenance: %w", id, err)
	}
	if err := s.loadMeshes(ctx, run); err != nil {
		return nil, err
	}
	if err := s.loadConfigs(ctx, run); err != nil {
		return nil, err
	}
	if err := s.loadTrials(ctx, run); err != nil {
		return nil, err
	}
	return run, nil
}

func (s *Store) loadMeshes(ctx context.Context, run *results.Run) error {
	rows, err := s.db.QueryContext(ctx, `SELECT label, profile, options, enrollment FROM meshes WHERE run_id = ? ORDER BY idx`, run.ID)
	if err != nil {
		return fmt.Errorf("load run %s meshes: %w", run.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var m results.Mesh
		var opts string
		var enr sql.NullString
		if err := rows.Scan(&m.Label, &m.Profile, &opts, &enr); err != nil {
			return fmt.Errorf("load run %s meshes: %w", run.ID, err)
		}
		if err := json.Unmarshal([]byte(opts), &m.Options); err != nil {
			return fmt.Errorf("load run %s mesh %q options: %w", run.ID, m.Label, err)
		}
		if enr.Valid {
			m.Enrollment = json.RawMessage(enr.String)
		}
		run.Meshes = append(run.Meshes, m)
	}
	return rows.Err()
}

func (s *Store) loadConfigs(ctx context.Context, run *results.Run) error {
	rows, err := s.db.QueryContext(ctx, `SELECT name, mesh, component, sha256, content FROM configs WHERE run_id = ? ORDER BY seq`, run.ID)
	if err != nil {
		return fmt.Errorf("load run %s configs: %w", run.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var c results.GeneratedConfig
		if err := rows.Scan(&c.Name, &c.Mesh, &c.Component, &c.SHA256, &c.Content); err != nil {
			return fmt.Errorf("load run %s configs: %w", run.ID, err)
		}
		run.Provenance.Configs = append(run.Provenance.Configs, c)
	}
	return rows.Err()
}

func (s *Store) loadTrials(ctx context.Context, run *results.Run) error {
	rows, err := s.db.QueryContext(ctx, `SELECT id, repeat, mesh, experiment, kind, params, warmup_ns, cooldown_ns, start_ns, end_ns,
		error, requests, errors, latency_hdr, service_hdr, status_codes, errors_by_kind, generator, flags, faults, mix, security,
		answered_hdr, failed_hdr, in_window, saturation
		FROM trials WHERE run_id = ? ORDER BY id`, run.ID)
	if err != nil {
		return fmt.Errorf("load run %s trials: %w", run.ID, err)
	}
	byID := map[int64]int{}
	for rows.Next() {
		var t results.Trial
		var params, lat, svc, codes, kinds, gen, flags, faults, mix, security, answered, failed, window, saturation string
		var warm, cool, start, end int64
		if err := rows.Scan(&t.ID, &t.Repeat, &t.Mesh, &t.Experiment, &t.Kind, &params, &warm, &cool, &start, &end,
			&t.Error, &t.Result.Requests, &t.Result.Errors, &lat, &svc, &codes, &kinds, &gen, &flags, &faults, &mix, &security,
			&answered, &failed, &window, &saturation); err != nil {
			rows.Close()
			return fmt.Errorf("load run %s trials: %w", run.ID, err)
		}
		t.WarmupTrimmed, t.CooldownTrimmed = time.Duration(warm), time.Duration(cool)
		t.Start, t.End = fromNano(start), fromNano(end)
		where := fmt.Sprintf("run %s trial %d", run.ID, t.ID)
		for _, f := range []struct {
			name string
			src  string
			dst  any
		}{{"params", params, &t.Params}, {"status_codes", codes, &t.Result.StatusCodes},
			{"errors_by_kind", kinds, &t.Result.ErrorsByKind}, {"generator", gen, &t.Result.Generator}, {"flags", flags, &t.Result.Flags},
			{"faults", faults, &t.Result.Faults}, {"mix", mix, &t.Result.Mix}, {"security", security, &t.Result.Security},
			{"in_window", window, &t.Result.Window}, {"saturation", saturation, &t.Result.Saturation}} {
			if err := json.Unmarshal([]byte(f.src), f.dst); err != nil {
				rows.Close()
				return fmt.Errorf("%s: %s: %w", where, f.name, err)
			}
		}
		if t.Result.Latency, err = results.DecodeHistogram(lat); err != nil {
			rows.Close()
			return fmt.Errorf("%s: latency: %w", where, err)
		}
		if t.Result.ServiceTime, err = results.DecodeHistogram(svc); err != nil {
			rows.Close()
			return fmt.Errorf("%s: service time: %w", where, err)
		}
		if t.Result.AnsweredLatency, err = results.DecodeHistogram(answered); err != nil {
			rows.Close()
			return fmt.Errorf("%s: answered latency: %w", where, err)
		}
		if t.Result.FailedLatency, err = results.DecodeHistogram(failed); err != nil {
			rows.Close()
			return fmt.Errorf("%s: failed latency: %w", where, err)
		}
		t.Result.CompleteOld()
		byID[t.ID] = len(run.Trials)
		run.Trials = append(run.Trials, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(run.Trials) == 0 {
		return nil
	}
	if err := s.loadIntervals(ctx, run, byID); err != nil {
		return err
	}
	if err := s.loadResources(ctx, run, byID); err != nil {
		return err
	}
	if err := s.loadProxyStats(ctx, run, byID); err != nil {
		return err
	}
	return s.loadNetwork(ctx, run, byID)
}

func (s *Store) loadIntervals(ctx context.Context, run *results.Run, byID map[int64]int) error {
	rows, err := s.db.QueryContext(ctx, `SELECT i.trial_id, i.start_ns, i.duration_ns, i.requested_rate, i.achieved_rate, i.count,
		i.errors, i.p50_us, i.p99_us, i.hdr FROM intervals i JOIN trials t ON t.id = i.trial_id
		WHERE t.run_id = ? ORDER BY i.trial_id, i.idx`, run.ID)
	if err != nil {
		return fmt.Errorf("load run %s intervals: %w", run.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var tid, start, dur int64
		var iv results.Interval
		var h string
		if err := rows.Scan(&tid, &start, &dur, &iv.RequestedRate, &iv.AchievedRate, &iv.Count, &iv.Errors, &iv.P50, &iv.P99, &h); err != nil {
			return fmt.Errorf("load run %s intervals: %w", run.ID, err)
		}
		iv.Start, iv.Duration = fromNano(start), time.Duration(dur)
		if iv.Histogram, err = results.DecodeHistogram(h); err != nil {
			return fmt.Errorf("run %s trial %d interval: %w", run.ID, tid, err)
		}
		t := &run.Trials[byID[tid]]
		t.Result.Intervals = append(t.Result.Intervals, iv)
	}
	return rows.Err()
}

func (s *Store) loadResources(ctx context.Context, run *results.Run, byID map[int64]int) error {
	rows, err := s.db.QueryContext(ctx, `SELECT r.trial_id, r.component, r.role, r.pod, r.node, r.mesh, r.t_ns, r.cpu_user_s, r.cpu_sys_s,
		r.rss_bytes, r.pss_bytes, r.threads, r.voluntary_ctx, r.involuntary_ctx FROM resource_samples r JOIN trials t ON t.id = r.trial_id
		WHERE t.run_id = ? ORDER BY r.trial_id, r.seq`, run.ID)
	if err != nil {
		return fmt.Errorf("load run %s resource samples: %w", run.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var tid, ts int64
		var rs results.ResourceSample
		if err := rows.Scan(&tid, &rs.Component, &rs.Role, &rs.Pod, &rs.Node, &rs.Mesh, &ts, &rs.CPUUserSeconds, &rs.CPUSysSeconds,
			&rs.RSSBytes, &rs.PSSBytes, &rs.Threads, &rs.VoluntaryCtx, &rs.InvoluntaryCtx); err != nil {
			return fmt.Errorf("load run %s resource samples: %w", run.ID, err)
		}
		rs.T = fromNano(ts)
		t := &run.Trials[byID[tid]]
		t.Result.Resources = append(t.Result.Resources, rs)
	}
	return rows.Err()
}

func (s *Store) loadProxyStats(ctx context.Context, run *results.Run, byID map[int64]int) error {
	rows, err := s.db.QueryContext(ctx, `SELECT p.trial_id, p.component, p.pod, p.mesh, p.t_ns, p.stats FROM proxy_stats p
		JOIN trials t ON t.id = p.trial_id WHERE t.run_id = ? ORDER BY p.trial_id, p.seq`, run.ID)
	if err != nil {
		return fmt.Errorf("load run %s proxy stats: %w", run.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var tid, ts int64
		var ps results.ProxyStats
		var stats string
		if err := rows.Scan(&tid, &ps.Component, &ps.Pod, &ps.Mesh, &ts, &stats); err != nil {
			return fmt.Errorf("load run %s proxy stats: %w", run.ID, err)
		}
		ps.T, ps.Stats = fromNano(ts), json.RawMessage(stats)
		t := &run.Trials[byID[tid]]
		t.Result.ProxyStats = append(t.Result.ProxyStats, ps)
	}
	return rows.Err()
}

func (s *Store) loadNetwork(ctx context.Context, run *results.Run, byID map[int64]int) error {
	rows, err := s.db.QueryContext(ctx, `SELECT n.trial_id, n.pod, n.node, n.mesh, n.interface, n.t_ns, n.rx_bytes, n.tx_bytes,
		n.rx_packets, n.tx_packets, n.rx_dropped, n.tx_dropped FROM net_samples n JOIN trials t ON t.id = n.trial_id
		WHERE t.run_id = ? ORDER BY n.trial_id, n.seq`, run.ID)
	if err != nil {
		return fmt.Errorf("load run %s network samples: %w", run.ID, err)
	}
	defer rows.Close()
	for rows.Next() {
		var tid, ts int64
		var ns results.NetSample
		if err := rows.Scan(&tid, &ns.Pod, &ns.Node, &ns.Mesh, &ns.Interface, &ts, &ns.RxBytes, &ns.TxBytes,
			&ns.RxPackets, &ns.TxPackets, &ns.RxDropped, &ns.TxDropped); err != nil {
			return fmt.Errorf("load run %s network samples: %w", run.ID, err)
		}
		ns.T = fromNano(ts)
		t := &run.Trials[byID[tid]]
		t.Result.Network = append(t.Result.Network, ns)
	}
	return rows.Err()
}
