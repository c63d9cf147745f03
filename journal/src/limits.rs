//! Every bound of the runtime, named with its unit, in one place.
//!
//! The journal is the lowest crate, so the other crates read their limits from here
//! too: one file answers "how big can this get?". Nothing here is tunable at run time
//! unless a configuration field says so.

/// Appenders waiting for the committer at most; beyond it `append` waits (backpressure).
pub const APPEND_QUEUE_REQUESTS_MAX: usize = 4096;
/// Requests one group commit takes at most, so one sync never grows without bound.
pub const GROUP_COMMIT_REQUESTS_MAX: usize = 1024;
/// Encoded bytes one group commit takes at most (one segment); a single request larger
/// than this still goes whole into a segment of its own.
pub const GROUP_COMMIT_BYTES_MAX: usize = 1024 * 1024;
/// How often, at most, the committer writes the session index of the records appended
/// since, in milliseconds. Until then those records are found through an in-memory tail,
/// which reopening rebuilds from the segments past the index's watermark.
pub const SESSION_INDEX_FLUSH_MS: u64 = 100;
/// Runs one chunk of a session's index holds before the next chunk begins (a chunk is
/// rewritten whole when runs are added to it: 64 runs are 1,280 bytes).
pub const SESSION_INDEX_CHUNK_RUNS: usize = 64;
/// Runs (one per append request) the in-memory tail of the session index holds at most
/// before the committer writes them to the index, whatever the time.
pub const SESSION_INDEX_TAIL_RUNS_MAX: usize = 65_536;
/// How long the committer waits for a group to fill up to the last group's size, in
/// microseconds. A lone appender (last group of one) never waits.
pub const GROUP_COMMIT_LINGER_US: u64 = 200;
/// Records the live subscription channel buffers; a reader that falls further behind
/// re-reads from the journal instead of blocking writers.
pub const LIVE_BROADCAST_RECORDS: usize = 4096;
/// Records a lagging subscriber re-reads from disk in one go.
pub const SUBSCRIPTION_REFILL_RECORDS: usize = 1024;
/// Sessions whose stream heads the committer caches; past it the cache is dropped and
/// heads are read back from disk on demand.
pub const SESSION_HEADS_CACHED_MAX: usize = 65_536;
/// sled page cache, in bytes (sled's default is 1 GiB). Small on purpose: sled's RSS is
/// ~1.7x its capacity, reads of stored forms and segments stay within their bounds with 8
/// MiB (`docs/PERFORMANCE.md`, read models), and memory per session is a goal (issue 12).
pub const SLED_CACHE_BYTES: u64 = 8 * 1024 * 1024;
/// sled's segment (and I/O buffer) size, in bytes: values over a quarter of it go to
/// separate blob files, so it is large enough for a whole segment of a group commit to
/// stay in sled's log. sled refuses to open a directory with a different value.
pub const SLED_SEGMENT_BYTES: usize = 8 * 1024 * 1024;
/// sled's own background flush interval, in milliseconds; our durability does not rely on it.
pub const SLED_FLUSH_EVERY_MS: u64 = 500;
/// How long opening a journal waits for sled's file lock, in milliseconds.
pub const LOCK_WAIT_MS: u64 = 1_000;
/// Bytes of one encoded record at most (transcript lines and tool results included).
pub const RECORD_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Encoded bytes of an event kept inside its record, at most. A larger event (a
/// transcript line with an image, a tool that printed a large file) goes to a key of its
/// own in the same atomic batch, and its record keeps its digest and length, so a record
/// stays small and a segment never grows past a group commit's bound.
pub const INLINE_EVENT_BYTES_MAX: usize = 1024 * 1024;
/// Encoded bytes of one event at most, by default (`server.max_event_bytes`).
pub const EVENT_BYTES_MAX_DEFAULT: usize = 64 * 1024 * 1024;
/// The largest `max_event_bytes` a journal accepts.
pub const EVENT_BYTES_CEILING: usize = 1024 * 1024 * 1024;
/// Longest session or run id, in bytes.
pub const ID_BYTES_MAX: usize = 128;

/// Session actor mailbox, in messages.
pub const SESSION_MAILBOX_MESSAGES: usize = 256;
/// Events a run's live channel buffers for its streams; a slower stream re-reads the journal.
pub const RUN_BROADCAST_EVENTS: usize = 1024;
/// Events one journal read puts in a run stream's backlog (a finished run of any length
/// is re-read a batch at a time).
pub const STREAM_REFILL_EVENTS_MAX: usize = 4_096;
/// Harness events buffered between a harness and the run task that journals them.
pub const HARNESS_EVENTS_BUFFERED: usize = 256;
/// Request body size, in bytes, accepted by the gateway by default
/// (`server.max_request_bytes`).
pub const REQUEST_BODY_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Length of a `user_id`, in bytes.
pub const USER_ID_BYTES_MAX: usize = 1024;
/// Length of an `output_schema` (JSON text), in bytes: compiling one is not free.
pub const OUTPUT_SCHEMA_BYTES_MAX: usize = 256 * 1024;
/// One attachment, in bytes (it is journaled whole, within one record).
pub const ATTACHMENT_BYTES_MAX: usize = 3 * 1024 * 1024;
/// Length of an `Idempotency-Key`, in bytes.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 256;
/// Message text of one run, in bytes: the default of `server.max_message_bytes`.
pub const MESSAGE_BYTES_MAX: usize = 1024 * 1024;
/// How often a connection checks its header and idle deadlines, in milliseconds.
pub const CONNECTION_WATCH_MS: u64 = 250;
/// Flushes of sled's epoch garbage at most in one [`crate::Journal::release_garbage`]
/// (each frees up to 8 bags of 64 retired objects whose epoch has passed).
pub const GARBAGE_FLUSHES_MAX: usize = 1_024;
/// How long shutdown waits for open connections to finish their requests, in milliseconds.
pub const SHUTDOWN_CONNECTIONS_WAIT_MS: u64 = 10_000;
/// File descriptors kept for everything but connections (the journal's files, CLI
/// pipes, transcript files): `max_connections` is capped at the limit less these.
pub const DESCRIPTORS_RESERVED: u64 = 256;
/// Lines of a CLI's stderr kept for its error messages.
pub const CLI_STDERR_LINES_KEPT: usize = 20;
/// How long shutdown waits for running turns to end before leaving them to recovery, in milliseconds.
pub const SHUTDOWN_DRAIN_MS: u64 = 5_000;

/// Free bytes the sled journal's disk must keep beyond an append: an append that would
/// leave less is refused as unavailable (`503`) before sled writes anything, so sled
/// never meets a full disk (after a failed write it refuses everything until a
/// restart). Four of sled's segments: room for its log to finish what it holds.
pub const JOURNAL_DISK_RESERVE_BYTES: u64 = 4 * SLED_SEGMENT_BYTES as u64;
/// How long a PostgreSQL journal waits for a connection (from its pool, or a new one)
/// before it answers that the database is away, in milliseconds.
pub const POSTGRES_WAIT_MS: u64 = 3_000;
/// Records written per sled batch (one segment) while importing, at most; a segment
/// also ends once it holds [`GROUP_COMMIT_BYTES_MAX`] bytes, as the
/// committer's do.
pub const IMPORT_BATCH_RECORDS: usize = 1024;

/// Records one query of the PostgreSQL journal's paged readers reads.
pub const POSTGRES_PAGE_RECORDS: i64 = 1_000;

/// Appends one PostgreSQL batch (one transaction, one WAL flush) holds at most; a batch
/// also ends once its events hold [`POSTGRES_BATCH_BYTES_MAX`] (one append of any size
/// goes, alone if need be).
pub const POSTGRES_BATCH_APPENDS_MAX: usize = 512;

/// Arbiter threads (hosts of session actors) a server on PostgreSQL has per core: an
/// actor's journal read (a lease's acquire, a session's load) waits on its thread for a
/// round trip to the database, which takes no core. More threads than that cost more in
/// task switches than they gain: 16 on two cores made two replicas 0.72-0.88x one in six
/// runs of `cargo bench --bench replicas`, 4 made them 0.83-0.94x, one replica as fast.
pub const POSTGRES_ARBITERS_PER_CORE: usize = 2;

/// Event bytes one PostgreSQL batch holds at most (see [`POSTGRES_BATCH_APPENDS_MAX`]).
pub const POSTGRES_BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;

/// PostgreSQL batches on their way at once, of disjoint sessions: the next one is sent
/// while the database flushes the last (batches take the global order's lock in turn).
/// A replica among others sends one at a time (theirs are the others on their way).
pub const POSTGRES_BATCHES_IN_FLIGHT: usize = 2;

/// How long a PostgreSQL replica's projection writer waits after a write before the
/// next, in milliseconds: what comes meanwhile goes in one statement (a projection is
/// derived data: one lost to a crash is folded again from the records).
pub const POSTGRES_PROJECTIONS_EVERY_MS: u64 = 10;

/// Stored projections a PostgreSQL replica holds waiting for its writer, at most (past
/// it, a projection is written at once).
pub const POSTGRES_PROJECTIONS_WAITING_MAX: usize = 10_000;

/// Records a PostgreSQL replica keeps of its own appends for its live feed, at most
/// (past it, the follower reads them back as it reads the others').
pub const POSTGRES_OWN_RECORDS_KEPT: usize = 100_000;

/// How often the PostgreSQL follower looks for records other processes positioned when
/// no notification woke it, in milliseconds, while other replicas are alive (a replica
/// alone does not look).
pub const POSTGRES_FOLLOW_POLL_MS: u64 = 20;

/// How long a command for a session another replica owns waits for it (the owner's
/// answer, or the session to come free), in milliseconds.
pub const ELSEWHERE_WAIT_MS: u64 = 10_000;

/// How long a replica waits for word of a command left for it (a notification) before
/// it looks anyway, in milliseconds.
pub const COMMANDS_EVERY_MS: u64 = 250;

/// How often a replica looks for sessions to take over, in milliseconds.
pub const CLAIM_EVERY_MS: u64 = 250;

/// Longest tool result a rendered history (a prompt that replays a branch) keeps whole,
/// in characters.
pub const TOOL_RESULT_CHARS_MAX: usize = 2_000;

/// Characters kept from the end of a truncated tool result.
pub const TOOL_RESULT_TAIL_CHARS: usize = 400;

/// Budget of a rendered history, in characters.
pub const HISTORY_CHARS_MAX: usize = 24_000;

/// Most runs a walk of a branch visits (a guard against a lineage that loops).
pub const BRANCH_STEPS_MAX: usize = 1_000_000;

/// Earlier runs of the branch whose attachments a turn stages again.
pub const ATTACHMENT_RUNS_RESTORED: usize = 10;

/// How often a session actor whose append failed tries to read its state again, in
/// milliseconds.
pub const HEAL_EVERY_MS: u64 = 1_000;

/// How long after the first passivation of a burst a round runs: the rest of the burst
/// has passivated by then, and a steady trickle costs one round per interval. In
/// milliseconds.
pub const MEMORY_RELEASE_AFTER_MS: u64 = 500;

/// How long a stream that follows the journal waits for word that the session's stream
/// grew (a notification) before it looks anyway, in milliseconds.
pub const STREAM_FOLLOW_EVERY_MS: u64 = 50;

/// Server-sent-event frames coalesced into one write at most.
pub const SSE_FRAMES_PER_WRITE_MAX: usize = 256;

/// Bytes of one server-sent-events write: it stops taking frames once it holds this
/// much (a frame is not split). Not [`EXPORT_CHUNK_BYTES`].
pub const SSE_CHUNK_BYTES: usize = 64 * 1024;

/// Bytes of an export gathered before a chunk of the response is sent (at most a few
/// chunks are in flight). Not [`SSE_CHUNK_BYTES`].
pub const EXPORT_CHUNK_BYTES: usize = 256 * 1024;

/// Open runs the telemetry follows at most; beyond it the oldest is dropped (its trace is lost,
/// memory stays bounded).
pub const TELEMETRY_OPEN_RUNS_MAX: usize = 10_000;

/// Tool calls the telemetry keeps per run at most.
pub const TELEMETRY_TOOLS_PER_RUN_MAX: usize = 4_096;

/// How long a cancelled CLI turn may take to stop once asked, in milliseconds.
pub const INTERRUPT_GRACE_MS: u64 = 3_000;

/// How long a transcript line a CLI dialect waits for may lag behind the stdout line
/// naming it, in milliseconds.
pub const TRANSCRIPT_LAG_MS: u64 = 2_000;

/// How long a stopping runtime waits for each warm CLI it killed to exit, in
/// milliseconds (a killed process may take a moment to die under load).
pub const CLI_EXIT_WAIT_MS: u64 = 2_000;
