//! [`JournalConfig`]: where a journal lives, and opening it whichever backend that is.
//! The one thing above this crate that names a backend; a new backend is a variant here
//! and a folder beside `sled/` and `pg/`.

use crate::{Error, Journal, JournalOptions, PostgresOptions};

/// Where a journal lives: the one thing above this crate that knows there is more than
/// one backend. A new backend is a new variant here and a folder beside `sled/` and
/// `pg/`; nothing above `journal/` changes.
#[derive(Debug, Clone)]
pub enum JournalConfig {
    /// The embedded sled journal in this data directory (one process).
    Sled(std::path::PathBuf),
    /// A PostgreSQL journal that several processes may share.
    Postgres(PostgresOptions),
}

impl Journal {
    /// Opens the journal `config` names, whichever backend it is.
    pub fn open_config(config: &JournalConfig, options: JournalOptions) -> Result<Journal, Error> {
        match config {
            JournalConfig::Sled(dir) => Journal::open(dir, options),
            JournalConfig::Postgres(postgres) => Journal::open_postgres(postgres, options),
        }
    }

    /// Opens the journal `config` names only if it holds one already (a command that
    /// reads a journal must not create an empty one): [`Error::Missing`] otherwise.
    pub fn open_existing(
        config: &JournalConfig,
        options: JournalOptions,
    ) -> Result<Journal, Error> {
        if let JournalConfig::Sled(dir) = config
            && !dir.join("db").exists()
        {
            return Err(Error::Missing {
                location: dir.display().to_string(),
            });
        }
        Journal::open_config(config, options)
    }
}
