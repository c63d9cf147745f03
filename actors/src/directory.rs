//! The directory: every session's listing facts and its part of the daily metrics, kept
//! in memory and updated at each turning point of a session, so a page of `GET
//! /sessions` costs the page and `GET /metrics` the days it returns, whatever the
//! number of sessions.
//!
//! It is loaded when the runtime opens, from the session index and each session's
//! stored form (plus the records after it), and then follows the session actors.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use turnstile_journal::{Journal, SessionId};
use turnstile_projections::{DayCounts, SessionView};

use crate::api::RuntimeError;

/// The token keys of agno's daily `token_metrics`, in its order.
pub const TOKEN_KEYS: [&str; 7] = [
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost",
];

/// One session as the directory lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectoryEntry {
    /// The session.
    pub session_id: SessionId,
    /// Its agent.
    pub agent_id: String,
    /// The client's user id.
    pub user_id: Option<String>,
    /// Creation time, microseconds since the epoch.
    pub created_at_us: i64,
    /// agno's session name.
    pub name: String,
}

/// One day of agno's daily metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DayTotals {
    /// Sessions created that day.
    pub sessions: u64,
    /// Runs created that day.
    pub runs: u64,
    /// Distinct users of those runs, with how many sessions name each.
    pub users: HashMap<String, u64>,
    /// Token totals, in [`TOKEN_KEYS`] order.
    pub tokens: [f64; 7],
    /// Completed runs per (model, provider).
    pub models: BTreeMap<(String, String), u64>,
}

struct Listed {
    entry: DirectoryEntry,
    days: BTreeMap<String, DayCounts>,
}

type Order = BTreeSet<(i64, SessionId)>;

#[derive(Default)]
struct Inner {
    sessions: HashMap<SessionId, Listed>,
    by_created: Order,
    by_agent: HashMap<String, Order>,
    by_user: HashMap<String, Order>,
    days: BTreeMap<String, DayTotals>,
}

/// Which sessions a listing wants.
#[derive(Debug, Clone, Default)]
pub struct SessionFilter {
    /// Only this agent's.
    pub agent_id: Option<String>,
    /// Only this user's.
    pub user_id: Option<String>,
    /// Only those whose name contains this (case-insensitive).
    pub name_contains: Option<String>,
}

/// The directory of sessions (see the module doc).
#[derive(Default)]
pub struct Directory {
    inner: Mutex<Inner>,
}

fn day_key(date: &str) -> String {
    date.to_owned()
}

impl Inner {
    fn remove(&mut self, session_id: &SessionId) {
        let Some(listed) = self.sessions.remove(session_id) else {
            return;
        };
        let key = (listed.entry.created_at_us, session_id.clone());
        self.by_created.remove(&key);
        if let Some(order) = self.by_agent.get_mut(&listed.entry.agent_id) {
            order.remove(&key);
        }
        if let Some(user) = &listed.entry.user_id
            && let Some(order) = self.by_user.get_mut(user)
        {
            order.remove(&key);
        }
        let created = turnstile_projections::date_of_us(listed.entry.created_at_us);
        self.day(&created, |day| {
            day.sessions = day.sessions.saturating_sub(1)
        });
        for (date, counts) in &listed.days {
            self.day(date, |day| {
                day.runs = day.runs.saturating_sub(counts.runs);
                for user in &counts.users {
                    if let Some(n) = day.users.get_mut(user) {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            day.users.remove(user);
                        }
                    }
                }
                for (index, key) in TOKEN_KEYS.iter().enumerate() {
                    day.tokens[index] -= counts.tokens.get(*key).copied().unwrap_or(0.0);
                }
                for (model, provider, count) in &counts.models {
                    let key = (model.clone(), provider.clone());
                    if let Some(n) = day.models.get_mut(&key) {
                        *n = n.saturating_sub(*count);
                        if *n == 0 {
                            day.models.remove(&key);
                        }
                    }
                }
            });
        }
    }

    fn add(&mut self, entry: DirectoryEntry, days: BTreeMap<String, DayCounts>) {
        let key = (entry.created_at_us, entry.session_id.clone());
        self.by_created.insert(key.clone());
        self.by_agent
            .entry(entry.agent_id.clone())
            .or_default()
            .insert(key.clone());
        if let Some(user) = &entry.user_id {
            self.by_user.entry(user.clone()).or_default().insert(key);
        }
        let created = turnstile_projections::date_of_us(entry.created_at_us);
        self.day(&created, |day| day.sessions += 1);
        for (date, counts) in &days {
            self.day(date, |day| {
                day.runs += counts.runs;
                for user in &counts.users {
                    *day.users.entry(user.clone()).or_default() += 1;
                }
                for (index, key) in TOKEN_KEYS.iter().enumerate() {
                    day.tokens[index] += counts.tokens.get(*key).copied().unwrap_or(0.0);
                }
                for (model, provider, count) in &counts.models {
                    *day.models
                        .entry((model.clone(), provider.clone()))
                        .or_default() += count;
                }
            });
        }
        self.sessions
            .insert(entry.session_id.clone(), Listed { entry, days });
    }

    fn day(&mut self, date: &str, change: impl FnOnce(&mut DayTotals)) {
        let day = self.days.entry(day_key(date)).or_default();
        change(day);
        if day.sessions == 0 && day.runs == 0 && day.models.is_empty() {
            self.days.remove(date);
        }
    }
}

impl Directory {
    /// Loads every existing session: its stored form, and the records after it.
    pub(crate) fn load(journal: &Journal) -> Result<Directory, RuntimeError> {
        let directory = Directory::default();
        for entry in journal.sessions()? {
            let state = crate::reads::load_session(journal, &entry.session_id)?;
            directory.update(&entry.session_id, &state.session);
        }
        Ok(directory)
    }

    /// Follows a session's facts (a deleted session leaves the directory).
    pub(crate) fn update(&self, session_id: &SessionId, session: &SessionView) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let exists = !session.agent_id.is_empty() && !session.deleted;
        if let Some(listed) = inner.sessions.get(session_id)
            && exists
            && listed.days == session.days
            && listed.entry.name == session.name
        {
            return;
        }
        inner.remove(session_id);
        if exists {
            inner.add(
                DirectoryEntry {
                    session_id: session_id.clone(),
                    agent_id: session.agent_id.clone(),
                    user_id: session.user_id.clone(),
                    created_at_us: session.created_at_us,
                    name: session.name.clone(),
                },
                session.days.clone(),
            );
        }
    }

    /// Sessions listed.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .map(|inner| inner.sessions.len())
            .unwrap_or(0)
    }

    /// Whether no session is listed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One page of the sessions that pass `filter`, by creation time (newest first when
    /// `descending`), and how many pass it. The page costs its own length plus what it
    /// skips; only a name filter looks at every session of the narrowest index.
    pub fn page(
        &self,
        filter: &SessionFilter,
        descending: bool,
        skip: usize,
        limit: usize,
    ) -> (Vec<DirectoryEntry>, usize) {
        let Ok(inner) = self.inner.lock() else {
            return (Vec::new(), 0);
        };
        let empty = Order::new();
        let order = match (&filter.agent_id, &filter.user_id) {
            (Some(agent), _) => inner.by_agent.get(agent).unwrap_or(&empty),
            (None, Some(user)) => inner.by_user.get(user).unwrap_or(&empty),
            (None, None) => &inner.by_created,
        };
        let name = filter
            .name_contains
            .as_ref()
            .map(|name| name.to_lowercase());
        let passes = |(_, session_id): &&(i64, SessionId)| {
            let Some(listed) = inner.sessions.get(session_id) else {
                return false;
            };
            let entry = &listed.entry;
            filter
                .agent_id
                .as_ref()
                .is_none_or(|a| a == &entry.agent_id)
                && filter
                    .user_id
                    .as_ref()
                    .is_none_or(|u| entry.user_id.as_ref() == Some(u))
                && name
                    .as_ref()
                    .is_none_or(|name| entry.name.to_lowercase().contains(name))
        };
        // Counted without filtering when the index is exactly the filter.
        let exact = name.is_none() && (filter.agent_id.is_none() || filter.user_id.is_none());
        let iter: Box<dyn Iterator<Item = &(i64, SessionId)>> = if descending {
            Box::new(order.iter().rev())
        } else {
            Box::new(order.iter())
        };
        let entry_of = |key: &(i64, SessionId)| inner.sessions.get(&key.1).map(|l| l.entry.clone());
        if exact {
            let page = iter.skip(skip).take(limit).filter_map(entry_of).collect();
            return (page, order.len());
        }
        let mut total = 0;
        let mut page = Vec::new();
        for key in iter.filter(passes) {
            if total >= skip && page.len() < limit {
                page.extend(entry_of(key));
            }
            total += 1;
        }
        (page, total)
    }

    /// The daily metrics, oldest day first.
    pub fn days(&self) -> Vec<(String, DayTotals)> {
        self.inner
            .lock()
            .map(|inner| {
                inner
                    .days
                    .iter()
                    .map(|(date, day)| (date.clone(), day.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}
