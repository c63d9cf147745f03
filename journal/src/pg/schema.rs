//! The schema and its migrations: the versions this build knows, each applied once, in
//! order, under an advisory lock so processes starting together do not race.

use crate::Error;

/// The schema versions this build knows, in order: (version, description, SQL).
pub(super) const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "streams, records, positions, indexes",
        include_str!("../../migrations/0001_journal.sql"),
    ),
    (
        2,
        "decisions handed to a session's owner",
        include_str!("../../migrations/0002_decide.sql"),
    ),
    (
        3,
        "group commit: appends of many sessions in one transaction, positioned in it",
        include_str!("../../migrations/0003_group_commit.sql"),
    ),
    (
        4,
        "a batch of one append by scalar statements; leaner acquire; turnstile.alive keeps its plan",
        include_str!("../../migrations/0004_lone_append.sql"),
    ),
    (
        5,
        "a batch of one append that changes no index by seven arguments",
        include_str!("../../migrations/0005_plain_append.sql"),
    ),
];

/// Creates or migrates the schema, one version per transaction, under an advisory lock
/// so processes starting together apply each version once.
pub(super) async fn migrate(client: &deadpool_postgres::Client) -> Result<(), Error> {
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
