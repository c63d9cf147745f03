//! What replicas tell each other: commands left for a session's owner and their replies,
//! and notifications (LISTEN on a connection of its own, each NOTIFY after the change it
//! announces has committed).

use crate::ids::SessionId;
use crate::pg::replicas::{REPLICAS_CHANNEL, spawn_on};
use crate::pg::{Inner, PgJournal, stored_id};
use crate::{Command, Error};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc};
use tokio_postgres::NoTls;

impl PgJournal {
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
                    &client.prepare_cached("INSERT INTO turnstile.inbox (session_id, target, kind, body) VALUES ($1, $2, $3, $4) RETURNING id").await?,
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
                        &client.prepare_cached("SELECT state, reply, turnstile.alive(target) FROM turnstile.inbox WHERE id = $1").await?,
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
                            &client.prepare_cached("UPDATE turnstile.inbox SET state = 'abandoned' WHERE id = $1 AND state = 'pending'").await?,
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
        let me = self.replica_id();
        self.with_client(move |client| async move {
            let rows = client
                .query(
                    &client
                        .prepare_cached(
                            "UPDATE turnstile.inbox SET state = 'taken' WHERE id IN ( \
                       SELECT id FROM turnstile.inbox WHERE target = $1 AND state = 'pending' \
                       ORDER BY id FOR UPDATE SKIP LOCKED) \
                     RETURNING id, session_id, kind, body",
                        )
                        .await?,
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
        self.with_client(move |client| async move {
            client
                .execute(
                    &client
                        .prepare_cached(
                            "UPDATE turnstile.inbox SET state = 'done', reply = $2 WHERE id = $1",
                        )
                        .await?,
                    &[&id, &reply],
                )
                .await?;
            notify(&client, REPLIES_CHANNEL, &id.to_string()).await;
            Ok(())
        })
    }
}
/// A notification: its channel and payload.
#[derive(Debug, Clone)]
pub(crate) struct Notice {
    pub(super) channel: String,
    pub(super) payload: String,
    /// This replica's own `turnstile_events`, handed on locally (the database's copy of
    /// it is dropped): it wakes local waiters, not the follower (nothing new to read).
    pub(super) own: bool,
}

/// Commands for a replica (payload: its id).
pub(super) const INBOX_CHANNEL: &str = "turnstile_inbox";
/// Answers to commands (payload: the command's id).
pub(super) const REPLIES_CHANNEL: &str = "turnstile_replies";
/// Streams that grew (payload: session ids, comma-separated).
pub(super) const EVENTS_CHANNEL: &str = "turnstile_events";
/// Not a database channel: the listening connection came back, so notifications may
/// have been missed.
pub(super) const RESYNC: &str = "";

/// A notification in a transaction of its own, whose commit waits for no flush
/// (`set_config` local to it): one statement, one round trip.
const NOTIFY: &str = "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)";

/// Sends a notification in a transaction of its own, after the change it announces
/// has committed, and without waiting for a WAL flush (a notification is a hint; a
/// NOTIFY inside the change's transaction would serialize commits database-wide).
pub(super) async fn notify(client: &deadpool_postgres::Client, channel: &str, payload: &str) {
    let sent = async {
        let statement = client.prepare_cached(NOTIFY).await?;
        client.execute(&statement, &[&channel, &payload]).await
    }
    .await;
    if let Err(error) = sent {
        tracing::debug!(%error, channel, "a notification was not sent (the others poll)");
    }
}

/// Announces the sessions this replica appended to: at once, with every session
/// appended to while the last notification was on its way; to this replica's own
/// waiters first, then, on a connection of its own (whose notifications this replica's
/// listener drops), to the others.
pub(super) async fn notifier(
    inner: std::sync::Weak<Inner>,
    mut touched: mpsc::UnboundedReceiver<SessionId>,
) {
    let mut own: Option<(tokio_postgres::Client, tokio_postgres::Statement)> = None;
    while let Some(first) = touched.recv().await {
        let mut sessions = std::collections::BTreeSet::from([first.as_str().to_owned()]);
        while let Ok(more) = touched.try_recv() {
            sessions.insert(more.as_str().to_owned());
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // A payload holds at most 8,000 bytes.
        let mut payloads = vec![String::new()];
        for session in sessions {
            let payload = payloads.last_mut().expect("one at least");
            if !payload.is_empty() && payload.len() + session.len() + 1 > 7_900 {
                payloads.push(session);
                continue;
            }
            if !payload.is_empty() {
                payload.push(',');
            }
            payload.push_str(&session);
        }
        for payload in &payloads {
            inner.notify_locally(payload.clone());
        }
        // Alone: nobody else listens (a replica that starts says so at once).
        if !inner.others.load(Ordering::SeqCst) {
            continue;
        }
        let (client, statement) = match own.take() {
            Some((client, statement)) if !client.is_closed() => (client, statement),
            _ => match notifying_connection(&inner).await {
                Ok(connection) => connection,
                Err(error) => {
                    tracing::debug!(%error, "no connection to notify on (the others poll)");
                    continue;
                }
            },
        };
        for payload in &payloads {
            let sent = client
                .execute(&statement, &[&EVENTS_CHANNEL, payload])
                .await;
            if let Err(error) = sent {
                tracing::debug!(%error, "a notification was not sent (the others poll)");
            }
        }
        own = Some((client, statement));
    }
}

impl Inner {
    /// Tells this replica's own waiters that streams grew (`payload`: session ids).
    pub(super) fn notify_locally(&self, payload: String) {
        let _ = self.notices.send(Notice {
            channel: EVENTS_CHANNEL.into(),
            payload,
            own: true,
        });
    }
}

/// The notifier's own connection and its statement ([`NOTIFY`]); its server process id
/// is kept, so the listener knows this replica's notifications when they come back.
async fn notifying_connection(
    inner: &Inner,
) -> Result<(tokio_postgres::Client, tokio_postgres::Statement), Error> {
    let (client, connection) = inner.config.connect(NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let row = client.query_one("SELECT pg_backend_pid()", &[]).await?;
    inner
        .notifier_pid
        .store(row.get::<_, i32>(0), Ordering::SeqCst);
    let statement = client.prepare(NOTIFY).await?;
    Ok((client, statement))
}

/// Whether other replicas are alive, as the database says (`true` when it cannot say:
/// the appends are then announced, which costs the others nothing but a read).
async fn others_alive(client: &tokio_postgres::Client, inner: &Inner) -> bool {
    let me = inner
        .replica_id
        .lock()
        .map(|id| id.clone())
        .unwrap_or_default();
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM turnstile.replicas o \
             WHERE o.replica_id <> $1 AND o.expires_at > now())",
            &[&me],
        )
        .await
        .map_or(true, |row| row.get::<_, bool>(0))
}

/// One connection of its own, outside the pool, that LISTENs and hands notifications
/// on; it reconnects when it drops, and says so (notifications may have been missed).
pub(super) async fn listener(inner: std::sync::Weak<Inner>) {
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
                            let _ = sender.send((
                                notification.process_id(),
                                Notice {
                                    channel: notification.channel().to_owned(),
                                    payload: notification.payload().to_owned(),
                                    own: false,
                                },
                            ));
                        }
                    }
                });
                let listening = client
                    .batch_execute(&format!(
                        "LISTEN {INBOX_CHANNEL}; LISTEN {REPLIES_CHANNEL}; LISTEN {EVENTS_CHANNEL}; \
                         LISTEN {REPLICAS_CHANNEL}"
                    ))
                    .await;
                if listening.is_ok() {
                    if let Some(inner) = inner.upgrade() {
                        // A replica may have started meanwhile: asked now that this
                        // one listens (one that registers later says so on the channel).
                        let others = others_alive(&client, &inner).await;
                        inner.others.store(others, Ordering::SeqCst);
                        let _ = inner.notices.send(Notice {
                            channel: RESYNC.into(),
                            payload: String::new(),
                            own: false,
                        });
                    }
                    while let Some((sender, notice)) = received.recv().await {
                        let Some(inner) = inner.upgrade() else {
                            return;
                        };
                        if inner.closed.load(Ordering::SeqCst) {
                            return;
                        }
                        if notice.channel == REPLICAS_CHANNEL {
                            let me = inner.replica_id.lock().map(|id| id.clone());
                            if me.is_ok_and(|me| me != notice.payload) {
                                inner.others.store(true, Ordering::SeqCst);
                            }
                            continue;
                        }
                        // This replica's own, handed on locally already.
                        if notice.channel == EVENTS_CHANNEL
                            && sender == inner.notifier_pid.load(Ordering::SeqCst)
                        {
                            continue;
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
