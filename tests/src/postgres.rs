//! A real PostgreSQL for the tests: a throwaway cluster on a free loopback port, one per
//! test binary, with a fresh database per test.
//!
//! With `TURNSTILE_TEST_DATABASE_URL` set (a server the tests may create databases on,
//! as `postgres://user@127.0.0.1:port/db`), that server is used instead. Otherwise the
//! binaries are found in `TURNSTILE_PG_BIN`, else Debian's `/usr/lib/postgresql/N/bin`
//! (the newest N; `.ci/run` installs the package), and the cluster is made with `initdb`
//! and started with `pg_ctl`, as the `postgres` user when the tests run as root (initdb
//! refuses root). A watchdog stops it and removes its directory when the test process
//! ends, however it ends. Missing binaries fail the test under CI and skip it outside.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// A server the tests create databases on.
#[derive(Debug)]
pub struct Cluster {
    /// Host and port, `127.0.0.1:PORT`.
    pub port: u16,
    /// The superuser.
    pub user: String,
    /// Where `createdb` is.
    bin: PathBuf,
    /// The cluster's data directory, server options and log, when the tests started it.
    owned: Option<(PathBuf, String, PathBuf)>,
}

fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TURNSTILE_PG_BIN").map(PathBuf::from)
        && dir.join("initdb").exists()
    {
        return Some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `command` as the cluster's owner: `postgres` when run as root.
fn as_owner(program: &Path) -> Command {
    if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn start() -> Result<Cluster, String> {
    let bin = bin_dir().ok_or(
        "no PostgreSQL binaries: .ci/run installs Debian's postgresql; or set TURNSTILE_PG_BIN or TURNSTILE_TEST_DATABASE_URL",
    )?;
    let dir = std::env::temp_dir().join(format!("turnstile-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    if running_as_root() {
        let chowned = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(&dir)
            .status()
            .map_err(|e| e.to_string())?;
        if !chowned.success() {
            return Err("chown of the cluster directory to postgres failed".into());
        }
    }
    let data = dir.join("data");
    let init = as_owner(&bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("initdb: {e}"))?;
    if !init.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        ));
    }
    let port = crate::free_port();
    let options = format!(
        "-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={} \
         -c fsync=on -c synchronous_commit=on -c max_connections=300 -c shared_buffers=64MB",
        dir.display()
    );
    let started = as_owner(&bin.join("pg_ctl"))
        .arg("-D")
        .arg(&data)
        .args(["-w", "-t", "60", "-l"])
        .arg(dir.join("log"))
        .args(["-o", &options, "start"])
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("pg_ctl: {e}"))?;
    if !started.status.success() {
        let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
        return Err(format!(
            "pg_ctl start failed: {}{log}",
            String::from_utf8_lossy(&started.stderr)
        ));
    }
    // The watchdog: when this process is gone, stop the cluster and remove it.
    let owner = if running_as_root() {
        "runuser -u postgres -- "
    } else {
        ""
    };
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         {owner}'{pg_ctl}' -D '{data}' -m immediate stop >/dev/null 2>&1; rm -rf '{dir}'",
        pid = std::process::id(),
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &watchdog])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("watchdog: {e}"))?;
    Ok(Cluster {
        port,
        user: "postgres".into(),
        owned: Some((data, options, dir.join("log"))),
        bin,
    })
}

/// Stops the test binary's cluster at once (`pg_ctl stop -m immediate`): the database
/// goes away under its clients. Panics on a cluster the tests did not start.
pub fn stop_cluster() {
    let cluster = cluster().expect("a cluster");
    let (data, _, _) = cluster.owned.as_ref().expect("a cluster the tests started");
    let stopped = as_owner(&cluster.bin.join("pg_ctl"))
        .arg("-D")
        .arg(data)
        .args(["-m", "immediate", "-w", "stop"])
        .stdout(Stdio::null())
        .output()
        .expect("pg_ctl runs");
    assert!(
        stopped.status.success(),
        "pg_ctl stop: {}",
        String::from_utf8_lossy(&stopped.stderr)
    );
}

/// Starts the cluster [`stop_cluster`] stopped, on the same port.
pub fn start_cluster() {
    let cluster = cluster().expect("a cluster");
    let (data, options, log) = cluster.owned.as_ref().expect("a cluster the tests started");
    let started = as_owner(&cluster.bin.join("pg_ctl"))
        .arg("-D")
        .arg(data)
        .args(["-w", "-t", "60", "-l"])
        .arg(log)
        .args(["-o", options, "start"])
        .stdout(Stdio::null())
        .output()
        .expect("pg_ctl runs");
    assert!(
        started.status.success(),
        "pg_ctl start: {}",
        String::from_utf8_lossy(&started.stderr)
    );
}

use std::os::unix::process::CommandExt;

fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    let cluster = CLUSTER.get_or_init(|| {
        if let Ok(url) = std::env::var("TURNSTILE_TEST_DATABASE_URL") {
            let port = url
                .rsplit_once(':')
                .and_then(|(_, rest)| rest.split('/').next()?.parse().ok())
                .unwrap_or(5432);
            let user = url
                .strip_prefix("postgres://")
                .and_then(|rest| rest.split(['@', ':']).next())
                .unwrap_or("postgres")
                .to_owned();
            return Ok(Cluster {
                port,
                user,
                bin: bin_dir().unwrap_or_else(|| PathBuf::from("/usr/bin")),
                owned: None,
            });
        }
        start()
    });
    match cluster {
        Ok(cluster) => Some(cluster),
        Err(reason) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "PostgreSQL is needed: {reason}"
            );
            eprintln!("skipped: {reason}");
            None
        }
    }
}

/// A fresh, empty database on the test cluster: its URL. `None` (skip) only outside CI
/// when PostgreSQL is missing.
pub fn database() -> Option<String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let cluster = cluster()?;
    let name = format!(
        "t_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let created = Command::new(cluster.bin.join("createdb"))
        .args(["-h", "127.0.0.1", "-p", &cluster.port.to_string()])
        .args(["-U", &cluster.user, &name])
        .output()
        .expect("createdb runs");
    assert!(
        created.status.success(),
        "createdb {name}: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    Some(format!(
        "postgres://{}@127.0.0.1:{}/{name}",
        cluster.user, cluster.port
    ))
}

/// Runs SQL on a test database with `psql` (for tests that look under the journal).
pub fn psql(url: &str, sql: &str) -> String {
    let cluster = cluster().expect("a cluster");
    let out = Command::new(cluster.bin.join("psql"))
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
