//! Issue 13, defect 3: no client behaviour holds the server. Half-sent headers, idle
//! keep-alive connections and bodies that never arrive are closed or answered on
//! deadlines from the configuration, and `/health` keeps answering under a slowloris of
//! 2,000 connections, also when the server's descriptor limit is 1,024; at that limit,
//! connections that sent nothing make room for a request at once (issue 32).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use turnstile_tests::{Server, write_config};

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

/// One request on a new connection; the status line's code and how long it took.
fn health(server: &Server, within: Duration) -> (u16, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr(server)).expect("connect");
    stream.set_read_timeout(Some(within)).unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (code, started.elapsed())
}

/// `n` connections that send the start of a request's headers and then stall.
fn stall(server: &Server, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut stream = TcpStream::connect(addr(server)).expect("connect");
            stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .unwrap();
            stream
        })
        .collect()
}

/// Whether the server closed `stream` (EOF or reset) within `within`.
fn closed(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut byte = [0u8; 64];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => !matches!(
            error.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn more_descriptors() {
    rlimit::increase_nofile_limit(8192).expect("raise the test's descriptor limit");
}

#[test]
fn health_answers_under_a_slowloris_of_two_thousand_connections_13() {
    more_descriptors();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "header_timeout_s = 3", "");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let mut stalled = stall(&server, 2000);
    for _ in 0..5 {
        let (code, took) = health(&server, Duration::from_secs(5));
        assert_eq!(code, 200, "/health under a slowloris");
        assert!(took < Duration::from_secs(2), "/health took {took:?}");
    }
    // The stalled connections are closed once their headers are late.
    let started = Instant::now();
    let closed_count = stalled
        .iter_mut()
        .take(50)
        .map(|stream| closed(stream, Duration::from_secs(6)))
        .filter(|was_closed| *was_closed)
        .count();
    assert_eq!(closed_count, 50, "half-sent headers must time out");
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(health(&server, Duration::from_secs(5)).0, 200);
    drop(stalled);
    server.terminate();
}

#[test]
fn a_low_descriptor_limit_makes_connections_wait_never_fail_13() {
    more_descriptors();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "header_timeout_s = 2", "");
    let server = Server::start_limited(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
        1024,
    );
    let stalled = stall(&server, 1100);
    // Past the bound the connection waits in the backlog for a stalled one to time
    // out: answered late, but answered.
    let (code, took) = health(&server, Duration::from_secs(10));
    assert_eq!(
        code, 200,
        "/health with 1,100 stalled connections and 1,024 descriptors"
    );
    assert!(took < Duration::from_secs(6), "/health took {took:?}");
    drop(stalled);
    let (code, took) = health(&server, Duration::from_secs(5));
    assert_eq!(code, 200);
    assert!(took < Duration::from_secs(1), "{took:?}");
    server.terminate();
}

/// Issue 32, item 17: at the connection limit, connections that never sent a byte
/// are closed, oldest first, to make room, so a real request is served at once
/// instead of waiting for their header timeout.
#[test]
fn at_the_limit_silent_connections_make_room_for_a_request_at_once_32() {
    more_descriptors();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "header_timeout_s = 30", "");
    let server = Server::start_limited(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
        1024,
    );
    let mut silent: Vec<TcpStream> = (0..1100)
        .map(|_| TcpStream::connect(addr(&server)).expect("connect"))
        .collect();
    for _ in 0..3 {
        let (code, took) = health(&server, Duration::from_secs(10));
        assert_eq!(code, 200, "/health with 1,100 silent connections");
        assert!(took < Duration::from_secs(1), "/health took {took:?}");
    }
    // The oldest silent connections were the ones closed; the newest still wait.
    assert!(
        closed(&mut silent[0], Duration::from_secs(1)),
        "the oldest stays open"
    );
    assert!(
        !closed(&mut silent[1099], Duration::from_millis(200)),
        "the newest was closed"
    );
    drop(silent);
    server.terminate();
}

#[test]
fn idle_connections_and_missing_bodies_meet_their_deadlines_13() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "header_timeout_s = 1\nidle_timeout_s = 2\nbody_timeout_s = 1",
        "",
    );
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );

    // A connection that sends nothing is closed after the header timeout.
    let mut silent = TcpStream::connect(addr(&server)).unwrap();
    let started = Instant::now();
    assert!(closed(&mut silent, Duration::from_secs(4)));
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );

    // A keep-alive connection stays open between requests, then closes when idle.
    let mut kept = TcpStream::connect(addr(&server)).unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut answer = [0u8; 512];
    kept.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let read = kept.read(&mut answer).unwrap();
    assert!(String::from_utf8_lossy(&answer[..read]).starts_with("HTTP/1.1 200"));
    let idle_from = Instant::now();
    assert!(
        !closed(&mut kept, Duration::from_millis(1500)),
        "closed before idle_timeout_s"
    );
    assert!(
        closed(&mut kept, Duration::from_secs(3)),
        "idle connection kept open"
    );
    assert!(idle_from.elapsed() >= Duration::from_secs(2));

    // A body announced and never sent is answered 408 as JSON.
    let mut slow = TcpStream::connect(addr(&server)).unwrap();
    slow.write_all(b"POST /agents/scripted/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nmessage=h")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = vec![0u8; 4096];
    let read = slow.read(&mut answer).expect("an answer");
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("\"error_type\":\"request_timeout\""),
        "{answer}"
    );
    server.terminate();
}
