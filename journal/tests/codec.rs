//! The record format at its boundary: golden bytes for every event type, and a
//! property round trip through the codec and through a real journal on disk.

use proptest::prelude::*;
use turnstile_journal::codec::{self, RecordBody};
use turnstile_journal::{
    ChangeKind, Event, EventIndex, Expected, FileChange, FileEntry, FileKind, ForkPoint, Journal,
    JournalOptions, JournalPos, ModelMetrics, RunEvent, RunId, RunMetrics, RunOptions, Seq,
    SessionId, SnapshotPoint, ToolCall, ToolDecision, Warning,
};

fn tool() -> ToolCall {
    ToolCall {
        tool_call_id: "call-1".into(),
        tool_name: "Read".into(),
        tool_args: r#"{"path":"a"}"#.into(),
        result: None,
        tool_call_error: false,
        parent_tool_call_id: Some("call-0".into()),
    }
}

fn emitted(run_id: &RunId, event: RunEvent) -> Event {
    Event::RunEventEmitted {
        run_id: run_id.clone(),
        event_index: EventIndex(4),
        event,
    }
}

/// One sample of every variant; the match below stops compiling when a variant is
/// added without a sample (and so without golden bytes).
fn samples() -> Vec<Event> {
    let run_id = RunId::parse("run-1").unwrap();
    let samples = vec![
        Event::SessionCreated {
            agent_id: "scripted".into(),
            user_id: Some("u1".into()),
        },
        Event::RunQueued {
            run_id: run_id.clone(),
            agent_id: "scripted".into(),
            user_id: None,
            input: "hello".into(),
            options: RunOptions {
                stream: true,
                background: false,
                output_schema: Some(r#"{"type":"object"}"#.into()),
                fork: Some(ForkPoint {
                    from_run_id: RunId::parse("run-0").unwrap(),
                    message_index: 3,
                    harness_session_id: "h0".into(),
                    transcript_lines: 7,
                }),
            },
        },
        Event::RunStarted {
            run_id: run_id.clone(),
            model: "m".into(),
            model_provider: "p".into(),
        },
        Event::AttemptStarted {
            run_id: run_id.clone(),
            attempt: 1,
            harness_session_id: "h1".into(),
        },
        Event::TranscriptLineAppended {
            run_id: run_id.clone(),
            harness_session_id: "h1".into(),
            line: r#"{"type":"user"}"#.into(),
        },
        Event::RunEventEmitted {
            run_id: run_id.clone(),
            event_index: EventIndex(3),
            event: RunEvent::ContentDelta { text: "hi".into() },
        },
        Event::RunCompleted {
            run_id: run_id.clone(),
        },
        Event::RunFailed {
            run_id: run_id.clone(),
            error_type: "billing".into(),
            message: "no credit".into(),
            retryable: false,
        },
        Event::RunCancelled {
            run_id: run_id.clone(),
            reason: "Run cancelled".into(),
        },
        Event::AttemptFailed {
            run_id: run_id.clone(),
            attempt: 2,
            error_type: "transient".into(),
            message: "overloaded".into(),
            retryable: true,
        },
        Event::IdempotencyKeyBound {
            key: "scripted:k1".into(),
            run_id: run_id.clone(),
        },
        Event::HarnessSessionForked {
            run_id: run_id.clone(),
            from_run_id: RunId::parse("run-0").unwrap(),
            message_index: 3,
            from_harness_session_id: "h1".into(),
            harness_session_id: "h2".into(),
            transcript_lines: 4,
        },
        Event::TranscriptCompacted {
            run_id: Some(run_id.clone()),
            harness_session_id: "h2".into(),
            summary: "[summary of 2 messages]".into(),
            replaced_messages: 2,
            lines: vec![r#"{"type":"compact_boundary"}"#.into()],
        },
        Event::SessionDeleted {
            reason: "deleted through the API".into(),
        },
        Event::AttachmentAdded {
            run_id: RunId::parse("run-1").unwrap(),
            name: "notes.txt".into(),
            media_type: "text/plain".into(),
            sha256: "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824".into(),
            content: b"hello".to_vec(),
        },
        Event::StoredApart {
            digest: [0x5a; 32],
            bytes: 5_000_000,
        },
        // Every run event variant, and every warning.
        emitted(
            &run_id,
            RunEvent::Started {
                model: "m".into(),
                model_provider: "p".into(),
            },
        ),
        emitted(&run_id, RunEvent::ToolCallStarted { tool: tool() }),
        emitted(
            &run_id,
            RunEvent::ToolCallCompleted {
                tool: ToolCall {
                    result: Some("ok".into()),
                    ..tool()
                },
            },
        ),
        emitted(
            &run_id,
            RunEvent::Warning {
                warning: Warning::Retry {
                    attempt: 1,
                    attempts: 3,
                    delay_s: 0.5,
                    error_type: "transient".into(),
                    message: "overloaded".into(),
                },
            },
        ),
        emitted(
            &run_id,
            RunEvent::Warning {
                warning: Warning::SessionFallback {
                    error: "gone".into(),
                },
            },
        ),
        emitted(
            &run_id,
            RunEvent::Warning {
                warning: Warning::AttachmentsChanged {
                    files: vec!["a.txt".into()],
                },
            },
        ),
        emitted(
            &run_id,
            RunEvent::Completed {
                content: "done".into(),
                content_type: "str".into(),
                metrics: RunMetrics {
                    input_tokens: 120,
                    output_tokens: 30,
                    cache_read_tokens: 10,
                    cache_write_tokens: 5,
                    reasoning_tokens: 2,
                    cost_usd: Some(0.25),
                    duration_s: 1.5,
                    first_token_s: Some(0.5),
                    models: vec![ModelMetrics {
                        id: "m".into(),
                        provider: "p".into(),
                        input_tokens: 120,
                        output_tokens: 30,
                        cache_read_tokens: 10,
                        cache_write_tokens: 5,
                        cost_usd: None,
                    }],
                    additional: r#"{"num_turns":2}"#.into(),
                },
            },
        ),
        emitted(
            &run_id,
            RunEvent::Failed {
                error_type: "billing".into(),
                message: "no credit".into(),
            },
        ),
        emitted(
            &run_id,
            RunEvent::Cancelled {
                reason: "Run cancelled".into(),
            },
        ),
        // Added after format 4's first listing: new variants go last, old bytes stay.
        Event::WorkspaceContent {
            run_id: run_id.clone(),
            blob: "blob-1".into(),
            offset: 0,
            bytes: b"hello".to_vec(),
            digest: Some("2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824".into()),
        },
        Event::WorkspaceChanged {
            run_id: run_id.clone(),
            point: SnapshotPoint::ToolCall {
                tool_call_id: "call-1".into(),
            },
            changes: vec![
                FileChange {
                    path: "src/a.txt".into(),
                    change: ChangeKind::Added,
                    entry: Some(FileEntry {
                        kind: FileKind::File,
                        executable: false,
                        size: 5,
                        digest: "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
                            .into(),
                        target: None,
                    }),
                },
                FileChange {
                    path: "link".into(),
                    change: ChangeKind::Modified,
                    entry: Some(FileEntry {
                        kind: FileKind::Symlink,
                        executable: false,
                        size: 4,
                        digest: "aa".into(),
                        target: Some("/etc".into()),
                    }),
                },
                FileChange {
                    path: "gone.md".into(),
                    change: ChangeKind::Removed,
                    entry: None,
                },
            ],
        },
        Event::WorkspaceChanged {
            run_id: run_id.clone(),
            point: SnapshotPoint::Rewound {
                from_run_id: RunId::parse("run-0").unwrap(),
                tool_call_id: None,
            },
            changes: Vec::new(),
        },
        emitted(
            &run_id,
            RunEvent::Warning {
                warning: Warning::WorkspaceOverLimit {
                    left_out: vec![("big.bin".into(), "workspace_max_file_bytes".into())],
                },
            },
        ),
        emitted(
            &run_id,
            RunEvent::Paused {
                tools: vec![tool()],
            },
        ),
        emitted(
            &run_id,
            RunEvent::Continued {
                decisions: vec![
                    ToolDecision {
                        tool_call_id: "call_1".into(),
                        confirmed: true,
                        note: None,
                    },
                    ToolDecision {
                        tool_call_id: "call_2".into(),
                        confirmed: false,
                        note: Some("not on main".into()),
                    },
                ],
                decided_by: Some("alice".into()),
            },
        ),
        emitted(
            &run_id,
            RunEvent::Warning {
                warning: Warning::UsageLimit {
                    resets_at_us: 1_796_000_060_000_000,
                    attempt: 1,
                    message: "usage limit reached".into(),
                },
            },
        ),
    ];
    for event in &samples {
        match event {
            Event::SessionCreated { .. }
            | Event::RunQueued { .. }
            | Event::RunStarted { .. }
            | Event::AttemptStarted { .. }
            | Event::TranscriptLineAppended { .. }
            | Event::RunEventEmitted { .. }
            | Event::RunCompleted { .. }
            | Event::RunFailed { .. }
            | Event::RunCancelled { .. }
            | Event::AttemptFailed { .. }
            | Event::IdempotencyKeyBound { .. }
            | Event::HarnessSessionForked { .. }
            | Event::TranscriptCompacted { .. }
            | Event::SessionDeleted { .. }
            | Event::AttachmentAdded { .. }
            | Event::StoredApart { .. }
            | Event::WorkspaceContent { .. }
            | Event::WorkspaceChanged { .. } => {}
        }
    }
    samples
}

fn body(event: Event) -> RecordBody {
    RecordBody {
        session_id: SessionId::parse("session-1").unwrap(),
        seq: Seq(2),
        ts_us: 1_796_000_000_000_000,
        prev_hash: [0xab; 32],
        event,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A format change without a version bump fails here (issue 2).
#[test]
fn golden_bytes_of_every_record_type() {
    let listing: Vec<String> = samples()
        .into_iter()
        .map(|event| {
            let kind = event.kind();
            let bytes = codec::encode(&body(event)).unwrap();
            assert_eq!(bytes[0], turnstile_journal::FORMAT_VERSION);
            format!("{kind}: {}", hex(&bytes))
        })
        .collect();
    insta::assert_snapshot!(listing.join("\n"));
}

/// Format-3 records (golden bytes of `89e76eb`'s build, the snapshot before format 4)
/// still decode, each as the current event it means: options and metrics parsed from
/// their text, the answer and metrics kept on the run event only.
#[test]
fn format_3_golden_bytes_still_decode() {
    let golden = include_str!("fixtures/format3_golden.txt");
    let mut kinds = Vec::new();
    for line in golden.lines().filter(|line| !line.is_empty()) {
        let (kind, hex) = line.split_once(": ").unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).unwrap())
            .collect();
        assert_eq!(bytes[0], 3);
        let body = codec::decode(&bytes).unwrap_or_else(|error| panic!("{kind}: {error}"));
        assert_eq!(body.event.kind(), kind);
        match &body.event {
            Event::RunQueued { options, .. } => {
                assert!(options.stream && !options.background, "{options:?}");
                assert_eq!(options.output_schema, None);
            }
            Event::RunEventEmitted {
                event:
                    RunEvent::Completed {
                        metrics, content, ..
                    },
                ..
            } => {
                assert_eq!(content, "done");
                assert_eq!(metrics, &RunMetrics::default());
            }
            _ => {}
        }
        kinds.push(kind.to_owned());
    }
    assert_eq!(kinds.len(), 25, "{kinds:?}");
}

/// The segment (a group commit's records and their manifest) and the session index
/// chunk are on disk too.
#[test]
fn golden_bytes_of_a_segment_and_an_index_chunk() {
    let entries = vec![
        codec::ManifestEntry {
            session_id: SessionId::parse("session-1").unwrap(),
            first_seq: Seq(2),
            count: 2,
        },
        codec::ManifestEntry {
            session_id: SessionId::parse("s2").unwrap(),
            first_seq: Seq(0),
            count: 1,
        },
    ];
    let records = vec![vec![1, 2, 3], vec![4], vec![5, 6]];
    let bytes = codec::encode_segment(&entries, &records);
    let runs = vec![
        codec::Run {
            first_seq: Seq(2),
            count: 2,
            pos: turnstile_journal::JournalPos(7),
        },
        codec::Run {
            first_seq: Seq(9),
            count: 1,
            pos: turnstile_journal::JournalPos(40),
        },
    ];
    let index = codec::encode_runs(&runs);
    insta::assert_snapshot!(format!(
        "segment: {}\nindex chunk: {}",
        hex(&bytes),
        hex(&index)
    ));
    let segment = codec::Segment::parse(bytes.as_slice()).unwrap();
    assert_eq!(segment.entries().unwrap(), entries);
    assert_eq!(segment.len(), 3);
    assert_eq!(segment.record(2), Some([5u8, 6].as_slice()));
    assert_eq!(codec::decode_runs(&index).unwrap(), runs);
}

#[test]
fn a_segment_refuses_other_versions_damage_and_miscounts() {
    let entries = vec![codec::ManifestEntry {
        session_id: SessionId::parse("a").unwrap(),
        first_seq: Seq(0),
        count: 2,
    }];
    let good = codec::encode_segment(&entries, &[vec![1], vec![2]]);
    let mut version = good.clone();
    version[0] = 1;
    assert!(matches!(
        codec::Segment::parse(version.as_slice()),
        Err(codec::DecodeError::Version(1))
    ));
    let mut flipped = good.clone();
    flipped[12] ^= 1;
    assert!(matches!(
        codec::Segment::parse(flipped.as_slice()),
        Err(codec::DecodeError::Checksum { .. })
    ));
    let mut truncated = good.clone();
    truncated.pop();
    assert!(codec::Segment::parse(truncated.as_slice()).is_err());
    let miscounted = codec::encode_segment(&entries, &[vec![1]]);
    let error = codec::Segment::parse(miscounted.as_slice()).unwrap_err();
    assert!(error.to_string().contains("names 2 records"), "{error}");
}

#[test]
fn decode_refuses_other_versions_and_flipped_bytes() {
    let mut bytes = codec::encode(&body(samples().remove(0))).unwrap();
    let mut other_version = bytes.clone();
    // Version 1 (agno's JSON in run events) is not read by this build.
    other_version[0] = 1;
    assert!(matches!(
        codec::decode(&other_version),
        Err(codec::DecodeError::Version(1))
    ));
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    assert!(matches!(
        codec::decode(&bytes),
        Err(codec::DecodeError::Checksum { .. })
    ));
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        "[a-z]{0,8}",
        Just(String::new()),
        Just("{\"k\":[1,2,{\"n\":null}]}".to_string())
    ]
}

fn any_id() -> impl Strategy<Value = RunId> {
    "[A-Za-z0-9._:-]{1,40}"
        .prop_filter("not . or ..", |s| s != "." && s != "..")
        .prop_map(|s| RunId::parse(&s).unwrap())
}

fn any_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (any_text(), proptest::option::of(any_text()))
            .prop_map(|(agent_id, user_id)| Event::SessionCreated { agent_id, user_id }),
        (
            any_id(),
            any_text(),
            proptest::option::of(any_text()),
            any_text(),
            any::<(bool, bool)>(),
            proptest::option::of(any_text())
        )
            .prop_map(
                |(run_id, agent_id, user_id, input, (stream, background), output_schema)| {
                    Event::RunQueued {
                        run_id,
                        agent_id,
                        user_id,
                        input,
                        options: RunOptions {
                            stream,
                            background,
                            output_schema,
                            fork: None,
                        },
                    }
                }
            ),
        (any_id(), any_text(), any_text()).prop_map(|(run_id, model, model_provider)| {
            Event::RunStarted {
                run_id,
                model,
                model_provider,
            }
        }),
        (any_id(), any::<u32>(), any_text()).prop_map(|(run_id, attempt, harness_session_id)| {
            Event::AttemptStarted {
                run_id,
                attempt,
                harness_session_id,
            }
        }),
        (any_id(), any_text(), any_text()).prop_map(|(run_id, harness_session_id, line)| {
            Event::TranscriptLineAppended {
                run_id,
                harness_session_id,
                line,
            }
        }),
        (any_id(), any::<u64>(), any_text(), any::<bool>()).prop_map(
            |(run_id, index, text, tool)| Event::RunEventEmitted {
                run_id,
                event_index: EventIndex(index),
                event: if tool {
                    RunEvent::ToolCallCompleted {
                        tool: ToolCall {
                            tool_call_id: text.clone(),
                            result: Some(text),
                            ..ToolCall::default()
                        },
                    }
                } else {
                    RunEvent::ContentDelta { text }
                },
            }
        ),
        (
            any_id(),
            any::<u64>(),
            any_text(),
            any::<(u32, u32)>(),
            any_text()
        )
            .prop_map(|(run_id, index, content, (input, output), model)| {
                Event::RunEventEmitted {
                    run_id,
                    event_index: EventIndex(index),
                    event: RunEvent::Completed {
                        content,
                        content_type: "str".into(),
                        metrics: RunMetrics {
                            input_tokens: u64::from(input),
                            output_tokens: u64::from(output),
                            cost_usd: Some(f64::from(input) / 1e6),
                            duration_s: f64::from(output) / 1e3,
                            models: vec![ModelMetrics {
                                id: model,
                                ..ModelMetrics::default()
                            }],
                            ..RunMetrics::default()
                        },
                    },
                }
            }),
        any_id().prop_map(|run_id| Event::RunCompleted { run_id }),
        (any_id(), any_text(), any_text(), any::<bool>()).prop_map(
            |(run_id, error_type, message, retryable)| Event::RunFailed {
                run_id,
                error_type,
                message,
                retryable
            }
        ),
        (any_id(), any_text()).prop_map(|(run_id, reason)| Event::RunCancelled { run_id, reason }),
        (
            any_id(),
            any::<u32>(),
            any_text(),
            any_text(),
            any::<bool>()
        )
            .prop_map(|(run_id, attempt, error_type, message, retryable)| {
                Event::AttemptFailed {
                    run_id,
                    attempt,
                    error_type,
                    message,
                    retryable,
                }
            }),
        (any_id(), any_text()).prop_map(|(run_id, key)| Event::IdempotencyKeyBound { key, run_id }),
        (
            any_id(),
            any_id(),
            any::<u32>(),
            any_text(),
            any_text(),
            any::<u32>()
        )
            .prop_map(
                |(
                    run_id,
                    from_run_id,
                    message_index,
                    from_harness_session_id,
                    harness_session_id,
                    transcript_lines,
                )| Event::HarnessSessionForked {
                    run_id,
                    from_run_id,
                    message_index,
                    from_harness_session_id,
                    harness_session_id,
                    transcript_lines
                }
            ),
        (
            proptest::option::of(any_id()),
            any_text(),
            any_text(),
            any::<u32>(),
            proptest::collection::vec(any_text(), 0..3)
        )
            .prop_map(
                |(run_id, harness_session_id, summary, replaced_messages, lines)| {
                    Event::TranscriptCompacted {
                        run_id,
                        harness_session_id,
                        summary,
                        replaced_messages,
                        lines,
                    }
                }
            ),
    ]
}

proptest! {
    #[test]
    fn codec_round_trips(event in any_event(), seq in any::<u64>(), ts in any::<i64>(), link in any::<[u8; 32]>()) {
        let body = RecordBody { session_id: SessionId::parse("s").unwrap(), seq: Seq(seq), ts_us: ts, prev_hash: link, event };
        let bytes = codec::encode(&body).unwrap();
        prop_assert_eq!(codec::decode(&bytes).unwrap(), body);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn journal_round_trips(batches in proptest::collection::vec(proptest::collection::vec(any_event(), 1..5), 1..6)) {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let session_a = SessionId::parse("a").unwrap();
        let session_b = SessionId::parse("b").unwrap();
        let mut written: Vec<(SessionId, Event)> = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            let session = if i % 2 == 0 { &session_a } else { &session_b };
            let records = journal.append_blocking(session, Expected::Any, batch.clone()).unwrap().unwrap();
            prop_assert_eq!(records.len(), batch.len());
            written.extend(batch.iter().cloned().map(|event| (session.clone(), event)));
        }
        journal.close().unwrap();
        drop(journal);
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let all: Vec<(SessionId, Event)> = journal.read_from(JournalPos(0)).map(|r| { let r = r.unwrap(); (r.session_id, r.event) }).collect();
        prop_assert_eq!(&all, &written);
        let only_a: Vec<Event> = journal.read_session(&session_a, Seq(0)).map(|r| r.unwrap().event).collect();
        let expected_a: Vec<Event> = written.iter().filter(|(s, _)| s == &session_a).map(|(_, e)| e.clone()).collect();
        prop_assert_eq!(only_a, expected_a);
        let verified = journal.verify(|_| ()).unwrap();
        prop_assert!(verified.is_ok(), "verify: {:?}", verified);
    }
}

proptest! {
    #[test]
    fn segments_round_trip(records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..20), split in any::<u8>()) {
        // Two sessions share the records: the first `cut` to one, the rest to the other.
        let cut = usize::from(split) % (records.len() + 1);
        let mut entries = Vec::new();
        if cut > 0 {
            entries.push(codec::ManifestEntry { session_id: SessionId::parse("a").unwrap(), first_seq: Seq(7), count: cut as u32 });
        }
        if cut < records.len() {
            entries.push(codec::ManifestEntry { session_id: SessionId::parse("b").unwrap(), first_seq: Seq(0), count: (records.len() - cut) as u32 });
        }
        let bytes = codec::encode_segment(&entries, &records);
        let segment = codec::Segment::parse(bytes.as_slice()).unwrap();
        prop_assert_eq!(segment.entries().unwrap(), entries);
        prop_assert_eq!(segment.len(), records.len());
        for (index, record) in records.iter().enumerate() {
            prop_assert_eq!(segment.record(index), Some(record.as_slice()));
        }
    }

    #[test]
    fn any_bytes_parse_as_a_segment_or_an_error_never_a_panic(header in proptest::collection::vec(any::<u8>(), 0..120), rest in proptest::collection::vec(any::<u8>(), 0..120), declared in any::<Option<u32>>()) {
        // A header with a valid checksum, so parsing goes on into the framing.
        let mut bytes = vec![codec::SEGMENT_VERSION];
        bytes.extend_from_slice(&crc32fast::hash(&header).to_le_bytes());
        bytes.extend_from_slice(&declared.unwrap_or(header.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&header);
        bytes.extend_from_slice(&rest);
        let _ = codec::Segment::parse(bytes.as_slice()).map(|segment| segment.entries());
        let _ = codec::decode_runs(&rest);
    }
}
