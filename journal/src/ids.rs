//! Identities and positions as newtypes, so a sequence is never passed where a
//! position was meant.
//!
//! Session and run ids are strings on the wire (agno's clients choose their own
//! session ids); new ones are UUIDv7 so they sort by creation. Ids are restricted to a
//! safe alphabet because they also name keys in the store and, later, folders on disk.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::limits::ID_BYTES_MAX;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Empty ids are refused.
    #[error("id is empty")]
    Empty,
    /// Longer than [`ID_BYTES_MAX`].
    #[error("id is longer than {ID_BYTES_MAX} bytes")]
    TooLong,
    /// Holds a character outside `A-Z a-z 0-9 . _ : -`, or is `.` / `..`.
    #[error("id may only hold letters, digits and . _ : - (got {0:?})")]
    BadChar(String),
}

fn check_id(text: &str) -> Result<(), IdError> {
    if text.is_empty() {
        return Err(IdError::Empty);
    }
    if text.len() > ID_BYTES_MAX {
        return Err(IdError::TooLong);
    }
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if !text.chars().all(safe) || text == "." || text == ".." {
        return Err(IdError::BadChar(text.to_owned()));
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// A new, time-ordered id (UUIDv7).
            pub fn new_v7() -> Self {
                Self(uuid::Uuid::now_v7().to_string())
            }
            /// Checks and wraps a client-supplied id.
            pub fn parse(text: &str) -> Result<Self, IdError> {
                check_id(text)?;
                Ok(Self(text.to_owned()))
            }
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(text: &str) -> Result<Self, IdError> {
                Self::parse(text)
            }
        }
    };
}

string_id!(
    /// One conversation with one agent: one actor, one journal stream.
    SessionId
);
string_id!(
    /// One turn of a session, across all its attempts.
    RunId
);

macro_rules! number_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl $name {
            /// The next one.
            pub fn next(self) -> Self {
                Self(self.0 + 1)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

number_id!(
    /// Position of a record within its session's stream, contiguous from 0.
    Seq
);
number_id!(
    /// Position of a record across the whole journal, contiguous from 0.
    JournalPos
);
number_id!(
    /// Position of an event within its run's client-visible stream, contiguous from 0.
    EventIndex
);
