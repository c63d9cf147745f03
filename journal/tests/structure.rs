//! The structural rules `journal verify` checks (issue 27, `spec/faults.md` item 6):
//! each breaks on a journal written through the API with that one fault in it, and the
//! finding names the record that breaks it; a sound stream passes.

use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, JournalPos, RunEvent, RunId, SessionId,
};

fn run() -> RunId {
    RunId::parse("run-1").unwrap()
}

fn created() -> Event {
    Event::SessionCreated {
        agent_id: "scripted".into(),
        user_id: None,
    }
}

fn queued() -> Event {
    Event::RunQueued {
        run_id: run(),
        agent_id: "scripted".into(),
        user_id: None,
        input: "hello".into(),
        options: Default::default(),
    }
}

fn started() -> Event {
    Event::RunStarted {
        run_id: run(),
        model: "scripted".into(),
        model_provider: "turnstile".into(),
    }
}

fn attempt(n: u32) -> Event {
    Event::AttemptStarted {
        run_id: run(),
        attempt: n,
        harness_session_id: "h".into(),
    }
}

fn emitted(index: u64) -> Event {
    Event::RunEventEmitted {
        run_id: run(),
        event_index: EventIndex(index),
        event: RunEvent::ContentDelta {
            text: format!("part {index}"),
        },
    }
}

fn completed() -> Event {
    Event::RunCompleted { run_id: run() }
}

/// The structural finding of a journal holding `events` in one session, if any.
fn finding(events: Vec<Event>) -> Option<(JournalPos, String)> {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let session = SessionId::parse("s").unwrap();
    journal
        .append_blocking(&session, Expected::Any, events)
        .unwrap()
        .unwrap();
    let report = journal.verify(|_| ()).unwrap().unwrap();
    journal
        .check_structure(report.events, |_| ())
        .unwrap()
        .err()
        .map(|corruption| (corruption.pos, corruption.reason))
}

fn sound() -> Vec<Event> {
    vec![
        created(),
        queued(),
        started(),
        emitted(0),
        attempt(1),
        emitted(1),
        attempt(2),
        emitted(2),
        completed(),
    ]
}

#[test]
fn a_sound_stream_passes() {
    assert_eq!(finding(sound()), None);
}

#[test]
fn each_broken_rule_is_named_at_its_record() {
    let cases: Vec<(Vec<Event>, u64, &str)> = vec![
        (
            sound()[1..].to_vec(),
            0,
            "does not begin with SessionCreated",
        ),
        (
            [&sound()[..4], &[started()], &sound()[4..]].concat(),
            4,
            "started twice",
        ),
        (
            [&sound()[..6], &[attempt(1)], &sound()[6..]].concat(),
            6,
            "numbered 1 where 2 was expected",
        ),
        (
            [&sound()[..5], &[emitted(0)], &sound()[5..]].concat(),
            5,
            "event index 0 where 1 was expected",
        ),
        (
            [&sound()[..5], &[emitted(3)], &sound()[5..]].concat(),
            5,
            "event index 3 where 1 was expected",
        ),
        (
            [sound(), vec![emitted(3)]].concat(),
            9,
            "after the run ended",
        ),
        (
            [sound(), vec![completed()]].concat(),
            9,
            "after the run ended",
        ),
        (vec![created(), started()], 1, "before the run was queued"),
        (
            vec![created(), queued(), attempt(1)],
            2,
            "AttemptStarted of run run-1 before RunStarted",
        ),
        ([sound(), vec![queued()]].concat(), 9, "queued twice"),
    ];
    for (events, pos, says) in cases {
        let (at, reason) = finding(events).expect("a finding");
        assert_eq!(at, JournalPos(pos), "{reason}");
        assert!(reason.contains(says), "{reason:?} says {says:?}");
    }
}
