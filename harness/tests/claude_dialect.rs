//! The Claude Code dialect through its public API: error classes from the `result`
//! line, project keys, and the `sessionId` rewrite of a fork.

use std::path::Path;

use serde_json::{Value, json};
use turnstile_harness::ErrorKind;
use turnstile_harness::claude::{ClaudeCode, ClaudeCodeOptions, classify, project_key};
use turnstile_harness::cli::Dialect;

#[test]
fn errors_are_classified_from_status_type_and_reason() {
    let r = |v: Value| classify(&v, None, "x");
    assert_eq!(
        r(json!({"api_error_status": 401, "subtype": "success"})),
        ErrorKind::Authentication
    );
    assert_eq!(r(json!({"api_error_status": 402})), ErrorKind::Billing);
    assert_eq!(
        r(json!({"api_error_status": 400, "terminal_reason": "prompt_too_long"})),
        ErrorKind::ContextWindow
    );
    assert_eq!(
        r(json!({"api_error_status": 400})),
        ErrorKind::InvalidRequest
    );
    assert_eq!(r(json!({"api_error_status": 429})), ErrorKind::Transient);
    assert_eq!(
        r(json!({"api_error_status": 529, "api_error_type": "overloaded_error"})),
        ErrorKind::Transient
    );
    assert_eq!(r(json!({"api_error_status": 500})), ErrorKind::Transient);
    assert_eq!(
        r(json!({"subtype": "error_max_turns"})),
        ErrorKind::MaxTurns
    );
    assert_eq!(
        r(json!({"subtype": "error_max_budget_usd"})),
        ErrorKind::MaxBudget
    );
    assert_eq!(
        classify(
            &json!({"subtype": "error_during_execution"}),
            None,
            "No conversation found with session ID: x"
        ),
        ErrorKind::SessionNotFound
    );
}

#[test]
fn project_keys_replace_every_non_alphanumeric() {
    assert_eq!(project_key(Path::new("/tmp/a.b/c_d")), "-tmp-a-b-c-d");
}

#[test]
fn forks_rewrite_the_session_id() {
    let claude = ClaudeCode::from(ClaudeCodeOptions::new("claude", "/w", "/s"));
    let line = r#"{"sessionId":"old","uuid":"u1"}"#;
    let rewritten: Value = serde_json::from_str(&claude.restore_line(line, "new")).unwrap();
    assert_eq!(rewritten["sessionId"], "new");
    assert_eq!(rewritten["uuid"], "u1");
}
