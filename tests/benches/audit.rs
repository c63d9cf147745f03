//! Audit benchmark (issue 7): events per second for `verify`, `export`, `import` and
//! `rebuild` on a journal of at least one million events, measured in one run.
//!
//! `cargo bench -p turnstile-tests --bench audit` (`BENCH_EVENTS`, default 1,000,000).
//! The journal is written through `Journal::append` with sessions shaped like real
//! ones: runs of queued/started/attempt records, streamed events and an end.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write as _;
use std::time::Instant;

use turnstile_journal::portable::{ExportedRecord, import};
use turnstile_journal::{
    Event, EventIndex, Expected, Journal, JournalOptions, JournalPos, RunEvent, RunId, SessionId,
    ToolCall,
};
use turnstile_projections::rebuild::{rebuild, store_all};

/// One run of a session: 20 records.
fn run_events(run: u64) -> Vec<Event> {
    let run_id = RunId::parse(&format!("run-{run}")).unwrap();
    let mut events = vec![
        Event::RunQueued {
            run_id: run_id.clone(),
            agent_id: "scripted".into(),
            user_id: None,
            input: format!("turn {run}: do the thing"),
            options: Default::default(),
        },
        Event::RunStarted {
            run_id: run_id.clone(),
            model: "scripted".into(),
            model_provider: "turnstile".into(),
        },
        Event::AttemptStarted {
            run_id: run_id.clone(),
            attempt: 1,
            harness_session_id: "h".into(),
        },
    ];
    for index in 0..15u64 {
        let event = if index % 4 == 1 {
            RunEvent::ToolCallCompleted {
                tool: ToolCall {
                    tool_call_id: format!("call-{run}-{index}"),
                    tool_name: "Read".into(),
                    tool_args: r#"{"path":"src/lib.rs"}"#.into(),
                    result: Some("ok".into()),
                    ..ToolCall::default()
                },
            }
        } else {
            RunEvent::ContentDelta {
                text: format!("part {index} of the answer to turn {run}"),
            }
        };
        events.push(Event::RunEventEmitted {
            run_id: run_id.clone(),
            event_index: EventIndex(index),
            event,
        });
    }
    events.push(Event::RunEventEmitted {
        run_id: run_id.clone(),
        event_index: EventIndex(15),
        event: RunEvent::Completed {
            content: "done".into(),
            content_type: "str".into(),
            metrics: turnstile_journal::RunMetrics {
                input_tokens: 10,
                output_tokens: 5,
                ..Default::default()
            },
        },
    });
    events.push(Event::RunCompleted { run_id });
    events
}

fn rate(events: u64, started: Instant) -> String {
    format!("{:.0}", events as f64 / started.elapsed().as_secs_f64())
}

fn main() {
    let target: u64 = std::env::var("BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let journal = Journal::open(&data, JournalOptions::default()).unwrap();
    let writers = 8u64;
    let runs_needed = target.div_ceil(20);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for writer in 0..writers {
            let journal = journal.clone();
            scope.spawn(move || {
                let mut run = writer;
                let mut session = 0u64;
                while run < runs_needed {
                    let session_id = SessionId::parse(&format!("s-{writer}-{session}")).unwrap();
                    let mut events = vec![Event::SessionCreated {
                        agent_id: "scripted".into(),
                        user_id: None,
                    }];
                    for _ in 0..10 {
                        events.extend(run_events(run));
                        run += writers;
                    }
                    journal
                        .append_blocking(&session_id, Expected::Any, events)
                        .unwrap()
                        .unwrap();
                    session += 1;
                }
            });
        }
    });
    let events = journal.next_pos().0;
    let write_rate = rate(events, started);
    store_all(&journal).unwrap();

    let started = Instant::now();
    let verified = journal.verify(|_| ()).unwrap().unwrap();
    let verify_rate = rate(verified.events, started);

    let export_path = dir.path().join("export.jsonl");
    let started = Instant::now();
    let mut out = std::io::BufWriter::new(std::fs::File::create(&export_path).unwrap());
    for record in journal.read_from(JournalPos(0)) {
        writeln!(
            out,
            "{}",
            ExportedRecord::from_recorded(&record.unwrap()).to_line()
        )
        .unwrap();
    }
    out.flush().unwrap();
    let export_rate = rate(events, started);

    let started = Instant::now();
    let report = rebuild(&journal, |_| ()).unwrap();
    let rebuild_rate = rate(report.events, started);
    assert!(
        report.differences.is_empty(),
        "{:?}",
        &report.differences[..3.min(report.differences.len())]
    );
    journal.close().unwrap();
    drop(journal);

    let started = Instant::now();
    let file = std::io::BufReader::new(std::fs::File::open(&export_path).unwrap());
    let imported = import(&dir.path().join("copy"), file, |_| ())
        .unwrap()
        .unwrap();
    let import_rate = rate(imported.records, started);

    println!(
        "| events | sessions | write (append, 8 threads) | verify | export (JSON lines) | import | rebuild |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {events} | {} | {write_rate}/s | {verify_rate}/s | {export_rate}/s | {import_rate}/s | {rebuild_rate}/s |",
        verified.streams
    );
}
