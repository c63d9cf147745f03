//! The fault search (issue 27), in the spirit of TigerBeetle's VOPR: a seeded random
//! workload through the embedding API (many sessions; background and streamed runs with
//! tool calls, transient failures and retries, cancels, continues from checkpoints,
//! compactions, deletes, passivation; each session's files written and removed, snapshotted
//! into the journal and restored) on a journal whose appends fail at random (refused
//! whole; written but answered as failed; answered late) and whose runtime "crashes"
//! at random (from an instant on, nothing more is written; the runtime is stopped and
//! the data directory opened again). After every crash and at the end the invariants of
//! `spec/faults.md` are checked against the journal and against what the workload was
//! told: every acknowledged run is in the journal and ends, every frame seen is there at
//! its index, `journal verify` (checksums, links and the structural rules: one start,
//! attempts 1, 2…, indices 0, 1…, one end) and `journal rebuild` are clean, and no run is
//! left open.
//!
//! `TURNSTILE_FAULT_RATES=refuse,ambiguous,delay` sets the per-mille rates (40,30,150).
//! `TURNSTILE_SEED=S` replays seed S (the same operations and the same fault for each
//! session's n-th append; thread timing is the machine's); `TURNSTILE_FAULT_SEEDS=N`
//! runs N seeds (CI: 40 on sled, 8 on PostgreSQL with its connections cut at random).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use turnstile_actors::{
    ContinueFrom, ContinueRun, Multitask, RetryPolicy, RunHandle, Runtime, StartRun,
};
use turnstile_journal::faults::{self, Fault, Faults};
use turnstile_journal::{Event, Journal, JournalPos, RunId, SessionId};
use turnstile_tests::{Store, scripted_agent};

const SESSIONS: usize = 5;
const OPERATIONS: usize = 120;
const MESSAGES: [&str; 7] = [
    "/tool Read {}\n/reply read",
    "/write notes/c.txt c\n/tool Grep {}\n/write notes/d.txt d\n/reply decided",
    "/sleep 20\n/write notes/a.txt wrote\n/tool Bash {}\n/reply wrote",
    "hello",
    "/fail transient 1\n/tool Grep {}\n/reply retried",
    "/tool Bash {}\n/sleep 15\n/rm notes/a.txt\n/write b.txt b",
    "/sleep 40\n/reply slow",
];

/// The fate of each append: from the seed, the session and how many appends the
/// session made before (so a replay gives the same session the same faults).
struct Plan {
    seed: u64,
    /// Per mille of appends refused, written-then-refused, delayed.
    refuse: u64,
    ambiguous: u64,
    delay: u64,
    crashed: AtomicBool,
    appends: Mutex<HashMap<SessionId, u64>>,
    injected: AtomicU64,
}

impl Plan {
    fn new(seed: u64, epoch: u64, quiet: bool) -> Arc<Plan> {
        let (refuse, ambiguous, delay) = if quiet { (0, 0, 0) } else { rates() };
        Arc::new(Plan {
            seed: seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            refuse,
            ambiguous,
            delay,
            crashed: AtomicBool::new(false),
            appends: Mutex::new(HashMap::new()),
            injected: AtomicU64::new(0),
        })
    }
}

/// Per mille of appends refused, written then refused, and answered late:
/// `TURNSTILE_FAULT_RATES=refuse,ambiguous,delay` (default 40,30,150).
fn rates() -> (u64, u64, u64) {
    let parsed: Vec<u64> = std::env::var("TURNSTILE_FAULT_RATES")
        .unwrap_or_default()
        .split(',')
        .filter_map(|rate| rate.trim().parse().ok())
        .collect();
    match parsed[..] {
        [refuse, ambiguous, delay] => (refuse, ambiguous, delay),
        _ => (40, 30, 150),
    }
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Faults for Plan {
    fn before_append(&self, session_id: &SessionId, _events: &[Event]) -> Fault {
        if self.crashed.load(Ordering::SeqCst) {
            return Fault::Refuse;
        }
        let n = {
            let mut appends = self.appends.lock().unwrap();
            let n = appends.entry(session_id.clone()).or_default();
            *n += 1;
            *n
        };
        let mut x = self.seed ^ n.wrapping_mul(0x2545_f491_4f6c_dd1d);
        for byte in session_id.as_str().bytes() {
            x = mix(x ^ u64::from(byte));
        }
        let roll = mix(x) % 1000;
        let fault = if roll < self.refuse {
            Fault::Refuse
        } else if roll < self.refuse + self.ambiguous {
            Fault::WriteThenRefuse
        } else if roll < self.refuse + self.ambiguous + self.delay {
            Fault::Delay(Duration::from_millis(1 + mix(x ^ 7) % 25))
        } else {
            Fault::None
        };
        if fault != Fault::None {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        fault
    }

    fn projection_allowed(&self) -> bool {
        !self.crashed.load(Ordering::SeqCst)
    }
}

/// What the workload was told.
#[derive(Default)]
struct Told {
    /// Runs accepted (the API answered with a handle).
    acknowledged: Vec<RunId>,
    /// Frames a stream showed: run, index, kind.
    frames: Vec<(RunId, u64, &'static str)>,
}

struct Search {
    seed: u64,
    store: Store,
    place: String,
    rng: StdRng,
    told: Arc<Mutex<Told>>,
    runtime: Option<Runtime>,
    plan: Arc<Plan>,
    epoch: u64,
    readers: Vec<tokio::task::JoinHandle<()>>,
    crashes: u64,
    injected: u64,
    /// PostgreSQL connection cuts.
    cuts: u64,
}

fn session(n: usize) -> SessionId {
    SessionId::parse(&format!("fs-{n}")).unwrap()
}

impl Search {
    fn open(&mut self, quiet: bool) {
        self.epoch += 1;
        self.plan = Plan::new(self.seed, self.epoch, quiet);
        faults::install(&self.place, self.plan.clone());
        let config = || {
            let mut agent = scripted_agent(RetryPolicy {
                retries: 1,
                delay_between_retries_s: 0.01,
                exponential_backoff: false,
            });
            // Each session's files travel with its journal (issue 29): snapshots are
            // appended with the turns, under the same faults.
            agent.cwd = self.store.path().join("work");
            agent.workspace = turnstile_actors::Workspace::Session;
            agent.snapshots = Some(turnstile_actors::workspace::Bounds {
                max_bytes: 1 << 20,
                max_file_bytes: 64 << 10,
                max_files: 100,
                ignore: turnstile_actors::workspace::Ignore::new(
                    &turnstile_actors::workspace::DEFAULT_IGNORE,
                )
                .unwrap(),
            });
            // Grep waits for a person (issue 30): its runs pause, and are decided by the
            // workload or time out, under the same faults.
            agent.approval.tools = turnstile_harness::Approvals::new(vec!["Grep".into()]);
            agent.approval.timeout = Some(Duration::from_millis(300));
            let mut config = self.store.config(vec![agent]);
            config.max_concurrent_runs = 3;
            config.session_idle = Duration::from_millis(150);
            if let turnstile_journal::JournalConfig::Postgres(postgres) = &mut config.journal {
                // A crashed replica's sessions are taken over within a second.
                postgres.lease = Duration::from_secs(1);
            }
            config
        };
        let mut opened = None;
        for _ in 0..100 {
            match Runtime::open(config()) {
                Ok(runtime) => {
                    opened = Some(runtime);
                    break;
                }
                // On PostgreSQL a cut may land on the open itself.
                Err(error) => {
                    eprintln!("open failed ({error}); again");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        self.runtime = Some(opened.expect("the runtime opens"));
    }

    /// From now on nothing more is written; then the runtime stops.
    async fn crash(&mut self) {
        self.plan.crashed.store(true, Ordering::SeqCst);
        self.injected += self.plan.injected.load(Ordering::Relaxed);
        for reader in self.readers.drain(..) {
            reader.abort();
        }
        if let Some(runtime) = self.runtime.take() {
            let _ = runtime.halt().await;
        }
    }

    fn runtime(&self) -> &Runtime {
        self.runtime.as_ref().unwrap()
    }

    fn follow(&mut self, mut run: RunHandle, streamed: bool) {
        self.told
            .lock()
            .unwrap()
            .acknowledged
            .push(run.run_id.clone());
        if !streamed {
            return;
        }
        let told = self.told.clone();
        self.readers.push(tokio::spawn(async move {
            while let Some(Ok(event)) = run.events().next().await {
                told.lock().unwrap().frames.push((
                    event.run_id.clone(),
                    event.event_index.0,
                    event.event.kind(),
                ));
            }
        }));
    }

    async fn step(&mut self) {
        let roll = self.rng.random_range(0..100);
        let n = self.rng.random_range(0..SESSIONS);
        let session_id = session(n);
        if roll < 50 {
            let message = MESSAGES[self.rng.random_range(0..MESSAGES.len())];
            let streamed = self.rng.random_bool(0.5);
            let multitask = if self.rng.random_bool(0.8) {
                Multitask::Enqueue
            } else {
                Multitask::Reject
            };
            let command = StartRun {
                agent_id: "scripted".into(),
                session_id: Some(session_id),
                user_id: None,
                message: message.into(),
                options: Default::default(),
                multitask,
                idempotency_key: None,
                fork: None,
                attachments: Vec::new(),
                isolated: false,
            };
            if let Ok(Ok(run)) = self.runtime().start_run(command).await {
                self.follow(run, streamed);
            }
        } else if roll < 60 {
            let target = {
                let told = self.told.lock().unwrap();
                (!told.acknowledged.is_empty()).then(|| {
                    told.acknowledged[self.rng.random_range(0..told.acknowledged.len())].clone()
                })
            };
            if let Some(run_id) = target {
                let _ = self.runtime().cancel_run(&run_id).await;
            }
        } else if roll < 70 {
            let target = {
                let told = self.told.lock().unwrap();
                (!told.acknowledged.is_empty()).then(|| {
                    told.acknowledged[self.rng.random_range(0..told.acknowledged.len())].clone()
                })
            };
            let from = if self.rng.random_bool(0.5) {
                ContinueFrom::End
            } else {
                ContinueFrom::MessageIndex(self.rng.random_range(0..4))
            };
            if let Some(run_id) = target {
                let command = ContinueRun {
                    run_id,
                    continue_from: from,
                    input: Some("/tool Read {}\n/reply continued".into()),
                    user_id: None,
                    options: Default::default(),
                    multitask: Multitask::Enqueue,
                };
                if let Ok(Ok(run)) = self.runtime().continue_run(command).await {
                    let streamed = self.rng.random_bool(0.5);
                    self.follow(run, streamed);
                }
            }
        } else if roll < 75 {
            let _ = self
                .runtime()
                .compact_session("scripted", &session_id)
                .await;
        } else if roll < 77 {
            let _ = self.runtime().delete_session(&session_id).await;
        } else if roll < 80 {
            // On PostgreSQL: every connection of the runtime cut at once.
            if let Store::Postgres { url, .. } = &self.store {
                let url = url.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    turnstile_tests::postgres::psql(
                        &url,
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                         WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    )
                })
                .await;
                self.cuts += 1;
            }
        } else if roll < 83 {
            self.decide().await;
        } else if roll < 85 {
            self.crashes += 1;
            self.crash().await;
            self.check(false).await;
            self.open(false);
        } else {
            let pause = self.rng.random_range(0..30);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// Decides a paused run's calls at random (each confirmed or denied).
    async fn decide(&mut self) {
        let Ok(paused) = self.runtime().paused_runs(None, None) else {
            return;
        };
        if paused.is_empty() {
            return;
        }
        let run = &paused[self.rng.random_range(0..paused.len())];
        let decisions = run
            .pending
            .iter()
            .map(|call| turnstile_journal::ToolDecision {
                tool_call_id: call.tool_call_id.clone(),
                confirmed: self.rng.random_bool(0.5),
                note: Some("the fault search".into()),
            })
            .collect();
        let command = turnstile_actors::DecideRun {
            run_id: run.run_id.clone(),
            decisions,
            decided_by: None,
        };
        if let Ok(Ok(handle)) = self.runtime().decide_run(command).await {
            let streamed = self.rng.random_bool(0.5);
            self.follow(handle, streamed);
        }
    }

    /// The invariants, once every run has ended; `last`: the end of the search.
    async fn check(&mut self, last: bool) {
        // A runtime without faults resolves what the crash left open.
        self.open(true);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let open = self.runtime().journal().open_runs().unwrap();
            if open.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let journal = self.runtime().journal();
                print_session(journal, &open[0].1, u64::MAX);
            }
            assert!(
                Instant::now() < deadline,
                "seed {}: runs left open (a ghost): {open:?}",
                self.seed
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.crash().await;
        let journal = self.store.journal();
        every_record_readable(&journal).await;
        check_journal(self.seed, &journal, &self.told.lock().unwrap());
        drop(journal);
        if last {
            println!(
                "seed {}: {} crashes, {} faults injected, {} connection cuts",
                self.seed, self.crashes, self.injected, self.cuts
            );
        }
    }
}

/// Waits until every committed record is readable: on PostgreSQL a record is read once
/// it has its global position, given a moment after its commit (the last commits of a
/// halted runtime are positioned by the next journal opened).
async fn every_record_readable(journal: &Journal) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in 0..SESSIONS {
        let session_id = session(n);
        while journal.session_next_seq(&session_id).unwrap()
            < journal.session_committed_seq(&session_id).unwrap()
        {
            assert!(
                Instant::now() < deadline,
                "records of {session_id} never readable"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Invariants 1, 2, 3, 5 and 6 of `spec/faults.md` on a journal no one writes.
fn check_journal(seed: u64, journal: &Journal, told: &Told) {
    let verified = journal.verify(|_| {}).unwrap().and_then(|report| {
        journal
            .check_structure(report.events, |_| {})
            .unwrap()
            .map(|()| report)
    });
    if let Err(corruption) = &verified {
        print_story(journal, corruption.pos);
    }
    assert!(
        verified.is_ok(),
        "seed {seed}: journal verify: {verified:?}"
    );
    let mut queued = HashSet::new();
    let mut sessions = HashMap::new();
    let mut ended = HashSet::new();
    let mut emitted: HashMap<(RunId, u64), &'static str> = HashMap::new();
    for record in journal.read_from(JournalPos(0)) {
        let record = record.unwrap();
        match &record.event {
            Event::RunQueued { run_id, .. } => {
                queued.insert(run_id.clone());
                sessions.insert(run_id.clone(), record.session_id.clone());
            }
            Event::RunEventEmitted {
                run_id,
                event_index,
                event,
            } => {
                emitted.insert((run_id.clone(), event_index.0), event.kind());
            }
            event if event.is_terminal() => {
                ended.insert(event.run_id().unwrap().clone());
            }
            _ => {}
        }
    }
    for run_id in &told.acknowledged {
        assert!(
            queued.contains(run_id),
            "seed {seed}: acknowledged run {run_id} is not in the journal"
        );
        if !ended.contains(run_id) {
            print_session(journal, &sessions[run_id], u64::MAX);
        }
        assert!(
            ended.contains(run_id),
            "seed {seed}: acknowledged run {run_id} never ended"
        );
    }
    for (run_id, index, kind) in &told.frames {
        assert_eq!(
            emitted.get(&(run_id.clone(), *index)),
            Some(kind),
            "seed {seed}: run {run_id} showed {kind} at index {index}, which the journal does not hold"
        );
    }
    assert!(
        journal.open_runs().unwrap().is_empty(),
        "seed {seed}: runs left open"
    );
    let rebuilt = turnstile_projections::rebuild::rebuild(journal, |_| {}).unwrap();
    assert!(
        rebuilt.differences.is_empty(),
        "seed {seed}: journal rebuild finds stored forms that disagree with the journal: {:?}",
        &rebuilt.differences[..rebuilt.differences.len().min(10)]
    );
}

/// The stream of the session of the record at `pos`, one line a record, to read what
/// happened to a failing seed.
fn print_story(journal: &Journal, pos: JournalPos) {
    let Some(bad) = journal.read_from(pos).next().and_then(Result::ok) else {
        return;
    };
    print_session(journal, &bad.session_id, pos.0 + 5);
}

/// One line a record of `session_id`'s stream, up to position `until`.
fn print_session(journal: &Journal, session_id: &SessionId, until: u64) {
    println!("session {session_id} up to position {until}:");
    for record in journal.read_from(JournalPos(0)).flatten() {
        if &record.session_id != session_id || record.pos.0 > until {
            continue;
        }
        let run = record
            .event
            .run_id()
            .map(|run_id| run_id.to_string())
            .unwrap_or_default();
        let detail = match &record.event {
            Event::AttemptStarted { attempt, .. } => format!(" attempt {attempt}"),
            Event::RunEventEmitted {
                event_index, event, ..
            } => format!(" #{} {}", event_index.0, event.kind()),
            _ => String::new(),
        };
        println!(
            "  pos {} seq {} {} {}{detail}",
            record.pos.0,
            record.seq.0,
            record.event.kind(),
            &run[run.len().saturating_sub(6)..]
        );
    }
}

/// Pauses and decisions in the journal (the workload's approvals, issue 30).
fn approvals_of(journal: &Journal) -> (usize, usize) {
    let mut counts = (0, 0);
    for record in journal.read_from(JournalPos(0)).flatten() {
        match &record.event {
            Event::RunEventEmitted {
                event: turnstile_journal::RunEvent::Paused { .. },
                ..
            } => counts.0 += 1,
            Event::RunEventEmitted {
                event: turnstile_journal::RunEvent::Continued { .. },
                ..
            } => counts.1 += 1,
            _ => {}
        }
    }
    counts
}

async fn search(seed: u64, store: Store) -> (u64, u64, usize, (usize, usize)) {
    let place = match &store {
        Store::Sled(dir) => dir.path().display().to_string(),
        Store::Postgres { url, .. } => url.clone(),
    };
    let mut search = Search {
        seed,
        rng: StdRng::seed_from_u64(seed),
        store,
        place,
        told: Arc::default(),
        runtime: None,
        plan: Plan::new(seed, 0, true),
        epoch: 0,
        readers: Vec::new(),
        crashes: 0,
        injected: 0,
        cuts: 0,
    };
    search.open(false);
    for _ in 0..OPERATIONS {
        search.step().await;
    }
    search.crash().await;
    search.check(true).await;
    faults::remove(&search.place);
    let acknowledged = search.told.lock().unwrap().acknowledged.len();
    let approvals = approvals_of(&search.store.journal());
    (search.crashes, search.injected, acknowledged, approvals)
}

/// The seeds to run: `TURNSTILE_SEED` alone, else `TURNSTILE_FAULT_SEEDS` (or
/// `default`) seeds from a random start, printed.
fn seeds(default: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("TURNSTILE_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
    {
        return vec![seed];
    }
    let count = std::env::var("TURNSTILE_FAULT_SEEDS")
        .ok()
        .and_then(|count| count.parse().ok())
        .unwrap_or(default);
    let start: u64 = rand::rng().random();
    (0..count).map(|n| start.wrapping_add(n)).collect()
}

async fn run_seeds(seeds: Vec<u64>, store: impl Fn() -> Option<Store>) {
    let mut totals = (0, 0, 0, 0, 0);
    let count = seeds.len();
    for seed in seeds {
        let Some(store) = store() else {
            return;
        };
        println!("seed {seed} (replay with TURNSTILE_SEED={seed})");
        let (crashes, injected, acknowledged, (paused, continued)) = search(seed, store).await;
        totals.0 += crashes;
        totals.1 += injected;
        totals.2 += acknowledged;
        totals.3 += paused;
        totals.4 += continued;
    }
    println!(
        "{count} seeds: {} crashes, {} faults injected, {} runs acknowledged, {} pauses, {} decisions, every invariant held",
        totals.0, totals.1, totals.2, totals.3, totals.4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_fault_search() {
    run_seeds(seeds(40), || Some(Store::sled())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fault_search() {
    run_seeds(seeds(8), Store::postgres).await;
}
