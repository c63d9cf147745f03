//! Replicas and leases: each process registers with a heartbeat on the database's clock;
//! a session's lease carries a fencing token that every append checks; a lapsed heartbeat
//! loses every lease at once, and sessions whose owner is gone can be claimed.

use crate::ids::SessionId;
use crate::pg::{Inner, PgJournal, stored_id};
use crate::{Error, Lease};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

impl PgJournal {
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
        let me = self.replica_id();
        let session = session_id.as_str().to_owned();
        let (status, epoch, owner, next_seq): (String, Option<i64>, Option<String>, Option<i64>) =
            self.with_client(move |client| async move {
                let row = client
                    .query_one(
                        &client
                            .prepare_cached(
                                "SELECT status, lease_epoch, owner, next_seq \
                                 FROM turnstile.acquire($1, $2)",
                            )
                            .await?,
                        &[&session, &me],
                    )
                    .await?;
                Ok((row.get(0), row.get(1), row.get(2), row.get(3)))
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
                        // Taken again by an actor that held it (`Journal::retake`).
                        Some(LeaseState::Released { holders }) => {
                            let holders = *holders;
                            leases.insert(session_id.clone(), LeaseState::Held { epoch, holders });
                        }
                        _ => {
                            leases
                                .insert(session_id.clone(), LeaseState::Held { epoch, holders: 1 });
                        }
                    }
                }
                // Another replica may have written since this one's cache was filled; an
                // empty stream's head is known (a new session's first append reads none).
                if next_seq == Some(0) {
                    self.inner
                        .remember_head(session_id, crate::chain::Head::EMPTY);
                } else if let Ok(mut heads) = self.inner.heads.lock() {
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

    /// Whether the append that ended the session's last run gave its lease back while
    /// actors here still hold it.
    pub(crate) fn lease_given_back(&self, session_id: &SessionId) -> bool {
        self.inner
            .leases
            .lock()
            .map(|leases| matches!(leases.get(session_id), Some(LeaseState::Released { .. })))
            .unwrap_or(false)
    }

    /// Whether the session's stream is known to hold no records: this replica holds its
    /// lease (nobody else appends to it) and the head it keeps for it is the empty
    /// stream's, as the database last answered (the lease's acquisition, or an append's
    /// refusal), with no append of this replica since.
    pub(crate) fn known_empty(&self, session_id: &SessionId) -> bool {
        let held = self
            .inner
            .leases
            .lock()
            .map(|leases| matches!(leases.get(session_id), Some(LeaseState::Held { .. })))
            .unwrap_or(false);
        held && self
            .inner
            .heads
            .lock()
            .map(|heads| heads.get(session_id) == Some(&crate::chain::Head::EMPTY))
            .unwrap_or(false)
    }

    /// Whether this replica holds the session's lease now.
    pub(crate) fn holds_lease(&self, session_id: &SessionId) -> bool {
        self.inner
            .leases
            .lock()
            .map(|leases| {
                matches!(
                    leases.get(session_id),
                    Some(LeaseState::Held { .. } | LeaseState::Released { .. })
                )
            })
            .unwrap_or(false)
    }

    /// Whether the record `(session_id, seq)` is before the stream's head as this replica
    /// last appended to it or read it for an append (so its actor folded it).
    pub(crate) fn seen_here(&self, session_id: &SessionId, seq: crate::ids::Seq) -> bool {
        self.inner
            .heads
            .lock()
            .ok()
            .and_then(|heads| heads.get(session_id).map(|head| seq < head.next_seq))
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
                Some(LeaseState::Released { holders }) if *holders > 1 => {
                    *holders -= 1;
                    return;
                }
                // Given back already, with the append that ended its last run.
                Some(LeaseState::Lost | LeaseState::Released { .. }) => {
                    leases.remove(session_id);
                    return;
                }
                None => return,
            }
        };
        let me = self.replica_id();
        let session = session_id.as_str().to_owned();
        let released = self.with_client(move |client| async move {
            client
                .execute(
                    &client
                        .prepare_cached(
                            "UPDATE turnstile.streams SET owner = NULL \
                     WHERE session_id = $1 AND owner = $2 AND lease_epoch = $3",
                        )
                        .await?,
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
        let limit = limit.min(i32::MAX as usize) as i32;
        self.with_client(move |client| async move {
            let rows = client
                .query(
                    &client
                        .prepare_cached("SELECT session_id FROM turnstile.claimable($1)")
                        .await?,
                    &[&limit],
                )
                .await?;
            rows.into_iter().map(|row| stored_id(row.get(0))).collect()
        })
    }

    /// A receiver that changes whenever this replica's heartbeat lapsed (every lease
    /// it held was lost then).
    pub(crate) fn lapses(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.lapses.subscribe()
    }
}
/// A lease as this replica knows it.
#[derive(Debug, Clone, Copy)]
pub(super) enum LeaseState {
    /// Held, with its fencing token and how many here hold it (an actor each).
    Held { epoch: i64, holders: u32 },
    /// Lost (the heartbeat lapsed, or an append was fenced): appends are refused here
    /// until the session is acquired again.
    Lost,
    /// Given back by the append that ended the session's last open run, while actors
    /// here still hold it: their next append takes it again if it is still free
    /// (`owned` when another replica took it meanwhile), and their release costs no
    /// round trip.
    Released { holders: u32 },
}

/// Runs `future` on the backend's runtime and awaits it from any runtime.
pub(super) async fn spawn_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    future: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    handle.spawn(future).await.map_err(|_| Error::Stopped)?
}

pub(super) fn interval_ms(lease: Duration) -> f64 {
    lease.as_secs_f64() * 1000.0
}

/// A replica registered (payload: its id): the others notify their appends from then on.
pub(super) const REPLICAS_CHANNEL: &str = "turnstile_replicas";

/// Registers this process among the replicas, and retires its own earlier incarnation
/// (a restart under the same name), whose sessions are then taken over at once.
/// Answers whether other replicas are alive.
pub(super) async fn register(
    client: &tokio_postgres::Client,
    replica_id: &str,
    name: &str,
    lease: Duration,
) -> Result<bool, Error> {
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
    // The others notify their appends from now on (a replica alone does not).
    let row = client
        .query_one(
            "SELECT pg_notify($1, $2), EXISTS (SELECT 1 FROM turnstile.replicas o \
             WHERE o.replica_id <> $2 AND o.expires_at > now())",
            &[&REPLICAS_CHANNEL, &replica_id],
        )
        .await?;
    Ok(row.get(1))
}

/// Renews this replica's heartbeat every fifth of its lease. A renewal the database
/// refuses (the row expired: the others consider this replica dead) or none for most
/// of a lease (this replica cannot reach the database, so its leases may be taken)
/// loses every lease: appends of those sessions are refused here from then on, the
/// runtime is told (it stops their turns), and the replica registers again.
pub(super) async fn heartbeat(inner: std::sync::Weak<Inner>) {
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
            // With whether other replicas are alive (they listen for this one's appends).
            let rows = client
                .query(
                    "UPDATE turnstile.replicas SET expires_at = now() + $2 * interval '1 millisecond' \
                     WHERE replica_id = $1 AND expires_at > now() \
                     RETURNING EXISTS (SELECT 1 FROM turnstile.replicas o \
                                        WHERE o.replica_id <> $1 AND o.expires_at > now())",
                    &[&me, &interval_ms(lease)],
                )
                .await?;
            let others = rows.first().map(|row| row.get::<_, bool>(0));
            Ok::<_, Error>((others, client))
        })
        .await;
        match renewed {
            Ok(Ok((Some(others), client))) => {
                inner.others.store(others, Ordering::SeqCst);
                own = Some(client);
                last_good = sent;
            }
            Ok(Ok((None, client))) => {
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
pub(super) fn lapse_locally(inner: &Inner, why: &str) {
    let lost = inner
        .leases
        .lock()
        .map(|mut leases| {
            let mut lost = 0;
            for state in leases.values_mut() {
                if matches!(state, LeaseState::Held { .. } | LeaseState::Released { .. }) {
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
pub(super) async fn lapse(inner: &Inner, client: &tokio_postgres::Client, why: &str) {
    lapse_locally(inner, why);
    let replica_id = uuid::Uuid::now_v7().to_string();
    match register(client, &replica_id, &inner.replica_name, inner.lease).await {
        Ok(others) => {
            if let Ok(mut id) = inner.replica_id.lock() {
                *id = replica_id;
            }
            inner.others.store(others, Ordering::SeqCst);
        }
        Err(error) => {
            tracing::error!(%error, "registering again failed; retrying at the next heartbeat")
        }
    }
}
