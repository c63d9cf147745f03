//! The PostgreSQL backend: one journal that several processes can share.
//!
//! Records are turnstile's own record bytes (format 3), one row each, keyed by session
//! and sequence; an append is one call of the `turnstile.append` function (one
//! statement, one transaction), which checks the stream's head under its row lock and
//! writes the records and every index they change. Global positions are given after the
//! writing transaction has finished, by `turnstile.position_records`, in transaction
//! order and only below the oldest running transaction (its snapshot's xmin): they are
//! contiguous from 0, and a reader of positions never passes a record that a late
//! commit would put before it. An append answers once its records are durable and
//! positioned; reads show positioned records only, so a record is seen in the same place
//! by every reader of every process (`docs/decisions/0001-postgres-replicas.md`).
//!
//! What replicas share lives here too: replica rows with a heartbeat on the database's
//! clock, session leases with fencing tokens (checked by the append), the sessions
//! whose owner is gone, an inbox of commands for a session's owner, and notifications
//! (LISTEN on a connection of its own; each NOTIFY after its change committed).
//!
//! The rest of turnstile calls the journal synchronously for reads (sled reads are
//! memory and disk, not network): the queries run on this backend's own small tokio
//! runtime, and a read waits for its answer on a plain channel, so it works from any
//! thread, inside another runtime or not.

use std::collections::HashMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio_postgres::NoTls;

use crate::Error;
use crate::chain::{self, Head, IndexChange};
use crate::codec::{self, Hash};
use crate::event::Event;
use crate::ids::{JournalPos, RunId, Seq, SessionId};
use crate::journal::AppendResult;
use crate::limits;
use crate::types::{
    AgentRun, AppendQueueFull, Conflict, Expected, Hashing, IndexedStatus, JournalOptions,
    JournalStats, Recorded, SessionEntry, StatsSnapshot,
};
use crate::verify::{Corruption, VerifyReport};

/// The schema versions this build knows, in order: (version, description, SQL).
const MIGRATIONS: &[(i32, &str, &str)] = &[(
    1,
    "streams, records, positions, indexes",
    include_str!("../migrations/0001_journal.sql"),
)];

/// Records read per query by the paged readers.
const PAGE_RECORDS: i64 = 1_000;
/// Records positioned per call of `position_records` at most.
const POSITION_BATCH: i32 = 10_000;
/// Appenders, each a connection's worth of appends in order: a session always goes to
/// the same one, so one session's appends are journaled in the order they were made.
const APPENDERS: usize = 8;
/// How often the follower looks for records other processes positioned.
const FOLLOW_POLL_MS: u64 = 20;

/// Where a PostgreSQL journal is and how to reach it.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user@host:port/database` (or a key=value connection string).
    pub url: String,
    /// Connections in the pool.
    pub pool_size: usize,
    /// This process's name among the replicas (a restart under the same name retires
    /// its earlier incarnation at once, so its sessions are taken over without waiting).
    pub replica_name: String,
    /// A replica whose heartbeat is older than this loses its sessions.
    pub lease: Duration,
}

impl PostgresOptions {
    /// The defaults: 8 connections, a 10 s lease, a name of its own (the process id and
    /// a count: two journals opened by one process are two replicas).
    pub fn new(url: impl Into<String>) -> Self {
        static OPENED: AtomicU64 = AtomicU64::new(0);
        PostgresOptions {
            url: url.into(),
            pool_size: 8,
            replica_name: format!(
                "pid-{}-{}",
                std::process::id(),
                OPENED.fetch_add(1, Ordering::Relaxed)
            ),
            lease: Duration::from_secs(10),
        }
    }
}

/// Whether this replica may write a session: it holds the session's lease, or another
/// live replica does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// Ours: our appends carry its fencing token.
    Held,
    /// Another live replica's (its id).
    OwnedBy(String),
}

/// A command another replica left for this one.
#[derive(Debug, Clone)]
pub struct Command {
    /// Its id, to answer it.
    pub id: i64,
    /// The session it is for.
    pub session_id: SessionId,
    /// `enqueue` or `cancel`.
    pub kind: String,
    /// What the sender wrote (JSON).
    pub body: String,
}

/// The journal's database as a client may be told of it: `host:port`, never the
/// password (set when a PostgreSQL journal opens).
static DATABASE_ADDRESS: std::sync::RwLock<String> = std::sync::RwLock::new(String::new());

/// "the journal's database (host:port) does not answer".
fn database_away() -> String {
    let address = DATABASE_ADDRESS
        .read()
        .map(|address| address.clone())
        .unwrap_or_default();
    format!("the journal's database ({address}) does not answer")
}

fn address_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Self {
        // The server's own message (with its code) says more than the driver's summary.
        match error.as_db_error() {
            // Connection exceptions (08…) and a server shutting down or starting (57P…):
            // the database is away, not the request wrong.
            Some(db)
                if db.code().code().starts_with("08") || db.code().code().starts_with("57P") =>
            {
                Error::Unavailable(format!("{} ({})", database_away(), db.message()))
            }
            // The driver's connection-level kinds (connect, I/O, closed, timeout), not a
            // conversion or a bug of ours.
            None if error.is_closed()
                || std::error::Error::source(&error)
                    .is_some_and(|cause| cause.downcast_ref::<std::io::Error>().is_some())
                || [
                    "error connecting",
                    "error communicating",
                    "connection closed",
                    "timeout waiting",
                ]
                .iter()
                .any(|kind| error.to_string().starts_with(kind)) =>
            {
                let cause = std::error::Error::source(&error)
                    .map(|cause| format!(": {cause}"))
                    .unwrap_or_default();
                Error::Unavailable(format!("{} ({error}{cause})", database_away()))
            }
            Some(db) => Error::Store(format!(
                "PostgreSQL: {} ({})",
                db.message(),
                db.code().code()
            )),
            None => match std::error::Error::source(&error) {
                Some(cause) => Error::Store(format!("PostgreSQL: {error}: {cause}")),
                None => Error::Store(format!("PostgreSQL: {error}")),
            },
        }
    }
}

impl From<deadpool_postgres::PoolError> for Error {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        match error {
            deadpool_postgres::PoolError::Backend(error) => error.into(),
            deadpool_postgres::PoolError::Timeout(_) => Error::Unavailable(format!(
                "{} (no connection within the pool's timeout)",
                database_away()
            )),
            other => Error::Store(format!("PostgreSQL connection pool: {other}")),
        }
    }
}

struct Request {
    session_id: SessionId,
    expected: Expected,
    events: Vec<codec::EncodedEvent>,
    reply: oneshot::Sender<AppendResult>,
}

/// The PostgreSQL journal: cheap to clone.
#[derive(Clone)]
pub(crate) struct PgJournal {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    pool: Pool,
    url: String,
    appenders: Mutex<Option<Vec<mpsc::Sender<Request>>>>,
    heads: Mutex<HashMap<SessionId, Head>>,
    /// This process's id among the replicas (a new one after a lapsed heartbeat).
    replica_id: Mutex<String>,
    replica_name: String,
    lease: Duration,
    /// The leases this replica holds (their fencing tokens), and those it lost.
    leases: Mutex<HashMap<SessionId, LeaseState>>,
    /// Counts the heartbeat's lapses: every lease was lost at each.
    lapses: tokio::sync::watch::Sender<u64>,
    /// Notifications from the database (LISTEN): a hint that something changed.
    notices: broadcast::Sender<Notice>,
    /// Sessions appended to here, for the debounced `turnstile_events` notification.
    touched: mpsc::UnboundedSender<SessionId>,
    /// The connection settings, for the listening connection.
    config: tokio_postgres::Config,
    next_pos: Arc<AtomicU64>,
    live: broadcast::Sender<Arc<Recorded>>,
    /// Wakes the follower after a local append.
    appended: Arc<Notify>,
    stats: Arc<JournalStats>,
    max_event_bytes: usize,
    closed: AtomicBool,
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// A URL without its password, for messages.
fn redacted(url: &str) -> String {
    match tokio_postgres::Config::from_str(url) {
        Ok(config) => {
            let host = config
                .get_hosts()
                .first()
                .map(|host| match host {
                    tokio_postgres::config::Host::Tcp(name) => name.clone(),
                    tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                })
                .unwrap_or_default();
            let port = config.get_ports().first().copied().unwrap_or(5432);
            format!(
                "postgres://{}@{host}:{port}/{}",
                config.get_user().unwrap_or_default(),
                config.get_dbname().unwrap_or_default()
            )
        }
        Err(_) => "(an unparsable PostgreSQL URL)".into(),
    }
}

impl PgJournal {
    /// Connects, creates or migrates the schema, and starts the appenders and the
    /// follower.
    pub(crate) fn open(
        options: &PostgresOptions,
        journal_options: &JournalOptions,
    ) -> Result<PgJournal, Error> {
        let config = tokio_postgres::Config::from_str(&options.url)
            .map_err(|error| Error::Store(format!("the PostgreSQL URL does not parse: {error}")))?;
        let mut config = config;
        if config.get_application_name().is_none() {
            config.application_name("turnstile");
        }
        config.connect_timeout(Duration::from_secs(10));
        if let Ok(mut address) = DATABASE_ADDRESS.write() {
            *address = address_of(&config);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("journal-postgres")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let listen_config = config.clone();
        let (touched_sender, touched) = mpsc::unbounded_channel();
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(2))
            // A database away answers within a request's time, never a hang.
            .wait_timeout(Some(Duration::from_millis(limits::POSTGRES_WAIT_MS)))
            .create_timeout(Some(Duration::from_millis(limits::POSTGRES_WAIT_MS)))
            .recycle_timeout(Some(Duration::from_millis(limits::POSTGRES_WAIT_MS)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|error| Error::Store(format!("PostgreSQL connection pool: {error}")))?;
        let url = redacted(&options.url);
        let replica_id = uuid::Uuid::now_v7().to_string();
        let next_pos = {
            let pool = pool.clone();
            let url = url.clone();
            let replica_id = replica_id.clone();
            let name = options.replica_name.clone();
            let lease = options.lease;
            block_on(&handle, async move {
                let client = pool.get().await.map_err(|error| match Error::from(error) {
                    Error::Store(reason) => {
                        Error::Store(format!("cannot connect to {url}: {reason}"))
                    }
                    other => other,
                })?;
                migrate(&client).await?;
                let row = client.query_one("SHOW synchronous_commit", &[]).await?;
                let setting: String = row.get(0);
                if setting == "off" {
                    return Err(Error::Store(format!(
                        "{url} has synchronous_commit = off: a commit would be acknowledged before it is durable"
                    )));
                }
                register(&client, &replica_id, &name, lease).await?;
                let row = client
                    .query_one("SELECT next_pos FROM turnstile.positions", &[])
                    .await?;
                Ok(row.get::<_, i64>(0) as u64)
            })?
        };
        let (live, _) = broadcast::channel(limits::LIVE_BROADCAST_RECORDS);
        let inner = Arc::new(Inner {
            runtime: Mutex::new(Some(runtime)),
            handle: handle.clone(),
            pool,
            url,
            appenders: Mutex::new(None),
            heads: Mutex::new(HashMap::new()),
            next_pos: Arc::new(AtomicU64::new(next_pos)),
            live,
            appended: Arc::new(Notify::new()),
            stats: Arc::new(JournalStats::default()),
            max_event_bytes: journal_options
                .max_event_bytes
                .min(limits::EVENT_BYTES_CEILING),
            closed: AtomicBool::new(false),
            replica_id: Mutex::new(replica_id.clone()),
            replica_name: options.replica_name.clone(),
            lease: options.lease,
            leases: Mutex::new(HashMap::new()),
            lapses: tokio::sync::watch::channel(0).0,
            notices: broadcast::channel(1024).0,
            touched: touched_sender,
            config: listen_config,
        });
        let mut senders = Vec::with_capacity(APPENDERS);
        for _ in 0..APPENDERS {
            let (sender, receiver) = mpsc::channel(limits::APPEND_QUEUE_REQUESTS_MAX / APPENDERS);
            senders.push(sender);
            handle.spawn(appender(Arc::downgrade(&inner), receiver));
        }
        *inner.appenders.lock().map_err(|_| Error::Stopped)? = Some(senders);
        handle.spawn(follower(Arc::downgrade(&inner)));
        handle.spawn(heartbeat(Arc::downgrade(&inner)));
        handle.spawn(listener(Arc::downgrade(&inner)));
        handle.spawn(notifier(Arc::downgrade(&inner), touched));
        Ok(PgJournal { inner })
    }

    fn block<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T, Error>> + Send + 'static,
    ) -> Result<T, Error> {
        block_on(&self.inner.handle, future)
    }

    pub(crate) fn describe(&self) -> &str {
        &self.inner.url
    }

    pub(crate) fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot(self.next_pos().0)
    }

    fn request(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> Result<
        (
            Request,
            oneshot::Receiver<AppendResult>,
            mpsc::Sender<Request>,
        ),
        Error,
    > {
        let events = chain::encode(events, self.inner.max_event_bytes)?;
        let (reply, answer) = oneshot::channel();
        let sender = {
            let appenders = self.inner.appenders.lock().map_err(|_| Error::Stopped)?;
            let appenders = appenders.as_ref().ok_or(Error::Stopped)?;
            appenders[shard(session_id)].clone()
        };
        Ok((
            Request {
                session_id: session_id.clone(),
                expected,
                events,
                reply,
            },
            answer,
            sender,
        ))
    }

    pub(crate) async fn append(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        let (request, answer, sender) = self.request(session_id, expected, events)?;
        sender.send(request).await.map_err(|_| Error::Stopped)?;
        answer.await.map_err(|_| Error::Stopped)?
    }

    pub(crate) fn append_in_order(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> Result<Result<impl Future<Output = AppendResult> + Send + 'static, AppendQueueFull>, Error>
    {
        let (request, answer, sender) = self.request(session_id, expected, events)?;
        match sender.try_send(request) {
            Ok(()) => Ok(Ok(async move { answer.await.map_err(|_| Error::Stopped)? })),
            Err(mpsc::error::TrySendError::Full(_)) => Ok(Err(AppendQueueFull)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Error::Stopped),
        }
    }

    pub(crate) fn append_blocking(
        &self,
        session_id: &SessionId,
        expected: Expected,
        events: Vec<Event>,
    ) -> AppendResult {
        let (request, answer, sender) = self.request(session_id, expected, events)?;
        // Sent from this backend's runtime, so a caller inside another runtime may wait.
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        self.inner.handle.spawn(async move {
            let answer = match sender.send(request).await {
                Ok(()) => answer.await.unwrap_or(Err(Error::Stopped)),
                Err(_) => Err(Error::Stopped),
            };
            let _ = done.send(answer);
        });
        wait.recv().map_err(|_| Error::Stopped)?
    }

    pub(crate) fn max_event_bytes(&self) -> usize {
        self.inner.max_event_bytes
    }

    pub(crate) fn next_pos(&self) -> JournalPos {
        JournalPos(self.inner.next_pos.load(Ordering::SeqCst))
    }

    pub(crate) fn get(&self, pos: JournalPos) -> Result<Option<Recorded>, Error> {
        let pool = self.inner.pool.clone();
        let stats = self.inner.stats.clone();
        self.block(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt(
                    "SELECT record FROM turnstile.events WHERE pos = $1",
                    &[&(pos.0 as i64)],
                )
                .await?;
            match row {
                None => Ok(None),
                Some(row) => {
                    let bytes: Vec<u8> = row.get(0);
                    stats.records_read.fetch_add(1, Ordering::Relaxed);
                    decode(&client, &bytes, pos, Hashing::Compute)
                        .await
                        .map(Some)
                }
            }
        })
    }

    pub(crate) fn read_session(
        &self,
        session_id: &SessionId,
        from: Seq,
        hashing: Hashing,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + Send + use<> {
        let this = self.clone();
        let session = session_id.as_str().to_owned();
        Paged::new(from.0, move |cursor| {
            let pool = this.inner.pool.clone();
            let stats = this.inner.stats.clone();
            let session = session.clone();
            this.block(async move {
                let client = pool.get().await?;
                let rows = client
                    .query(
                        "SELECT seq, pos, record FROM turnstile.events \
                         WHERE session_id = $1 AND seq >= $2 AND pos IS NOT NULL \
                         ORDER BY seq LIMIT $3",
                        &[&session, &(cursor as i64), &PAGE_RECORDS],
                    )
                    .await?;
                let mut page = Vec::with_capacity(rows.len());
                let mut next = cursor;
                for row in rows {
                    let seq: i64 = row.get(0);
                    let pos: i64 = row.get(1);
                    let bytes: Vec<u8> = row.get(2);
                    next = seq as u64 + 1;
                    page.push(decode(&client, &bytes, JournalPos(pos as u64), hashing).await);
                }
                stats
                    .records_read
                    .fetch_add(page.len() as u64, Ordering::Relaxed);
                let done = page.len() < PAGE_RECORDS as usize;
                Ok((page, next, done))
            })
        })
    }

    pub(crate) fn read_from(
        &self,
        from: JournalPos,
    ) -> impl Iterator<Item = Result<Recorded, Error>> + Send + use<> {
        let this = self.clone();
        let durable = self.next_pos().0;
        Paged::new(from.0, move |cursor| {
            let pool = this.inner.pool.clone();
            let stats = this.inner.stats.clone();
            this.block(async move {
                let rows = {
                    let client = pool.get().await?;
                    client
                        .query(
                            "SELECT pos, record FROM turnstile.events \
                             WHERE pos >= $1 AND pos < $2 ORDER BY pos LIMIT $3",
                            &[&(cursor as i64), &(durable as i64), &PAGE_RECORDS],
                        )
                        .await?
                };
                let client = pool.get().await?;
                let mut page = Vec::with_capacity(rows.len());
                let mut next = cursor;
                for row in rows {
                    let pos: i64 = row.get(0);
                    let bytes: Vec<u8> = row.get(1);
                    next = pos as u64 + 1;
                    page.push(
                        decode(&client, &bytes, JournalPos(pos as u64), Hashing::Compute).await,
                    );
                }
                stats
                    .records_read
                    .fetch_add(page.len() as u64, Ordering::Relaxed);
                let done = page.len() < PAGE_RECORDS as usize;
                Ok((page, next, done))
            })
        })
    }

    pub(crate) fn session_next_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        let pool = self.inner.pool.clone();
        let session = session_id.as_str().to_owned();
        self.block(async move {
            let client = pool.get().await?;
            let row = client
                .query_one(
                    "SELECT coalesce(max(seq) + 1, 0) FROM turnstile.events \
                     WHERE session_id = $1 AND pos IS NOT NULL",
                    &[&session],
                )
                .await?;
            Ok(Seq(row.get::<_, i64>(0) as u64))
        })
    }

    /// The stream's head as committed (positioned or not).
    pub(crate) fn session_committed_seq(&self, session_id: &SessionId) -> Result<Seq, Error> {
        let pool = self.inner.pool.clone();
        let session = session_id.as_str().to_owned();
        self.block(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt(
                    "SELECT next_seq FROM turnstile.streams WHERE session_id = $1",
                    &[&session],
                )
                .await?;
            Ok(Seq(row.map_or(0, |row| row.get::<_, i64>(0)) as u64))
        })
    }

    pub(crate) fn session_of_run(&self, run_id: &RunId) -> Result<Option<SessionId>, Error> {
        let pool = self.inner.pool.clone();
        let run = run_id.as_str().to_owned();
        self.block(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt(
                    "SELECT session_id FROM turnstile.runs WHERE run_id = $1",
                    &[&run],
                )
                .await?;
            row.map(|row| stored_id(row.get(0))).transpose()
        })
    }

    pub(crate) fn session_runs(&self, session_id: &SessionId) -> Result<Vec<(Seq, RunId)>, Error> {
        let pool = self.inner.pool.clone();
        let session = session_id.as_str().to_owned();
        self.block(async move {
            let client = pool.get().await?;
            let rows = client
                .query(
                    "SELECT queued_seq, run_id FROM turnstile.runs \
                     WHERE session_id = $1 AND listed ORDER BY queued_seq",
                    &[&session],
                )
                .await?;
            rows.into_iter()
                .map(|row| Ok((Seq(row.get::<_, i64>(0) as u64), stored_id(row.get(1))?)))
                .collect()
        })
    }

    pub(crate) fn agent_run_counts(&self, agent_id: &str) -> [u64; 5] {
        let pool = self.inner.pool.clone();
        let agent = agent_id.to_owned();
        let counted = self.block(async move {
            let client = pool.get().await?;
            let rows = client
                .query(
                    "SELECT status::text, count(*) FROM turnstile.runs \
                     WHERE agent_id = $1 AND listed GROUP BY status",
                    &[&agent],
                )
                .await?;
            let mut counts = [0u64; 5];
            for row in rows {
                let status: String = row.get(0);
                let count: i64 = row.get(1);
                if let Some(status) = status.bytes().next().and_then(IndexedStatus::from_byte) {
                    counts[status as usize] = count as u64;
                }
            }
            Ok(counts)
        });
        match counted {
            Ok(counts) => counts,
            Err(error) => {
                tracing::error!(%error, "counting an agent's runs failed");
                [0; 5]
            }
        }
    }

    pub(crate) fn agent_runs(
        &self,
        agent_id: &str,
        newest_first: bool,
    ) -> impl Iterator<Item = Result<AgentRun, Error>> + Send + use<> {
        let this = self.clone();
        let agent = agent_id.to_owned();
        let durable = self.next_pos().0 as i64;
        let start = if newest_first { durable } else { -1 };
        Paged::new(start as u64, move |cursor| {
            let pool = this.inner.pool.clone();
            let agent = agent.clone();
            this.block(async move {
                let client = pool.get().await?;
                let cursor = cursor as i64;
                let rows = if newest_first {
                    client
                        .query(
                            "SELECT queued_pos, session_id, run_id, status::text FROM turnstile.runs \
                             WHERE agent_id = $1 AND listed AND queued_pos IS NOT NULL AND queued_pos < $2 \
                             ORDER BY queued_pos DESC LIMIT $3",
                            &[&agent, &cursor, &PAGE_RECORDS],
                        )
                        .await?
                } else {
                    client
                        .query(
                            "SELECT queued_pos, session_id, run_id, status::text FROM turnstile.runs \
                             WHERE agent_id = $1 AND listed AND queued_pos IS NOT NULL AND queued_pos > $2 \
                             AND queued_pos < $3 ORDER BY queued_pos LIMIT $4",
                            &[&agent, &cursor, &durable, &PAGE_RECORDS],
                        )
                        .await?
                };
                let done = rows.len() < PAGE_RECORDS as usize;
                let mut next = cursor;
                let mut page = Vec::with_capacity(rows.len());
                for row in rows {
                    let pos: i64 = row.get(0);
                    next = pos;
                    let status: String = row.get(3);
                    page.push(
                        status
                            .bytes()
                            .next()
                            .and_then(IndexedStatus::from_byte)
                            .ok_or_else(|| Error::Store("malformed run status".into()))
                            .and_then(|status| {
                                Ok(AgentRun {
                                    pos: JournalPos(pos as u64),
                                    session_id: stored_id(row.get(1))?,
                                    run_id: stored_id(row.get(2))?,
                                    status,
                                })
                            }),
                    );
                }
                Ok((page, next as u64, done))
            })
        })
    }

    pub(crate) fn open_runs(&self) -> Result<Vec<(RunId, SessionId)>, Error> {
        let pool = self.inner.pool.clone();
        self.block(async move {
            let client = pool.get().await?;
            let rows = client
                .query(
                    "SELECT run_id, session_id FROM turnstile.runs WHERE open ORDER BY run_id",
                    &[],
                )
                .await?;
            rows.into_iter()
                .map(|row| Ok((stored_id(row.get(0))?, stored_id(row.get(1))?)))
                .collect()
        })
    }

    pub(crate) fn sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        let pool = self.inner.pool.clone();
        self.block(async move {
            let client = pool.get().await?;
            let rows = client
                .query(
                    "SELECT session_id, agent_id, user_id, created_at_us FROM turnstile.sessions \
                     ORDER BY session_id COLLATE \"C\"",
                    &[],
                )
                .await?;
            rows.into_iter()
                .map(|row| {
                    Ok(SessionEntry {
                        session_id: stored_id(row.get(0))?,
                        agent_id: row.get(1),
                        user_id: row.get(2),
                        created_at_us: row.get(3),
                    })
                })
                .collect()
        })
    }

    pub(crate) fn run_of_idempotency_key(&self, key: &str) -> Result<Option<RunId>, Error> {
        let pool = self.inner.pool.clone();
        let key = key.to_owned();
        self.block(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt(
                    "SELECT run_id FROM turnstile.idempotency_keys WHERE key = $1",
                    &[&key],
                )
                .await?;
            row.map(|row| stored_id(row.get(0))).transpose()
        })
    }

    pub(crate) fn live(&self) -> broadcast::Receiver<Arc<Recorded>> {
        self.inner.live.subscribe()
    }

    pub(crate) fn put_projection(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        let pool = self.inner.pool.clone();
        let key = key.to_owned();
        let value = value.to_vec();
        self.block(async move {
            let client = pool.get().await?;
            let statement = client
                .prepare_cached("SELECT turnstile.put_projection($1, $2)")
                .await?;
            client.execute(&statement, &[&key, &value]).await?;
            Ok(())
        })
    }

    /// One round trip to the database (`SELECT 1`), within the pool's timeouts.
    pub(crate) fn writable(&self) -> Result<(), Error> {
        let pool = self.inner.pool.clone();
        self.block(async move {
            let client = pool.get().await?;
            tokio::time::timeout(
                Duration::from_millis(limits::POSTGRES_WAIT_MS),
                client.simple_query("SELECT 1"),
            )
            .await
            .map_err(|_| Error::Unavailable(database_away()))??;
            Ok(())
        })
    }

    pub(crate) fn get_projection(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let pool = self.inner.pool.clone();
        let key = key.to_owned();
        self.block(async move {
            let client = pool.get().await?;
            let row = client
                .query_opt(
                    "SELECT value FROM turnstile.projections WHERE key = $1",
                    &[&key],
                )
                .await?;
            Ok(row.map(|row| row.get(0)))
        })
    }

    pub(crate) fn projections(&self) -> Result<Vec<(String, Vec<u8>)>, Error> {
        let pool = self.inner.pool.clone();
        self.block(async move {
            let client = pool.get().await?;
            let rows = client
                .query(
                    "SELECT key, value FROM turnstile.projections ORDER BY key COLLATE \"C\"",
                    &[],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect())
        })
    }

    /// The neutral checks, over the records in global order: positions from 0 without
    /// a gap, each record's checksum and format, each session's sequence from 0 and hash
    /// links; then each stream's stored head against its last record.
    pub(crate) fn verify(
        &self,
        mut progress: impl FnMut(u64),
    ) -> Result<Result<VerifyReport, Corruption>, Error> {
        let mut heads: HashMap<SessionId, Head> = HashMap::new();
        let mut report = VerifyReport::default();
        let mut expected = JournalPos(0);
        for record in self.read_from(JournalPos(0)) {
            let record = match record {
                Ok(record) => record,
                Err(Error::Corrupt { pos, reason }) => return Ok(Err(Corruption { pos, reason })),
                Err(error) => return Err(error),
            };
            if record.pos != expected {
                return Ok(Err(Corruption {
                    pos: expected,
                    reason: format!(
                        "records missing: the next record is at position {}",
                        record.pos
                    ),
                }));
            }
            let head = heads
                .entry(record.session_id.clone())
                .or_insert(Head::EMPTY);
            if record.seq != head.next_seq {
                return Ok(Err(Corruption {
                    pos: record.pos,
                    reason: format!(
                        "session {} sequence {} where {} was expected",
                        record.session_id, record.seq, head.next_seq
                    ),
                }));
            }
            if record.prev_hash != head.last_hash {
                return Ok(Err(Corruption {
                    pos: record.pos,
                    reason: format!(
                        "hash link of session {} sequence {} does not match the record before",
                        record.session_id, record.seq
                    ),
                }));
            }
            *head = Head {
                next_seq: record.seq.next(),
                last_hash: record.hash,
            };
            report.events += 1;
            report.bytes += record.size_bytes as u64;
            expected = expected.next();
            if report.events % 4096 == 0 {
                progress(report.events);
            }
        }
        report.streams = heads.len() as u64;
        progress(report.events);
        let pool = self.inner.pool.clone();
        let durable = expected.0 as i64;
        let stored: Vec<(String, i64, Vec<u8>)> = self.block(async move {
            let client = pool.get().await?;
            // Streams whose records are all positioned (one appended meanwhile is not
            // in this walk).
            let rows = client
                .query(
                    "SELECT s.session_id, s.next_seq, s.head_hash FROM turnstile.streams s \
                     WHERE NOT EXISTS (SELECT 1 FROM turnstile.events e WHERE e.session_id = s.session_id \
                     AND (e.pos IS NULL OR e.pos >= $1))",
                    &[&durable],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|row| (row.get(0), row.get(1), row.get(2)))
                .collect())
        })?;
        for (session, next_seq, head_hash) in stored {
            let session_id: SessionId = stored_id(session)?;
            let (walked_seq, walked_hash) = heads
                .get(&session_id)
                .map(|head| (head.next_seq.0, head.last_hash))
                .unwrap_or((0, [0; 32]));
            if next_seq as u64 != walked_seq || head_hash.as_slice() != walked_hash {
                return Ok(Err(Corruption {
                    pos: expected,
                    reason: format!(
                        "the stored head of session {session_id} (next sequence {next_seq}) does not match its records (next sequence {walked_seq})"
                    ),
                }));
            }
        }
        Ok(Ok(report))
    }

    pub(crate) fn close(&self) -> Result<(), Error> {
        let first = !self.inner.closed.load(Ordering::SeqCst);
        self.inner.close();
        if first {
            // Others take this replica's sessions at once rather than after its lease.
            let pool = self.inner.pool.clone();
            let me = self.replica_id();
            let _ = self.block(async move {
                let client = pool.get().await?;
                client
                    .execute(
                        "UPDATE turnstile.streams SET owner = NULL WHERE owner = $1",
                        &[&me],
                    )
                    .await?;
                client
                    .execute(
                        "DELETE FROM turnstile.replicas WHERE replica_id = $1",
                        &[&me],
                    )
                    .await?;
                Ok(())
            });
        }
        Ok(())
    }

    /// This process's id among the replicas.
    pub(crate) fn replica_id(&self) -> String {
        self.inner
            .replica_id
            .lock()
            .map(|id| id.clone())
            .unwrap_or_default()
    }

    /// Takes the session's lease unless another live replica holds it.
    pub(crate) fn lease(&self, session_id: &SessionId) -> Result<Lease, Error> {
        // Held already (by an actor that is stopping while its successor starts, say):
        // one more holder, no round trip.
        if let Ok(mut leases) = self.inner.leases.lock()
            && let Some(LeaseState::Held { holders, .. }) = leases.get_mut(session_id)
        {
            *holders += 1;
            return Ok(Lease::Held);
        }
        let pool = self.inner.pool.clone();
        let me = self.replica_id();
        let session = session_id.as_str().to_owned();
        let (status, epoch, owner): (String, Option<i64>, Option<String>) =
            self.block(async move {
                let client = pool.get().await?;
                let row = client
                    .query_one(
                        "SELECT status, lease_epoch, owner FROM turnstile.acquire($1, $2)",
                        &[&session, &me],
                    )
                    .await?;
                Ok((row.get(0), row.get(1), row.get(2)))
            })?;
        match status.as_str() {
            "ok" => {
                if let Ok(mut leases) = self.inner.leases.lock() {
                    let epoch = epoch.unwrap_or(0);
                    match leases.get_mut(session_id) {
                        Some(LeaseState::Held {
                            holders,
                            epoch: held,
                        }) => {
                            *holders += 1;
                            *held = (*held).max(epoch);
                        }
                        _ => {
                            leases
                                .insert(session_id.clone(), LeaseState::Held { epoch, holders: 1 });
                        }
                    }
                }
                // Another replica may have written since this one's cache was filled.
                if let Ok(mut heads) = self.inner.heads.lock() {
                    heads.remove(session_id);
                }
                Ok(Lease::Held)
            }
            "owned" => Ok(Lease::OwnedBy(owner.unwrap_or_default())),
            _ => Err(Error::Fenced {
                session_id: session_id.to_string(),
            }),
        }
    }

    /// Whether this replica holds the session's lease now.
    pub(crate) fn holds_lease(&self, session_id: &SessionId) -> bool {
        self.inner
            .leases
            .lock()
            .map(|leases| matches!(leases.get(session_id), Some(LeaseState::Held { .. })))
            .unwrap_or(false)
    }

    /// Gives the session's lease back (a session with nothing left to do) once its
    /// last holder here lets go.
    pub(crate) fn release(&self, session_id: &SessionId) {
        let epoch = {
            let Ok(mut leases) = self.inner.leases.lock() else {
                return;
            };
            match leases.get_mut(session_id) {
                Some(LeaseState::Held { holders, .. }) if *holders > 1 => {
                    *holders -= 1;
                    return;
                }
                Some(LeaseState::Held { epoch, .. }) => {
                    let epoch = *epoch;
                    leases.remove(session_id);
                    epoch
                }
                Some(LeaseState::Lost) => {
                    leases.remove(session_id);
                    return;
                }
                None => return,
            }
        };
        let pool = self.inner.pool.clone();
        let me = self.replica_id();
        let session = session_id.as_str().to_owned();
        let released = self.block(async move {
            let client = pool.get().await?;
            client
                .execute(
                    "UPDATE turnstile.streams SET owner = NULL \
                     WHERE session_id = $1 AND owner = $2 AND lease_epoch = $3",
                    &[&session, &me, &epoch],
                )
                .await?;
            Ok(())
        });
        if let Err(error) = released {
            tracing::warn!(%error, %session_id, "releasing a session's lease failed; it lapses with this replica");
        }
    }

    /// Sessions with open runs and no live owner, at most `limit`.
    pub(crate) fn claimable(&self, limit: usize) -> Result<Vec<SessionId>, Error> {
        let pool = self.inner.pool.clone();
        let limit = limit.min(i32::MAX as usize) as i32;
        self.block(async move {
            let client = pool.get().await?;
            let rows = client
                .query("SELECT session_id FROM turnstile.claimable($1)", &[&limit])
                .await?;
            rows.into_iter().map(|row| stored_id(row.get(0))).collect()
        })
    }

    /// A receiver that changes whenever this replica's heartbeat lapsed (every lease
    /// it held was lost then).
    pub(crate) fn lapses(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.lapses.subscribe()
    }

    /// Leaves a command for the replica that owns a session; its id.
    pub(crate) fn send_command(
        &self,
        session_id: &SessionId,
        target: &str,
        kind: &str,
        body: String,
    ) -> Result<i64, Error> {
        let pool = self.inner.pool.clone();
        let (session, target, kind) = (
            session_id.as_str().to_owned(),
            target.to_owned(),
            kind.to_owned(),
        );
        self.block(async move {
            let client = pool.get().await?;
            let row = client
                .query_one(
                    "INSERT INTO turnstile.inbox (session_id, target, kind, body) VALUES ($1, $2, $3, $4) RETURNING id",
                    &[&session, &target, &kind, &body],
                )
                .await?;
            notify(&client, INBOX_CHANNEL, &target).await;
            Ok(row.get(0))
        })
    }

    /// The reply to a command once its target answered it. `None`: it will never run
    /// (not taken by the deadline, so abandoned) or its target died (the session's
    /// next owner settles it from the journal). A command taken in time is waited for
    /// while its target is alive.
    pub(crate) async fn reply(&self, id: i64, timeout: Duration) -> Result<Option<String>, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let pool = self.inner.pool.clone();
            let past_deadline = Instant::now() >= deadline;
            let outcome = spawn_on(&self.inner.handle, async move {
                let client = pool.get().await?;
                let row = client
                    .query_one(
                        "SELECT state, reply, turnstile.alive(target) FROM turnstile.inbox WHERE id = $1",
                        &[&id],
                    )
                    .await?;
                let (state, reply, alive): (String, Option<String>, bool) =
                    (row.get(0), row.get(1), row.get(2));
                if state == "done" {
                    return Ok(Some(Some(reply.unwrap_or_default())));
                }
                if !alive || past_deadline {
                    let abandoned = client
                        .execute(
                            "UPDATE turnstile.inbox SET state = 'abandoned' WHERE id = $1 AND state = 'pending'",
                            &[&id],
                        )
                        .await?;
                    if abandoned == 1 || !alive {
                        return Ok(Some(None));
                    }
                }
                Ok::<_, Error>(None)
            })
            .await?;
            if let Some(answer) = outcome {
                return Ok(answer);
            }
            let id = id.to_string();
            self.wait_for(
                REPLIES_CHANNEL,
                |payload| payload == id,
                Duration::from_millis(50),
            )
            .await;
        }
    }

    /// Waits (at most `timeout`) for a notification on `channel` whose payload `wanted`
    /// accepts, or for the listening connection to come back (anything may have been
    /// missed meanwhile). A hint only: the caller reads the database either way.
    pub(crate) async fn wait_for(
        &self,
        channel: &str,
        wanted: impl Fn(&str) -> bool,
        timeout: Duration,
    ) {
        let mut notices = self.inner.notices.subscribe();
        let _ = tokio::time::timeout(timeout, async {
            loop {
                match notices.recv().await {
                    Ok(notice)
                        if notice.channel == RESYNC
                            || (notice.channel == channel
                                && notice.payload.split(',').any(&wanted)) =>
                    {
                        return;
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        })
        .await;
    }

    /// Waits (at most `timeout`) until another replica leaves a command for this one.
    pub(crate) async fn wait_for_commands(&self, timeout: Duration) {
        let me = self.replica_id();
        self.wait_for(INBOX_CHANNEL, |target| target == me, timeout)
            .await;
    }

    /// Waits (at most `timeout`) until a session's stream may have grown.
    pub(crate) async fn wait_for_session(&self, session_id: &SessionId, timeout: Duration) {
        let session = session_id.as_str().to_owned();
        self.wait_for(EVENTS_CHANNEL, |touched| touched == session, timeout)
            .await;
    }

    /// Takes the commands left for this replica, oldest first.
    pub(crate) fn take_commands(&self) -> Result<Vec<Command>, Error> {
        let pool = self.inner.pool.clone();
        let me = self.replica_id();
        self.block(async move {
            let client = pool.get().await?;
            let rows = client
                .query(
                    "UPDATE turnstile.inbox SET state = 'taken' WHERE id IN ( \
                       SELECT id FROM turnstile.inbox WHERE target = $1 AND state = 'pending' \
                       ORDER BY id FOR UPDATE SKIP LOCKED) \
                     RETURNING id, session_id, kind, body",
                    &[&me],
                )
                .await?;
            let mut commands: Vec<Command> = rows
                .into_iter()
                .map(|row| {
                    Ok(Command {
                        id: row.get(0),
                        session_id: stored_id(row.get(1))?,
                        kind: row.get(2),
                        body: row.get(3),
                    })
                })
                .collect::<Result<_, Error>>()?;
            commands.sort_by_key(|command| command.id);
            Ok(commands)
        })
    }

    /// Answers a command this replica took.
    pub(crate) fn answer_command(&self, id: i64, reply: String) -> Result<(), Error> {
        let pool = self.inner.pool.clone();
        self.block(async move {
            let client = pool.get().await?;
            client
                .execute(
                    "UPDATE turnstile.inbox SET state = 'done', reply = $2 WHERE id = $1",
                    &[&id, &reply],
                )
                .await?;
            notify(&client, REPLIES_CHANNEL, &id.to_string()).await;
            Ok(())
        })
    }
}

impl Inner {
    fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Dropping the senders lets each appender answer what it holds and end.
        if let Ok(mut appenders) = self.appenders.lock() {
            appenders.take();
        }
        self.appended.notify_one();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
        self.pool.close();
        if let Some(runtime) = self.runtime.lock().ok().and_then(|mut r| r.take()) {
            // On a thread of its own: this may run inside a runtime, even this one.
            let _ = std::thread::Builder::new()
                .name("journal-postgres-stop".into())
                .spawn(move || runtime.shutdown_timeout(Duration::from_secs(5)));
        }
    }
}

/// Runs `future` on the backend's runtime and waits for it on a plain channel.
fn block_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    future: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    let (done, wait) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = done.send(future.await);
    });
    wait.recv().map_err(|_| Error::Stopped)?
}

fn shard(session_id: &SessionId) -> usize {
    // FNV-1a: stable, and spreads ids that share a prefix.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in session_id.as_str().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % APPENDERS as u64) as usize
}

fn stored_id<T: FromStr>(text: String) -> Result<T, Error> {
    text.parse()
        .map_err(|_| Error::Store(format!("malformed id {text:?} in the journal's tables")))
}

/// Decodes a record found at `pos`, fetching an event stored apart.
async fn decode(
    client: &deadpool_postgres::Client,
    bytes: &[u8],
    pos: JournalPos,
    hashing: Hashing,
) -> Result<Recorded, Error> {
    let mut record = Recorded::decode(bytes, pos, hashing).map_err(|error| Error::Corrupt {
        pos,
        reason: error.to_string(),
    })?;
    if let Event::StoredApart { digest, .. } = &record.event {
        let corrupt = |reason: String| Error::Corrupt { pos, reason };
        let row = client
            .query_opt(
                "SELECT bytes FROM turnstile.blobs WHERE digest = $1",
                &[&digest.as_slice()],
            )
            .await?
            .ok_or_else(|| corrupt("the event stored apart is missing".into()))?;
        let stored: Vec<u8> = row.get(0);
        let event = codec::decode_apart(digest, &stored).map_err(corrupt)?;
        record.size_bytes += stored.len();
        record.event = event;
    }
    Ok(record)
}

/// Creates or migrates the schema, one version per transaction, under an advisory lock
/// so processes starting together apply each version once.
async fn migrate(client: &deadpool_postgres::Client) -> Result<(), Error> {
    client
        .batch_execute(
            "SELECT pg_advisory_lock(hashtext('turnstile.migrate')); \
             CREATE SCHEMA IF NOT EXISTS turnstile; \
             CREATE TABLE IF NOT EXISTS turnstile.schema_migrations ( \
               version int PRIMARY KEY, description text NOT NULL, \
               applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
    let outcome = async {
        let row = client
            .query_one(
                "SELECT coalesce(max(version), 0) FROM turnstile.schema_migrations",
                &[],
            )
            .await?;
        let current: i32 = row.get(0);
        let known = MIGRATIONS.last().map(|(version, _, _)| *version).unwrap_or(0);
        if current > known {
            return Err(Error::Store(format!(
                "the database's journal schema is version {current}, newer than this build's {known}: upgrade turnstile"
            )));
        }
        for (version, description, sql) in MIGRATIONS {
            if *version <= current {
                continue;
            }
            client.batch_execute("BEGIN").await?;
            let applied = async {
                client.batch_execute(sql).await?;
                client
                    .execute(
                        "INSERT INTO turnstile.schema_migrations (version, description) VALUES ($1, $2)",
                        &[version, description],
                    )
                    .await?;
                client.batch_execute("COMMIT").await
            }
            .await;
            if let Err(error) = applied {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(error.into());
            }
            tracing::info!(version, description, "journal schema migrated");
        }
        Ok(())
    }
    .await;
    client
        .batch_execute("SELECT pg_advisory_unlock(hashtext('turnstile.migrate'))")
        .await?;
    outcome
}

/// What one append changes in the indexes, as the `append` function takes it.
#[derive(Default)]
struct IndexArgs {
    created: Option<(String, Option<String>)>,
    queued_runs: Vec<String>,
    queued_agents: Vec<String>,
    queued_seqs: Vec<i64>,
    status_runs: Vec<String>,
    statuses: Vec<String>,
    terminal: Vec<bool>,
    keys: Vec<String>,
    key_runs: Vec<String>,
    deleted: bool,
}

impl IndexArgs {
    /// The index rules ([`chain::index_changes`]) as the function's arguments.
    fn add(&mut self, seq: Seq, event: &Event) {
        for change in chain::index_changes(event) {
            match change {
                IndexChange::RunQueued { run_id, agent_id } => {
                    self.queued_runs.push(run_id.as_str().to_owned());
                    self.queued_agents.push(agent_id.to_owned());
                    self.queued_seqs.push(seq.0 as i64);
                }
                IndexChange::SessionCreated { agent_id, user_id } => {
                    self.created = Some((agent_id.to_owned(), user_id.map(str::to_owned)));
                }
                IndexChange::SessionDeleted => self.deleted = true,
                IndexChange::KeyBound { key, run_id } => {
                    self.keys.push(key.to_owned());
                    self.key_runs.push(run_id.as_str().to_owned());
                }
                IndexChange::RunStatus {
                    run_id,
                    status,
                    terminal,
                } => {
                    self.status_runs.push(run_id.as_str().to_owned());
                    self.statuses.push(char::from(status).to_string());
                    self.terminal.push(terminal);
                }
            }
        }
    }
}

/// Appends the requests of one shard, one after the other.
async fn appender(inner: std::sync::Weak<Inner>, mut receiver: mpsc::Receiver<Request>) {
    while let Some(request) = receiver.recv().await {
        let Some(inner) = inner.upgrade() else {
            let _ = request.reply.send(Err(Error::Stopped));
            continue;
        };
        let Request {
            session_id,
            expected,
            events,
            reply,
        } = request;
        let started = Instant::now();
        let answer = append_one(&inner, &session_id, expected, events).await;
        if answer.as_ref().is_ok_and(|answer| answer.is_ok()) {
            inner
                .stats
                .record_sync(started.elapsed().as_micros() as u64, 1);
            inner.appended.notify_one();
            let _ = inner.touched.send(session_id.clone());
        }
        let _ = reply.send(answer);
    }
}

async fn head_of(
    inner: &Inner,
    client: &deadpool_postgres::Client,
    session_id: &SessionId,
    cached: bool,
) -> Result<Head, Error> {
    if cached
        && let Some(head) = inner
            .heads
            .lock()
            .ok()
            .and_then(|heads| heads.get(session_id).copied())
    {
        return Ok(head);
    }
    let row = client
        .query_opt(
            "SELECT next_seq, head_hash FROM turnstile.streams WHERE session_id = $1",
            &[&session_id.as_str()],
        )
        .await?;
    let head = match row {
        None => Head::EMPTY,
        Some(row) => {
            let hash: Vec<u8> = row.get(1);
            Head {
                next_seq: Seq(row.get::<_, i64>(0) as u64),
                last_hash: hash
                    .try_into()
                    .map_err(|_| Error::Store("malformed stream head".into()))?,
            }
        }
    };
    remember(inner, session_id, head);
    Ok(head)
}

fn remember(inner: &Inner, session_id: &SessionId, head: Head) {
    if let Ok(mut heads) = inner.heads.lock() {
        if heads.len() >= limits::SESSION_HEADS_CACHED_MAX {
            heads.clear();
        }
        heads.insert(session_id.clone(), head);
    }
}

/// One call of `turnstile.append`: an append's sealed records and what they change.
struct AppendCall<'a> {
    session_id: &'a SessionId,
    owner: &'a str,
    /// The lease's fencing token; `None` takes a free lease.
    epoch: Option<i64>,
    expected: Seq,
    /// The hash of the last record.
    head_hash: &'a Hash,
    records: &'a [Vec<u8>],
    digests: &'a [Vec<u8>],
    blobs: &'a [Vec<u8>],
    /// The session's creation time, when the records create it.
    ts_us: i64,
    index: &'a IndexArgs,
}

/// Runs the append: its row is `(status, next_seq, head_hash, lease_epoch, owner)`.
async fn call_append(
    client: &deadpool_postgres::Client,
    call: AppendCall<'_>,
) -> Result<tokio_postgres::Row, Error> {
    let statement = client
        .prepare_cached(
            "SELECT status, next_seq, head_hash, lease_epoch, owner FROM turnstile.append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
        )
        .await?;
    let index = call.index;
    let (created_agent, created_user) = match &index.created {
        Some((agent, user)) => (Some(agent.as_str()), user.as_deref()),
        None => (None, None),
    };
    Ok(client
        .query_one(
            &statement,
            &[
                &call.session_id.as_str(),
                &call.owner,
                &call.epoch,
                &(call.expected.0 as i64),
                &call.head_hash.as_slice(),
                &call.records,
                &call.digests,
                &call.blobs,
                &created_agent,
                &created_user,
                &call.ts_us,
                &index.queued_runs,
                &index.queued_agents,
                &index.queued_seqs,
                &index.status_runs,
                &index.statuses,
                &index.terminal,
                &index.keys,
                &index.key_runs,
                &index.deleted,
            ],
        )
        .await?)
}

async fn append_one(
    inner: &Inner,
    session_id: &SessionId,
    expected: Expected,
    events: Vec<codec::EncodedEvent>,
) -> AppendResult {
    let client = inner.pool.get().await?;
    let mut cached = true;
    loop {
        let epoch = match inner
            .leases
            .lock()
            .ok()
            .and_then(|leases| leases.get(session_id).copied())
        {
            Some(LeaseState::Held { epoch, .. }) => Some(epoch),
            Some(LeaseState::Lost) => {
                return Err(Error::Fenced {
                    session_id: session_id.to_string(),
                });
            }
            None => None,
        };
        let me = inner
            .replica_id
            .lock()
            .map(|id| id.clone())
            .unwrap_or_default();
        let head = head_of(inner, &client, session_id, cached).await?;
        if let Expected::Next(expected) = expected
            && expected != head.next_seq
        {
            if cached {
                // The cache may be behind another process's appends: ask the database.
                cached = false;
                continue;
            }
            return Ok(Err(Conflict {
                session_id: session_id.clone(),
                expected,
                actual: head.next_seq,
            }));
        }
        let ts_us = now_us();
        let (sealed, at) = chain::seal(session_id, head, ts_us, &events)?;
        let mut records = Vec::with_capacity(events.len());
        let mut recorded = Vec::with_capacity(events.len());
        let mut digests: Vec<Vec<u8>> = Vec::new();
        let mut blobs: Vec<Vec<u8>> = Vec::new();
        let mut index = IndexArgs::default();
        for (sealed, event) in sealed.into_iter().zip(&events) {
            let mut size_bytes = sealed.bytes.len();
            if let Some((digest, apart)) = &event.apart {
                size_bytes += apart.len();
                digests.push(digest.to_vec());
                blobs.push(apart.clone());
            }
            index.add(sealed.seq, &event.event);
            recorded.push(Recorded {
                pos: JournalPos(0),
                session_id: session_id.clone(),
                seq: sealed.seq,
                ts_us,
                prev_hash: sealed.prev_hash,
                hash: sealed.hash,
                size_bytes,
                event: event.event.clone(),
            });
            records.push(sealed.bytes);
        }
        let row = call_append(
            &client,
            AppendCall {
                session_id,
                owner: &me,
                epoch,
                expected: head.next_seq,
                head_hash: &at.last_hash,
                records: &records,
                digests: &digests,
                blobs: &blobs,
                ts_us,
                index: &index,
            },
        )
        .await?;
        let status: String = row.get(0);
        let actual = Seq(row.get::<_, i64>(1) as u64);
        match status.as_str() {
            "owned" => {
                return Err(Error::Owned {
                    session_id: session_id.to_string(),
                    owner: row.get::<_, Option<String>>(4).unwrap_or_default(),
                });
            }
            "fenced" => {
                if let Ok(mut leases) = inner.leases.lock() {
                    leases.insert(session_id.clone(), LeaseState::Lost);
                }
                return Err(Error::Fenced {
                    session_id: session_id.to_string(),
                });
            }
            _ => {
                let epoch: i64 = row.get(3);
                if let Ok(mut leases) = inner.leases.lock() {
                    match leases.get_mut(session_id) {
                        Some(LeaseState::Held { epoch: held, .. }) => *held = epoch,
                        // Taken by the append itself (a caller that never asked for it).
                        _ => {
                            leases
                                .insert(session_id.clone(), LeaseState::Held { epoch, holders: 0 });
                        }
                    }
                }
            }
        }
        if status == "conflict" {
            let hash: Vec<u8> = row.get(2);
            let last_hash: Hash = hash
                .try_into()
                .map_err(|_| Error::Store("malformed stream head".into()))?;
            remember(
                inner,
                session_id,
                Head {
                    next_seq: actual,
                    last_hash,
                },
            );
            match expected {
                Expected::Next(expected) if expected != actual => {
                    return Ok(Err(Conflict {
                        session_id: session_id.clone(),
                        expected,
                        actual,
                    }));
                }
                // The cache was behind: try again on the real head.
                _ => {
                    cached = true;
                    continue;
                }
            }
        }
        remember(inner, session_id, at);
        if recorded.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        // Durable now; visible once positioned.
        let last_seq = recorded.last().map(|record| record.seq.0).unwrap_or(0) as i64;
        let last_pos = position(&client, session_id, last_seq).await?;
        let first_pos = last_pos + 1 - recorded.len() as u64;
        inner.next_pos.fetch_max(last_pos + 1, Ordering::SeqCst);
        return Ok(Ok(recorded
            .into_iter()
            .enumerate()
            .map(|(offset, mut record)| {
                record.pos = JournalPos(first_pos + offset as u64);
                Arc::new(record)
            })
            .collect()));
    }
}

/// Waits until the record `(session, seq)` has a global position, positioning what has
/// finished meanwhile; an older transaction still running holds it back.
async fn position(
    client: &deadpool_postgres::Client,
    session_id: &SessionId,
    seq: i64,
) -> Result<u64, Error> {
    let statement = client
        .prepare_cached("SELECT turnstile.position_records($1, $2, $3)")
        .await?;
    // Short waits: what holds a record back is another append's transaction, which
    // lasts a statement (a long one is an operator's, and waits a little longer).
    let mut tries = 0u32;
    loop {
        let row = client
            .query_one(&statement, &[&session_id.as_str(), &seq, &POSITION_BATCH])
            .await?;
        if let Some(pos) = row.get::<_, Option<i64>>(0) {
            return Ok(pos as u64);
        }
        tries += 1;
        if tries > 3 {
            tokio::time::sleep(Duration::from_millis(if tries > 100 { 10 } else { 1 })).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

/// Follows the positions other processes give, so `next_pos` and the live feed include
/// their records.
async fn follower(inner: std::sync::Weak<Inner>) {
    let mut cursor: Option<u64> = None;
    let mut last_tail = Instant::now();
    loop {
        let (appended, pool) = match inner.upgrade() {
            Some(inner) if !inner.closed.load(Ordering::SeqCst) => {
                (inner.appended.clone(), inner.pool.clone())
            }
            _ => return,
        };
        let _ =
            tokio::time::timeout(Duration::from_millis(FOLLOW_POLL_MS), appended.notified()).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if last_tail.elapsed() >= Duration::from_millis(limits::POSITION_TAIL_MS) {
            last_tail = Instant::now();
            if let Err(error) = position_tail(&pool).await {
                tracing::debug!(%error, "positioning the journal's tail failed; retrying");
            }
        }
        let followed = follow_once(&strong, &pool, &mut cursor).await;
        if let Err(error) = followed {
            tracing::warn!(%error, "following the PostgreSQL journal failed; retrying");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Positions the records of finished transactions that no appender positioned: an
/// appender positions its own records (and every finished one before them) right after
/// its commit, but a process killed between the two leaves its last commit unpositioned,
/// so unreadable, until the next append anywhere; on a journal that goes idle then,
/// nobody would. Cheap when nothing waits (a partial index of unpositioned records).
async fn position_tail(pool: &Pool) -> Result<(), Error> {
    let client = pool.get().await?;
    let statement = client
        .prepare_cached("SELECT turnstile.position_records($1, $2, $3)")
        .await?;
    client
        .query_one(&statement, &[&"", &-1i64, &POSITION_BATCH])
        .await?;
    Ok(())
}

async fn follow_once(inner: &Inner, pool: &Pool, cursor: &mut Option<u64>) -> Result<(), Error> {
    let client = pool.get().await?;
    let row = client
        .query_one("SELECT next_pos FROM turnstile.positions", &[])
        .await?;
    let next = row.get::<_, i64>(0) as u64;
    let from = cursor.unwrap_or(next);
    if inner.live.receiver_count() == 0 {
        *cursor = Some(next);
        inner.next_pos.fetch_max(next, Ordering::SeqCst);
        return Ok(());
    }
    let mut at = from;
    while at < next {
        let rows = client
            .query(
                "SELECT pos, record FROM turnstile.events WHERE pos >= $1 AND pos < $2 \
                 ORDER BY pos LIMIT $3",
                &[&(at as i64), &(next as i64), &PAGE_RECORDS],
            )
            .await?;
        if rows.is_empty() {
            break;
        }
        for row in rows {
            let pos = row.get::<_, i64>(0) as u64;
            let bytes: Vec<u8> = row.get(1);
            let record = decode(&client, &bytes, JournalPos(pos), Hashing::Compute).await?;
            at = pos + 1;
            inner.next_pos.fetch_max(at, Ordering::SeqCst);
            let _ = inner.live.send(Arc::new(record));
        }
    }
    *cursor = Some(at);
    inner.next_pos.fetch_max(at, Ordering::SeqCst);
    Ok(())
}

/// An iterator over pages that a closure fetches: `(items, next cursor, last page)`.
struct Paged<T, F> {
    fetch: F,
    cursor: u64,
    page: std::vec::IntoIter<Result<T, Error>>,
    done: bool,
}

impl<T, F> Paged<T, F>
where
    F: FnMut(u64) -> Result<(Vec<Result<T, Error>>, u64, bool), Error>,
{
    fn new(cursor: u64, fetch: F) -> Self {
        Paged {
            fetch,
            cursor,
            page: Vec::new().into_iter(),
            done: false,
        }
    }
}

impl<T, F> Iterator for Paged<T, F>
where
    F: FnMut(u64) -> Result<(Vec<Result<T, Error>>, u64, bool), Error>,
{
    type Item = Result<T, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(item) = self.page.next() {
                if item.is_err() {
                    self.done = true;
                    self.page = Vec::new().into_iter();
                }
                return Some(item);
            }
            if self.done {
                return None;
            }
            match (self.fetch)(self.cursor) {
                Ok((page, cursor, last)) => {
                    self.cursor = cursor;
                    self.done = last;
                    if page.is_empty() {
                        return None;
                    }
                    self.page = page.into_iter();
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
    }
}

/// One record of an import, checked: its bytes as exported, its event.
pub(crate) struct ImportedRecord {
    pub(crate) seq: Seq,
    pub(crate) bytes: Vec<u8>,
    pub(crate) hash: Hash,
    pub(crate) apart: Option<(Hash, Vec<u8>)>,
    pub(crate) event: Event,
}

impl PgJournal {
    /// Appends records of one session exactly as given (an import's), in one
    /// transaction, and waits for their positions, which it returns.
    pub(crate) fn import_records(
        &self,
        session_id: &SessionId,
        records: Vec<ImportedRecord>,
    ) -> Result<Vec<JournalPos>, Error> {
        let Some(first) = records.first() else {
            return Ok(Vec::new());
        };
        let first_seq = first.seq;
        let mut index = IndexArgs::default();
        let mut bytes = Vec::with_capacity(records.len());
        let mut digests = Vec::new();
        let mut blobs = Vec::new();
        let mut created_us = 0;
        let mut last_hash = [0; 32];
        for record in records {
            index.add(record.seq, &record.event);
            if matches!(record.event, Event::SessionCreated { .. })
                && let Ok(body) = codec::decode(&record.bytes)
            {
                created_us = body.ts_us;
            }
            if let Some((digest, apart)) = record.apart {
                digests.push(digest.to_vec());
                blobs.push(apart);
            }
            last_hash = record.hash;
            bytes.push(record.bytes);
        }
        let count = bytes.len() as u64;
        let pool = self.inner.pool.clone();
        let session = session_id.clone();
        let me = self.replica_id();
        let last_pos = self.block(async move {
            let client = pool.get().await?;
            let row = call_append(
                &client,
                AppendCall {
                    session_id: &session,
                    owner: &me,
                    // An import takes the lease as it appends (an empty database).
                    epoch: None,
                    expected: first_seq,
                    head_hash: &last_hash,
                    records: &bytes,
                    digests: &digests,
                    blobs: &blobs,
                    ts_us: created_us,
                    index: &index,
                },
            )
            .await?;
            let status: String = row.get(0);
            if status != "ok" {
                return Err(Error::Store(format!(
                    "importing session {session} from sequence {first_seq}: the database's stream is at {}",
                    row.get::<_, i64>(1)
                )));
            }
            position(&client, &session, (first_seq.0 + count - 1) as i64).await
        })?;
        self.inner
            .next_pos
            .fetch_max(last_pos + 1, Ordering::SeqCst);
        if let Ok(mut heads) = self.inner.heads.lock() {
            heads.remove(session_id);
        }
        Ok((0..count)
            .map(|offset| JournalPos(last_pos + 1 - count + offset))
            .collect())
    }
}

/// A lease as this replica knows it.
#[derive(Debug, Clone, Copy)]
enum LeaseState {
    /// Held, with its fencing token and how many here hold it (an actor each).
    Held { epoch: i64, holders: u32 },
    /// Lost (the heartbeat lapsed, or an append was fenced): appends are refused here
    /// until the session is acquired again.
    Lost,
}

/// Runs `future` on the backend's runtime and awaits it from any runtime.
async fn spawn_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    future: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    handle.spawn(future).await.map_err(|_| Error::Stopped)?
}

fn interval_ms(lease: Duration) -> f64 {
    lease.as_secs_f64() * 1000.0
}

/// Registers this process among the replicas, and retires its own earlier incarnation
/// (a restart under the same name), whose sessions are then taken over at once.
async fn register(
    client: &tokio_postgres::Client,
    replica_id: &str,
    name: &str,
    lease: Duration,
) -> Result<(), Error> {
    client
        .execute(
            "UPDATE turnstile.replicas SET expires_at = now() WHERE name = $1 AND expires_at > now()",
            &[&name],
        )
        .await?;
    client
        .execute(
            "INSERT INTO turnstile.replicas (replica_id, name, expires_at) \
             VALUES ($1, $2, now() + $3 * interval '1 millisecond')",
            &[&replica_id, &name, &interval_ms(lease)],
        )
        .await?;
    Ok(())
}

/// Renews this replica's heartbeat every fifth of its lease. A renewal the database
/// refuses (the row expired: the others consider this replica dead) or none for most
/// of a lease (this replica cannot reach the database, so its leases may be taken)
/// loses every lease: appends of those sessions are refused here from then on, the
/// runtime is told (it stops their turns), and the replica registers again.
async fn heartbeat(inner: std::sync::Weak<Inner>) {
    let Some(lease) = inner.upgrade().map(|inner| inner.lease) else {
        return;
    };
    let every = lease / 5;
    // The local deadline is counted from when the last good renewal was sent: the
    // database computed its expiry later than that.
    let margin = lease / 5;
    let mut last_good = Instant::now();
    let mut own: Option<tokio_postgres::Client> = None;
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        let sent = Instant::now();
        let me = inner
            .replica_id
            .lock()
            .map(|id| id.clone())
            .unwrap_or_default();
        // A connection of its own: appends that wait for their positions hold pooled
        // connections, and must not starve the heartbeat.
        let renewed = tokio::time::timeout(every, async {
            let client = match own.take() {
                Some(client) if !client.is_closed() => client,
                _ => {
                    let (client, connection) = inner.config.connect(NoTls).await?;
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    client
                }
            };
            let rows = client
                .query(
                    "UPDATE turnstile.replicas SET expires_at = now() + $2 * interval '1 millisecond' \
                     WHERE replica_id = $1 AND expires_at > now() RETURNING 1",
                    &[&me, &interval_ms(lease)],
                )
                .await?;
            Ok::<_, Error>((!rows.is_empty(), client))
        })
        .await;
        match renewed {
            Ok(Ok((true, client))) => {
                own = Some(client);
                last_good = sent;
            }
            Ok(Ok((false, client))) => {
                lapse(&inner, &client, "the database says its heartbeat expired").await;
                own = Some(client);
            }
            Ok(Err(_)) | Err(_) if last_good.elapsed() + margin >= lease => {
                // Fenced locally first: the others may take the leases any moment now.
                lapse_locally(
                    &inner,
                    "it could not renew its heartbeat for most of its lease",
                );
                last_good = Instant::now();
            }
            _ => {}
        }
    }
}

/// Every lease is lost: appends of those sessions are refused here from now on, and the
/// runtime is told (it stops their turns). The replica registers again at the next
/// heartbeat that reaches the database (a new id: `turnstile.alive` of the old one is
/// over).
fn lapse_locally(inner: &Inner, why: &str) {
    let lost = inner
        .leases
        .lock()
        .map(|mut leases| {
            let mut lost = 0;
            for state in leases.values_mut() {
                if matches!(state, LeaseState::Held { .. }) {
                    lost += 1;
                }
                *state = LeaseState::Lost;
            }
            lost
        })
        .unwrap_or(0);
    tracing::error!(
        lost,
        "this replica lost its leases: {why}; it stops their turns and registers again"
    );
    inner.lapses.send_modify(|count| *count += 1);
    if let Ok(mut id) = inner.replica_id.lock() {
        // Until it registers, an id no row has: its leases and appends are refused.
        *id = format!("lapsed-{}", uuid::Uuid::now_v7());
    }
}

/// The database said this replica's heartbeat expired: every lease is lost, and it
/// registers again under a new id on the heartbeat's connection.
async fn lapse(inner: &Inner, client: &tokio_postgres::Client, why: &str) {
    lapse_locally(inner, why);
    let replica_id = uuid::Uuid::now_v7().to_string();
    match register(client, &replica_id, &inner.replica_name, inner.lease).await {
        Ok(()) => {
            if let Ok(mut id) = inner.replica_id.lock() {
                *id = replica_id;
            }
        }
        Err(error) => {
            tracing::error!(%error, "registering again failed; retrying at the next heartbeat")
        }
    }
}

/// A notification: its channel and payload.
#[derive(Debug, Clone)]
pub(crate) struct Notice {
    channel: String,
    payload: String,
}

/// Commands for a replica (payload: its id).
const INBOX_CHANNEL: &str = "turnstile_inbox";
/// Answers to commands (payload: the command's id).
const REPLIES_CHANNEL: &str = "turnstile_replies";
/// Streams that grew (payload: session ids, comma-separated).
const EVENTS_CHANNEL: &str = "turnstile_events";
/// Not a database channel: the listening connection came back, so notifications may
/// have been missed.
const RESYNC: &str = "";

/// Sends a notification in a transaction of its own, after the change it announces
/// has committed, and without waiting for a WAL flush (a notification is a hint; a
/// NOTIFY inside the change's transaction would serialize commits database-wide).
async fn notify(client: &deadpool_postgres::Client, channel: &str, payload: &str) {
    let sent = async {
        client
            .batch_execute("BEGIN; SET LOCAL synchronous_commit = off")
            .await?;
        client
            .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
            .await?;
        client.batch_execute("COMMIT").await
    }
    .await;
    if let Err(error) = sent {
        let _ = client.batch_execute("ROLLBACK").await;
        tracing::debug!(%error, channel, "a notification was not sent (the others poll)");
    }
}

/// Announces the sessions this replica appended to, a few milliseconds' worth at a time.
async fn notifier(inner: std::sync::Weak<Inner>, mut touched: mpsc::UnboundedReceiver<SessionId>) {
    while let Some(first) = touched.recv().await {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut sessions = std::collections::BTreeSet::from([first.as_str().to_owned()]);
        while let Ok(more) = touched.try_recv() {
            sessions.insert(more.as_str().to_owned());
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let Ok(client) = inner.pool.get().await else {
            continue;
        };
        // A payload holds at most 8,000 bytes.
        let mut payload = String::new();
        for session in sessions {
            if payload.len() + session.len() + 1 > 7_900 {
                notify(&client, EVENTS_CHANNEL, &payload).await;
                payload.clear();
            }
            if !payload.is_empty() {
                payload.push(',');
            }
            payload.push_str(&session);
        }
        notify(&client, EVENTS_CHANNEL, &payload).await;
    }
}

/// One connection of its own, outside the pool, that LISTENs and hands notifications
/// on; it reconnects when it drops, and says so (notifications may have been missed).
async fn listener(inner: std::sync::Weak<Inner>) {
    loop {
        let Some(config) = inner.upgrade().map(|inner| inner.config.clone()) else {
            return;
        };
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let (sender, mut received) = mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(Ok(message)) = futures::StreamExt::next(&mut messages).await {
                        if let tokio_postgres::AsyncMessage::Notification(notification) = message {
                            let _ = sender.send(Notice {
                                channel: notification.channel().to_owned(),
                                payload: notification.payload().to_owned(),
                            });
                        }
                    }
                });
                let listening = client
                    .batch_execute(&format!(
                        "LISTEN {INBOX_CHANNEL}; LISTEN {REPLIES_CHANNEL}; LISTEN {EVENTS_CHANNEL}"
                    ))
                    .await;
                if listening.is_ok() {
                    if let Some(inner) = inner.upgrade() {
                        let _ = inner.notices.send(Notice {
                            channel: RESYNC.into(),
                            payload: String::new(),
                        });
                    }
                    while let Some(notice) = received.recv().await {
                        let Some(inner) = inner.upgrade() else {
                            return;
                        };
                        if inner.closed.load(Ordering::SeqCst) {
                            return;
                        }
                        let _ = inner.notices.send(notice);
                    }
                }
                driver.abort();
            }
            Err(error) => tracing::debug!(%error, "the listening connection failed; retrying"),
        }
        match inner.upgrade() {
            Some(inner) if !inner.closed.load(Ordering::SeqCst) => {}
            _ => return,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
