package store

// migrations[i] brings the schema from version i to version i+1. Append only: a
// released migration is never edited, so every database can be walked forward.
var migrations = []string{
	// 1: initial schema.
	`
CREATE TABLE runs (
	id            TEXT PRIMARY KEY,
	study         TEXT NOT NULL,
	study_path    TEXT NOT NULL DEFAULT '',
	study_file    BLOB,
	status        TEXT NOT NULL,
	status_reason TEXT NOT NULL DEFAULT '',
	started_ns    INTEGER NOT NULL,
	ended_ns      INTEGER NOT NULL DEFAULT 0,
	seed          INTEGER NOT NULL DEFAULT 0,
	owner_pid     INTEGER NOT NULL DEFAULT 0,
	owner_host    TEXT NOT NULL DEFAULT '',
	owner_boot    TEXT NOT NULL DEFAULT '',
	owner_start   INTEGER NOT NULL DEFAULT 0,
	substrate     TEXT NOT NULL DEFAULT '',
	baseline      TEXT NOT NULL DEFAULT '',
	provenance    TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX runs_started ON runs(started_ns);

CREATE TABLE meshes (
	run_id     TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
	idx        INTEGER NOT NULL,
	label      TEXT NOT NULL,
	profile    TEXT NOT NULL,
	options    TEXT NOT NULL DEFAULT '{}',
	enrollment TEXT,
	PRIMARY KEY (run_id, label)
);

CREATE TABLE configs (
	run_id    TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
	seq       INTEGER NOT NULL,
	name      TEXT NOT NULL,
	mesh      TEXT NOT NULL DEFAULT '',
	component TEXT NOT NULL DEFAULT '',
	sha256    TEXT NOT NULL,
	content   BLOB NOT NULL
);
CREATE INDEX configs_run ON configs(run_id, seq);

CREATE TABLE trials (
	id             INTEGER PRIMARY KEY,
	run_id         TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
	repeat         INTEGER NOT NULL,
	mesh           TEXT NOT NULL,
	experiment     TEXT NOT NULL,
	kind           TEXT NOT NULL,
	params         TEXT NOT NULL,
	warmup_ns      INTEGER NOT NULL DEFAULT 0,
	cooldown_ns    INTEGER NOT NULL DEFAULT 0,
	start_ns       INTEGER NOT NULL,
	end_ns         INTEGER NOT NULL,
	error          TEXT NOT NULL DEFAULT '',
	requests       INTEGER NOT NULL,
	errors         INTEGER NOT NULL,
	latency_hdr    TEXT NOT NULL DEFAULT '',
	service_hdr    TEXT NOT NULL DEFAULT '',
	status_codes   TEXT NOT NULL DEFAULT '{}',
	errors_by_kind TEXT NOT NULL DEFAULT '{}',
	generator      TEXT NOT NULL DEFAULT '{}',
	flags          TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX trials_run ON trials(run_id, id);

CREATE TABLE intervals (
	trial_id       INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
	idx            INTEGER NOT NULL,
	start_ns       INTEGER NOT NULL,
	duration_ns    INTEGER NOT NULL,
	requested_rate REAL NOT NULL,
	achieved_rate  REAL NOT NULL,
	count          INTEGER NOT NULL,
	errors         INTEGER NOT NULL,
	p50_us         INTEGER NOT NULL,
	p99_us         INTEGER NOT NULL,
	hdr            TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (trial_id, idx)
);

CREATE TABLE resource_samples (
	trial_id        INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
	seq             INTEGER NOT NULL,
	component       TEXT NOT NULL,
	role            TEXT NOT NULL DEFAULT '',
	pod             TEXT NOT NULL DEFAULT '',
	node            TEXT NOT NULL DEFAULT '',
	mesh            TEXT NOT NULL DEFAULT '',
	t_ns            INTEGER NOT NULL,
	cpu_user_s      REAL NOT NULL,
	cpu_sys_s       REAL NOT NULL,
	rss_bytes       INTEGER NOT NULL,
	pss_bytes       INTEGER NOT NULL,
	threads         INTEGER NOT NULL,
	voluntary_ctx   INTEGER NOT NULL,
	involuntary_ctx INTEGER NOT NULL,
	PRIMARY KEY (trial_id, seq)
);

CREATE TABLE proxy_stats (
	trial_id  INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
	seq       INTEGER NOT NULL,
	component TEXT NOT NULL,
	pod       TEXT NOT NULL DEFAULT '',
	mesh      TEXT NOT NULL DEFAULT '',
	t_ns      INTEGER NOT NULL,
	stats     TEXT NOT NULL,
	PRIMARY KEY (trial_id, seq)
);
`,
	// 2: network counters per pod interface (results.NetSample).
	`
CREATE TABLE net_samples (
	trial_id   INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
	seq        INTEGER NOT NULL,
	pod        TEXT NOT NULL,
	node       TEXT NOT NULL DEFAULT '',
	mesh       TEXT NOT NULL DEFAULT '',
	interface  TEXT NOT NULL,
	t_ns       INTEGER NOT NULL,
	rx_bytes   INTEGER NOT NULL,
	tx_bytes   INTEGER NOT NULL,
	rx_packets INTEGER NOT NULL,
	tx_packets INTEGER NOT NULL,
	rx_dropped INTEGER NOT NULL,
	tx_dropped INTEGER NOT NULL,
	PRIMARY KEY (trial_id, seq)
);
`,
	// 3: processes of the system under test that exited during a trial
	// (results.Fault) and the requests each service version served (results.VersionShare),
	// as JSON.
	`
ALTER TABLE trials ADD COLUMN faults TEXT NOT NULL DEFAULT '[]';
ALTER TABLE trials ADD COLUMN mix TEXT NOT NULL DEFAULT '[]';
`,
	// 4: a security trial's probe results (results.SecurityProbe), as JSON.
	`
ALTER TABLE trials ADD COLUMN security TEXT NOT NULL DEFAULT '[]';
`,
	// 5: latency kept apart for answered requests and for failures timed to their
	// failure (latency_hdr holds both from now on; '' in older rows, whose latency_hdr
	// holds the answered only), what completed inside the measured window
	// (results.WindowCount) and the evidence on a saturated target (results.Saturation),
	// as JSON ('null' in older rows).
	`
ALTER TABLE trials ADD COLUMN answered_hdr TEXT NOT NULL DEFAULT '';
ALTER TABLE trials ADD COLUMN failed_hdr TEXT NOT NULL DEFAULT '';
ALTER TABLE trials ADD COLUMN in_window TEXT NOT NULL DEFAULT 'null';
ALTER TABLE trials ADD COLUMN saturation TEXT NOT NULL DEFAULT 'null';
`,
	// 6: the saturation evidence counts the backlog, requests in flight or waiting
	// for a connection, where it counted those in flight only; older rows' figures
	// are in-flight counts, kept under the new names.
	`
UPDATE trials SET saturation = replace(replace(replace(saturation,
	'"in_flight_from"', '"backlog_from"'), '"in_flight_to"', '"backlog_to"'), '"in_flight_low"', '"backlog_low"')
	WHERE saturation != 'null';
`,
}
