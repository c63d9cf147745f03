//! The directory: every session's listing facts and its part of the daily metrics, kept
//! in memory and updated at each turning point of a session, so a page of `GET
//! /sessions` costs the page and `GET /metrics` the days it returns, whatever the
//! number of sessions.
//!
//! It is loaded when the runtime opens, from the session index and each session's
//! stored form (plus the records after it), and then follows the session actors (and,
//! on a shared journal, the other replicas' records from the position taken before it
//! was loaded: `runtime/cluster.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use turnstile_journal::{Journal, SessionId, codec};
use turnstile_projections::{DayCounts, SessionView};

use crate::api::RuntimeError;

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
    /// Token totals, in [`turnstile_projections::DayCounts::tokens`]' order.
    pub tokens: [f64; 7],
    /// Completed runs per (model, provider).
    pub models: BTreeMap<(String, String), u64>,
}

/// A session's listing, kept small: one of these lives for every session.
struct Listed {
    agent_id: Arc<str>,
    user_id: Option<Arc<str>>,
    created_at_us: i64,
    name: Box<str>,
    /// What the session added to each day, encoded (one allocation instead of a
    /// dozen: it is read back only when the session changes or leaves).
    days: Box<[u8]>,
}

/// The compact form of a session's days in [`Listed`].
fn encode_days(days: &[(String, DayCounts)]) -> Box<[u8]> {
    codec::encode_compact(days).into_boxed_slice()
}

fn decode_days(bytes: &[u8]) -> Vec<(String, DayCounts)> {
    codec::decode_compact(bytes).unwrap_or_default()
}

/// Adds what one session did on a day to that day's totals.
fn add_counts(day: &mut DayTotals, counts: &DayCounts) {
    day.runs += counts.runs;
    for user in &counts.users {
        *day.users.entry(user.clone()).or_default() += 1;
    }
    for (total, added) in day.tokens.iter_mut().zip(counts.tokens) {
        *total += added;
    }
    for (model, provider, count) in &counts.models {
        *day.models
            .entry((model.clone(), provider.clone()))
            .or_default() += count;
    }
}

/// Sessions by creation time; the id is shared with the map's key.
type Order = BTreeSet<(i64, Arc<str>)>;

#[derive(Default)]
struct Inner {
    sessions: HashMap<Arc<str>, Listed>,
    by_created: Order,
    by_agent: HashMap<Arc<str>, Order>,
    by_user: HashMap<Arc<str>, Order>,
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

/// An interned string: the one the index already holds, else a new one.
fn intern<V>(map: &HashMap<Arc<str>, V>, text: &str) -> Arc<str> {
    map.get_key_value(text)
        .map(|(key, _)| key.clone())
        .unwrap_or_else(|| Arc::from(text))
}

impl Inner {
    fn remove(&mut self, session_id: &str) {
        let Some((id, listed)) = self.sessions.remove_entry(session_id) else {
            return;
        };
        let key = (listed.created_at_us, id);
        self.by_created.remove(&key);
        if let Some(order) = self.by_agent.get_mut(&listed.agent_id) {
            order.remove(&key);
        }
        if let Some(user) = &listed.user_id
            && let Some(order) = self.by_user.get_mut(user)
        {
            order.remove(&key);
        }
        let created = turnstile_projections::date_of_us(listed.created_at_us);
        self.day(&created, |day| {
            day.sessions = day.sessions.saturating_sub(1)
        });
        for (date, counts) in decode_days(&listed.days).iter() {
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
                for (total, added) in day.tokens.iter_mut().zip(counts.tokens) {
                    *total -= added;
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

    fn add(&mut self, session_id: &SessionId, session: &SessionView, days: Box<[u8]>) {
        let id: Arc<str> = Arc::from(session_id.as_str());
        let agent_id = intern(&self.by_agent, &session.agent_id);
        let user_id = session
            .user_id
            .as_deref()
            .map(|user| intern(&self.by_user, user));
        let key = (session.created_at_us, id.clone());
        self.by_created.insert(key.clone());
        self.by_agent
            .entry(agent_id.clone())
            .or_default()
            .insert(key.clone());
        if let Some(user) = &user_id {
            self.by_user.entry(user.clone()).or_default().insert(key);
        }
        let created = turnstile_projections::date_of_us(session.created_at_us);
        self.day(&created, |day| day.sessions += 1);
        for (date, counts) in &session.days {
            self.day(date, |day| add_counts(day, counts));
        }
        self.sessions.insert(
            id,
            Listed {
                agent_id,
                user_id,
                created_at_us: session.created_at_us,
                name: session.name.clone().into_boxed_str(),
                days,
            },
        );
    }

    fn day(&mut self, date: &str, change: impl FnOnce(&mut DayTotals)) {
        let day = self.days.entry(date.to_owned()).or_default();
        change(day);
        if day.sessions == 0 && day.runs == 0 && day.models.is_empty() {
            self.days.remove(date);
        }
    }

    fn entry(&self, session_id: &Arc<str>) -> Option<DirectoryEntry> {
        let listed = self.sessions.get(session_id)?;
        Some(DirectoryEntry {
            session_id: SessionId::parse(session_id).ok()?,
            agent_id: listed.agent_id.to_string(),
            user_id: listed.user_id.as_deref().map(str::to_owned),
            created_at_us: listed.created_at_us,
            name: listed.name.to_string(),
        })
    }
}

/// Sessions whose stored forms a directory's load reads together.
const DIRECTORY_LOAD_SESSIONS: usize = 500;

impl Directory {
    /// Loads every existing session: its stored form, and the records after it.
    pub(crate) fn load(journal: &Journal) -> Result<Directory, RuntimeError> {
        let directory = Directory::default();
        let sessions: Vec<SessionId> = journal
            .sessions()?
            .into_iter()
            .map(|entry| entry.session_id)
            .collect();
        // Stored forms a few hundred at a time (one round trip each on PostgreSQL); a
        // session whose stored form is behind its stream, or holds an open run, is read
        // alone.
        for chunk in sessions.chunks(DIRECTORY_LOAD_SESSIONS) {
            let facts = crate::reads::current_facts(journal, chunk)?;
            for (session_id, facts) in chunk.iter().zip(facts) {
                match facts {
                    Some(session) => directory.update(session_id, &session),
                    None => {
                        let state = crate::reads::load_session(journal, session_id)?;
                        directory.update(session_id, &state.session);
                    }
                }
            }
        }
        Ok(directory)
    }

    /// Follows a session's facts (a deleted session leaves the directory).
    pub(crate) fn update(&self, session_id: &SessionId, session: &SessionView) {
        let days = encode_days(&session.days);
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let exists = !session.agent_id.is_empty() && !session.deleted;
        if let Some(listed) = inner.sessions.get(session_id.as_str())
            && exists
            && listed.days == days
            && *listed.name == *session.name
        {
            return;
        }
        inner.remove(session_id.as_str());
        if exists {
            inner.add(session_id, session, days);
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
            (Some(agent), _) => inner.by_agent.get(agent.as_str()).unwrap_or(&empty),
            (None, Some(user)) => inner.by_user.get(user.as_str()).unwrap_or(&empty),
            (None, None) => &inner.by_created,
        };
        let name = filter
            .name_contains
            .as_ref()
            .map(|name| name.to_lowercase());
        let passes = |(_, session_id): &&(i64, Arc<str>)| {
            let Some(listed) = inner.sessions.get(session_id) else {
                return false;
            };
            filter
                .agent_id
                .as_deref()
                .is_none_or(|a| a == &*listed.agent_id)
                && filter
                    .user_id
                    .as_deref()
                    .is_none_or(|u| listed.user_id.as_deref() == Some(u))
                && name
                    .as_ref()
                    .is_none_or(|name| listed.name.to_lowercase().contains(name))
        };
        // Counted without filtering when the index is exactly the filter.
        let exact = name.is_none() && (filter.agent_id.is_none() || filter.user_id.is_none());
        let iter: Box<dyn Iterator<Item = &(i64, Arc<str>)>> = if descending {
            Box::new(order.iter().rev())
        } else {
            Box::new(order.iter())
        };
        let entry_of = |key: &(i64, Arc<str>)| inner.entry(&key.1);
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

    /// The daily metrics of one user's sessions (per-user isolation), oldest day
    /// first; costs that user's sessions, not everyone's.
    pub fn days_of(&self, user_id: &str) -> Vec<(String, DayTotals)> {
        let Ok(inner) = self.inner.lock() else {
            return Vec::new();
        };
        let mut days: BTreeMap<String, DayTotals> = BTreeMap::new();
        for (_, session_id) in inner.by_user.get(user_id).into_iter().flatten() {
            let Some(listed) = inner.sessions.get(session_id) else {
                continue;
            };
            let created = turnstile_projections::date_of_us(listed.created_at_us);
            days.entry(created).or_default().sessions += 1;
            for (date, counts) in decode_days(&listed.days) {
                add_counts(days.entry(date).or_default(), &counts);
            }
        }
        days.into_iter().collect()
    }

    /// The user a listed session belongs to: `None` when the directory does not list
    /// it (not yet followed from another replica, or no such session), `Some(None)`
    /// for a session created without a user.
    pub fn owner(&self, session_id: &SessionId) -> Option<Option<String>> {
        let inner = self.inner.lock().ok()?;
        let listed = inner.sessions.get(session_id.as_str())?;
        Some(listed.user_id.as_deref().map(str::to_owned))
    }
}
