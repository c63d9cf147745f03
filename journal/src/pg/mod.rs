//! The PostgreSQL backend: one journal that several processes can share.
//! This file opens the journal and holds what every part shares; `schema` has the
//! migrations, `append` the appender (group commit) and `batch` one batch's call,
//! `follower` the live feed in position order, `projections` the stored projections
//! written behind, `baseline` the database's own single-row INSERT, `reads` the readers, `replicas` the heartbeat and leases, `inbox` the commands and
//! notifications between replicas, `audit` the verification, `import` the importer,
//! `errors` how the driver's failures map to the journal's.
//!
//! Records are turnstile's own record bytes (format 3), one row each, keyed by session
//! and sequence. Appends go by group commit (`append`, `batch`): the appends waiting at
//! one moment, of many sessions, are one call of the `turnstile.append_batch` function
//! (one round trip, one transaction, one WAL flush), which checks each stream's head
//! and lease under its row lock and refuses an append alone. Global positions are given
//! in that transaction, from a counter row locked first and held to the commit: they
//! are contiguous from 0 and become visible in order, so a reader of positions never
//! passes a record that a later commit would put before it. An append answers once
//! its records are durable; every process reads a record at the same position
//! (`docs/decisions/0004-postgres-group-commit.md`).
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

use crate::chain::{self, Head};
use crate::codec;
use crate::event::Event;
use crate::ids::{JournalPos, SessionId};
use crate::pg::append::appender;
use crate::pg::errors::{DATABASE_ADDRESS, address_of, database_away};
use crate::pg::follower::follower;
use crate::pg::inbox::{Notice, listener, notifier};
use crate::pg::replicas::{LeaseState, heartbeat, register};
use crate::pg::schema::migrate;
use crate::types::AppendResult;
use crate::types::{
    AppendQueueFull, Expected, JournalOptions, JournalStats, Recorded, StatsSnapshot,
};
use crate::{Error, limits};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use std::collections::HashMap;
use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use tokio_postgres::NoTls;

mod append;
mod audit;
pub(crate) mod baseline;
mod batch;
mod errors;
mod follower;
mod import;
mod inbox;
mod projections;
mod reads;
mod replicas;
mod schema;

pub(crate) use import::PgImport;

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
    /// The appender's queue (`None` once closed).
    appender: Mutex<Option<mpsc::Sender<Request>>>,
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
    /// Sessions appended to here, for the `turnstile_events` notification.
    touched: mpsc::UnboundedSender<SessionId>,
    /// The server process id of the notifier's connection (its notifications come back
    /// to this replica's listener, which drops them).
    notifier_pid: std::sync::atomic::AtomicI32,
    /// Other replicas are alive (as of registration or the last heartbeat; set when one
    /// says it started, or when the listener reconnects): this one's appends are
    /// notified to them. Alone, nobody listens.
    others: AtomicBool,
    /// The connection settings, for the listening connection.
    config: tokio_postgres::Config,
    next_pos: Arc<AtomicU64>,
    live: broadcast::Sender<Arc<Recorded>>,
    /// Stored projections on their way to the database (`projections.rs`).
    projections: Mutex<projections::Pending>,
    /// Wakes the projections' writer.
    projections_waiting: Arc<Notify>,
    /// The live feed's next position and this replica's records waiting to go on it.
    feed: Mutex<follower::Feed>,
    /// Wakes the follower after a local append that found others' records before it.
    appended: Arc<Notify>,
    stats: Arc<JournalStats>,
    max_event_bytes: usize,
    closed: AtomicBool,
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
        let pool = pool_of(config, options.pool_size)?;
        let url = redacted(&options.url);
        let replica_id = uuid::Uuid::now_v7().to_string();
        let (next_pos, others) = {
            let pool = pool.clone();
            let url = url.clone();
            let replica_id = replica_id.clone();
            let name = options.replica_name.clone();
            let lease = options.lease;
            block_on(&handle, start_up(pool, url, replica_id, name, lease))?
        };
        let (live, _) = broadcast::channel(limits::LIVE_BROADCAST_RECORDS);
        let inner = Arc::new(Inner {
            runtime: Mutex::new(Some(runtime)),
            handle: handle.clone(),
            pool,
            url,
            appender: Mutex::new(None),
            heads: Mutex::new(HashMap::new()),
            next_pos: Arc::new(AtomicU64::new(next_pos)),
            live,
            feed: Mutex::new(follower::Feed::new(next_pos)),
            projections: Mutex::new(projections::Pending::default()),
            projections_waiting: Arc::new(Notify::new()),
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
            notifier_pid: std::sync::atomic::AtomicI32::new(0),
            others: AtomicBool::new(others),
            config: listen_config,
        });
        let (sender, receiver) = mpsc::channel(limits::APPEND_QUEUE_REQUESTS_MAX);
        handle.spawn(appender(Arc::downgrade(&inner), receiver));
        *inner.appender.lock().map_err(|_| Error::Stopped)? = Some(sender);
        handle.spawn(follower(Arc::downgrade(&inner)));
        handle.spawn(projections::writer(Arc::downgrade(&inner)));
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

    /// Runs `work` with a pooled connection on the backend's runtime and waits for its
    /// answer: the one way a synchronous call of this backend reaches the database.
    pub(super) fn with_client<T, F, W>(&self, work: W) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, Error>> + Send + 'static,
        W: FnOnce(deadpool_postgres::Client) -> F + Send + 'static,
    {
        let pool = self.inner.pool.clone();
        self.block(async move { work(pool.get().await?).await })
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
            let appender = self.inner.appender.lock().map_err(|_| Error::Stopped)?;
            appender.as_ref().ok_or(Error::Stopped)?.clone()
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

    pub(crate) fn live(&self) -> broadcast::Receiver<Arc<Recorded>> {
        self.inner.live.subscribe()
    }

    /// One round trip to the database (`SELECT 1`), within the pool's timeouts.
    pub(crate) fn writable(&self) -> Result<(), Error> {
        self.with_client(move |client| async move {
            tokio::time::timeout(
                Duration::from_millis(limits::POSTGRES_WAIT_MS),
                client.simple_query("SELECT 1"),
            )
            .await
            .map_err(|_| Error::Unavailable(database_away()))??;
            Ok(())
        })
    }

    pub(crate) fn close(&self) -> Result<(), Error> {
        let first = !self.inner.closed.load(Ordering::SeqCst);
        self.inner.close();
        if first {
            self.flush_projections();
            // Others take this replica's sessions at once rather than after its lease.
            let me = self.replica_id();
            let _ = self.with_client(move |client| async move {
                client
                    .execute(
                        &client
                            .prepare_cached(
                                "UPDATE turnstile.streams SET owner = NULL WHERE owner = $1",
                            )
                            .await?,
                        &[&me],
                    )
                    .await?;
                client
                    .execute(
                        &client
                            .prepare_cached("DELETE FROM turnstile.replicas WHERE replica_id = $1")
                            .await?,
                        &[&me],
                    )
                    .await?;
                Ok(())
            });
        }
        Ok(())
    }
}

impl Inner {
    /// Caches a stream's head (what the next append is sealed on), bounded.
    fn remember_head(&self, session_id: &SessionId, head: crate::chain::Head) {
        if let Ok(mut heads) = self.heads.lock() {
            if heads.len() >= limits::SESSION_HEADS_CACHED_MAX {
                heads.clear();
            }
            heads.insert(session_id.clone(), head);
        }
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Dropping the sender lets the appender answer what it holds and end.
        if let Ok(mut appender) = self.appender.lock() {
            appender.take();
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

/// The connection pool: bounded waits, so a database away answers within a
/// request's time, never a hang.
fn pool_of(config: tokio_postgres::Config, pool_size: usize) -> Result<Pool, Error> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(pool_size.max(2))
        // A database away answers within a request's time, never a hang.
        .wait_timeout(Some(Duration::from_millis(limits::POSTGRES_WAIT_MS)))
        .create_timeout(Some(Duration::from_millis(limits::POSTGRES_WAIT_MS)))
        .recycle_timeout(Some(Duration::from_millis(limits::POSTGRES_WAIT_MS)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|error| Error::Store(format!("PostgreSQL connection pool: {error}")))
}

/// What opening does on the database: connects, migrates the schema, refuses a
/// server that acknowledges commits before they are durable, registers this replica,
/// and reads the next position (and whether other replicas are alive).
async fn start_up(
    pool: Pool,
    url: String,
    replica_id: String,
    name: String,
    lease: Duration,
) -> Result<(u64, bool), Error> {
    let client = pool.get().await.map_err(|error| match Error::from(error) {
        Error::Store(reason) => Error::Store(format!("cannot connect to {url}: {reason}")),
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
    let others = register(&client, &replica_id, &name, lease).await?;
    let row = client
        .query_one(
            &client
                .prepare_cached("SELECT next_pos FROM turnstile.positions")
                .await?,
            &[],
        )
        .await?;
    Ok((row.get::<_, i64>(0) as u64, others))
}

/// Runs `future` on the backend's runtime and waits for it on a plain channel. Called
/// from a worker of a multi-threaded tokio runtime (an HTTP handler's), the wait tells
/// that runtime first (`block_in_place`), which hands the worker's other tasks to
/// another thread: a slow database stalls the caller, never the requests beside it.
fn block_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    future: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    let (done, wait) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = done.send(future.await);
    });
    let on_worker = tokio::runtime::Handle::try_current().is_ok_and(|current| {
        current.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
    });
    let answer = if on_worker {
        tokio::task::block_in_place(|| wait.recv())
    } else {
        wait.recv()
    };
    answer.map_err(|_| Error::Stopped)?
}

fn stored_id<T: FromStr>(text: String) -> Result<T, Error> {
    text.parse()
        .map_err(|_| Error::Store(format!("malformed id {text:?} in the journal's tables")))
}
