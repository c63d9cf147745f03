//! The web console (issue 18) in headless Chromium: Debian's `chromium` driven by
//! `playwright-core` (`tests/console/console.cjs`, both installed by the README's test
//! command), against the real binary with an API key. The page must show a 401 without
//! the key, a session created through the API, its timeline with a tool call nested
//! under the call that delegated it, a retry and a fork, a live run's events while it
//! runs (and after a reload), refusals (409, 404), cancel from the page, the metrics'
//! charts, and fit a phone-width screen by keyboard. Signed in with a token of a server
//! with per-user isolation, it shows that user's sessions only. A run's page lists the
//! files it changed in its session's workspace, each opening as a diff. The approvals
//! page lists the calls waiting for a decision, and its buttons approve and deny them.
//!
//! The test writes its screenshots to a temporary directory;
//! `cargo run -p turnstile-tests --example screenshots` remakes those of `docs/console/`.

use turnstile_tests::console::{
    console_approvals_run, console_files_run, console_run, console_tokens_run, tools,
};

#[test]
fn the_console_shows_sessions_timelines_live_runs_and_refusals_18() {
    if tools().is_none() {
        return;
    }
    let shots = tempfile::tempdir().unwrap();
    console_run(shots.path());
}

/// Signed in with a token, the console shows that user's sessions only (issue 31).
#[test]
fn the_console_signs_in_with_a_token_and_shows_only_that_users_sessions_31() {
    if tools().is_none() {
        return;
    }
    let shots = tempfile::tempdir().unwrap();
    console_tokens_run(shots.path());
}

/// A run's changed files, each opening as a text diff (issue 29).
#[test]
fn the_console_shows_a_runs_changed_files_as_diffs_29() {
    if tools().is_none() {
        return;
    }
    let shots = tempfile::tempdir().unwrap();
    console_files_run(shots.path());
}

/// The pending approvals, approved and denied from the page (issue 30).
#[test]
fn the_console_lists_pending_approvals_and_decides_them_30() {
    if tools().is_none() {
        return;
    }
    let shots = tempfile::tempdir().unwrap();
    console_approvals_run(shots.path());
}
