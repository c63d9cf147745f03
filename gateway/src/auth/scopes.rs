//! agno's scopes for the routes turnstile serves (spec `authorization.md`, the table),
//! and how a token's scopes meet them: `resource:action` for every resource of a type,
//! `resource:<id>:action` for one agent, `resource:*:action` for all, the admin scope
//! for everything; `system:` is agno's legacy name for `config:`.
//!
//! Pure functions of the method, the path and the token's scopes: the middleware in
//! `auth` applies them; nothing here reads a request or the journal.

use axum::http::Method;

/// What one route needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The scope (`resource:action`); `None`: the admin scope only.
    pub scope: Option<&'static str>,
    /// The agent the path names (percent-decoded, as the route reads it), which a
    /// per-agent scope may grant.
    pub agent_id: Option<String>,
    /// The route reads or drives sessions and runs: under `user_isolation` it is
    /// scoped to the caller's own, and needs a token with a `sub`.
    pub per_user: bool,
    /// `GET /agents`: without the scope for every agent the listing is filtered by
    /// per-agent scopes instead of refused (as agno does).
    pub listing: bool,
}

impl Requirement {
    /// The scope a `403` names.
    pub fn named<'s>(&self, admin_scope: &'s str) -> &'s str {
        self.scope.unwrap_or(admin_scope)
    }
}

/// The requirement of a route, or `None` for a route the table does not name (an
/// unknown path or method: a valid token is enough to be told `404` or `405`). The
/// path is split into segments before each is percent-decoded, as the router does, so
/// `%2F` never makes a segment of its own and an agent is named as its route reads it.
pub fn requirement(method: &Method, path: &str, user_isolation: bool) -> Option<Requirement> {
    let decoded: Vec<std::borrow::Cow<'_, str>> = path
        .trim_start_matches('/')
        .split('/')
        .map(|segment| percent_encoding::percent_decode_str(segment).decode_utf8_lossy())
        .collect();
    let segments: Vec<&str> = decoded.iter().map(|segment| segment.as_ref()).collect();
    let read = method == Method::GET || method == Method::HEAD;
    let post = method == Method::POST;
    let need = |scope: Option<&'static str>, agent_id: Option<&str>, per_user: bool| {
        Some(Requirement {
            scope,
            agent_id: agent_id.map(str::to_owned),
            per_user,
            listing: false,
        })
    };
    match segments.as_slice() {
        ["agents"] if read => Some(Requirement {
            scope: Some("agents:read"),
            agent_id: None,
            per_user: false,
            listing: true,
        }),
        ["agents", agent] if read => need(Some("agents:read"), Some(agent), false),
        ["agents", agent, "runs"] if post => need(Some("agents:run"), Some(agent), true),
        ["agents", agent, "runs"] | ["agents", agent, "runs", _] if read => {
            need(Some("agents:read"), Some(agent), true)
        }
        ["agents", agent, "runs", _, "continue" | "cancel" | "resume"] if post => {
            need(Some("agents:run"), Some(agent), true)
        }
        ["agents", agent, "runs", _, "checkpoints" | "files", ..] if read => {
            need(Some("agents:read"), Some(agent), true)
        }
        ["agents", agent, "sessions", _, "compact"] if post => {
            need(Some("agents:run"), Some(agent), true)
        }
        ["sessions", ..] if read => need(Some("sessions:read"), None, true),
        ["sessions", _] if method == Method::DELETE => need(Some("sessions:delete"), None, true),
        ["metrics"] if read => need(Some("metrics:read"), None, true),
        // Runtime-wide counters cannot be scoped to one user: under isolation they are
        // the admin's.
        ["metrics", "prometheus"] if read && user_isolation => need(None, None, false),
        ["metrics", "prometheus"] if read => need(Some("metrics:read"), None, false),
        ["approvals"] if read => need(Some("agents:read"), None, true),
        ["journal", "export"] if read => need(None, None, false),
        ["openapi.json"] if read => need(Some("config:read"), None, false),
        _ => None,
    }
}

/// agno's legacy resource names.
fn resource_name(resource: &str) -> &str {
    match resource {
        "system" => "config",
        other => other,
    }
}

/// Whether `scopes` grant `requirement`.
pub fn grants(scopes: &[String], requirement: &Requirement, admin_scope: &str) -> bool {
    if scopes.iter().any(|scope| scope == admin_scope) {
        return true;
    }
    let Some((resource, action)) = requirement.scope.and_then(|scope| scope.split_once(':')) else {
        return false;
    };
    // A per-agent scope counts only for a route about that agent, and only for the
    // agents' own scopes (`agents:<id>:read` never grants `sessions:read`).
    let agent_id = requirement
        .agent_id
        .as_deref()
        .filter(|_| resource == "agents");
    scopes.iter().any(|scope| {
        let parts: Vec<&str> = scope.split(':').collect();
        match parts.as_slice() {
            [held, held_action] => resource_name(held) == resource && *held_action == action,
            [held, id, held_action] => {
                resource_name(held) == resource
                    && *held_action == action
                    && (*id == "*" || agent_id == Some(*id))
            }
            _ => false,
        }
    })
}

/// The agents `GET /agents` lists for `scopes`: `None` for every agent, else those a
/// per-agent read scope names (possibly none).
pub fn listed_agents(scopes: &[String], admin_scope: &str) -> Option<Vec<String>> {
    let every = Requirement {
        scope: Some("agents:read"),
        agent_id: None,
        per_user: false,
        listing: true,
    };
    if grants(scopes, &every, admin_scope) {
        return None;
    }
    Some(
        scopes
            .iter()
            .filter_map(|scope| {
                let parts: Vec<&str> = scope.split(':').collect();
                match parts.as_slice() {
                    ["agents", id, "read"] => Some((*id).to_owned()),
                    _ => None,
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes(list: &[&str]) -> Vec<String> {
        list.iter().map(|scope| (*scope).to_owned()).collect()
    }

    #[test]
    fn per_agent_scopes_grant_their_agent_only() {
        let run = requirement(&Method::POST, "/agents/a/runs", false).unwrap();
        let admin = "agent_os:admin";
        assert!(grants(&scopes(&["agents:a:run"]), &run, admin));
        assert!(grants(&scopes(&["agents:*:run"]), &run, admin));
        assert!(grants(&scopes(&["agents:run"]), &run, admin));
        assert!(grants(&scopes(&[admin]), &run, admin));
        assert!(!grants(&scopes(&["agents:b:run"]), &run, admin));
        assert!(!grants(&scopes(&["agents:a:read"]), &run, admin));
        let sessions = requirement(&Method::GET, "/sessions", false).unwrap();
        assert!(!grants(&scopes(&["sessions:a:read"]), &sessions, admin));
        let openapi = requirement(&Method::GET, "/openapi.json", false).unwrap();
        assert!(grants(&scopes(&["system:read"]), &openapi, admin));
        let export = requirement(&Method::GET, "/journal/export", false).unwrap();
        assert!(!grants(
            &scopes(&["agents:read", "sessions:read"]),
            &export,
            admin
        ));
        assert_eq!(
            listed_agents(&scopes(&["agents:a:read", "agents:b:run"]), admin),
            Some(vec!["a".to_owned()])
        );
        assert_eq!(listed_agents(&scopes(&["agents:*:read"]), admin), None);
    }

    #[test]
    fn an_agent_is_named_as_its_route_reads_it() {
        let encoded = requirement(&Method::POST, "/agents/%73cripted/runs", false).unwrap();
        assert_eq!(encoded.agent_id.as_deref(), Some("scripted"));
        // An encoded slash stays inside its segment: the route is still a run's.
        let slash = requirement(&Method::POST, "/agents/a%2Fb/runs", false).unwrap();
        assert_eq!(
            (slash.scope, slash.agent_id.as_deref()),
            (Some("agents:run"), Some("a/b"))
        );
        let admin = "agent_os:admin";
        assert!(grants(&scopes(&["agents:scripted:run"]), &encoded, admin));
        assert!(!grants(
            &scopes(&["agents:%73cripted:run"]),
            &encoded,
            admin
        ));
    }
}
