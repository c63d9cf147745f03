//! How PostgreSQL's failures become the journal's: a connection-level failure (the
//! database does not answer, the pool timed out) is `Unavailable` and names the database's
//! `host:port`, never its password; a refusal with a server code keeps its meaning.

use crate::Error;

/// The journal's database as a client may be told of it: `host:port`, never the
/// password (set when a PostgreSQL journal opens).
pub(super) static DATABASE_ADDRESS: std::sync::RwLock<String> =
    std::sync::RwLock::new(String::new());

/// "the journal's database (host:port) does not answer".
pub(super) fn database_away() -> String {
    let address = DATABASE_ADDRESS
        .read()
        .map(|address| address.clone())
        .unwrap_or_default();
    format!("the journal's database ({address}) does not answer")
}

pub(super) fn address_of(config: &tokio_postgres::Config) -> String {
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
