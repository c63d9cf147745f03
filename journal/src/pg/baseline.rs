//! The database's own pace, for comparison (`tests/benches/replicas.rs`): single-row
//! `INSERT`s of a record's size in autocommit (one round trip, one commit, one WAL flush
//! each) on a table of their own, beside the journal's schema.

use crate::Error;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// The latency of each single-row `INSERT` made for `seconds`, on a connection of its
/// own (table `turnstile_baseline_rows`, created if missing).
pub async fn insert_round_trips(url: &str, seconds: f64) -> Result<Vec<Duration>, Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    let driver = tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS turnstile_baseline_rows \
             (id bigserial PRIMARY KEY, body bytea NOT NULL)",
        )
        .await?;
    let insert = client
        .prepare("INSERT INTO turnstile_baseline_rows (body) VALUES ($1)")
        .await?;
    let body = vec![7u8; 400];
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let started = Instant::now();
        client.execute(&insert, &[&body]).await?;
        latencies.push(started.elapsed());
    }
    drop(client);
    let _ = driver.await;
    Ok(latencies)
}
