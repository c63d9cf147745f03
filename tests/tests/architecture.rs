//! Architecture invariants of `docs/ARCHITECTURE.md`, checked from the manifests and
//! sources so they cannot rot: the dependency direction between crates, the libraries
//! reserved to one crate, versions only in the workspace, a `//!` doc atop every
//! Rust file, no circle between the files of a crate, rooms that stay small (files and
//! functions), `unsafe` in one place only, fault injection in the tests only, and
//! authorization that no route escapes (a scope for every route, the caller in every
//! handler of sessions and runs).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

const CRATES: [&str; 6] = [
    "journal",
    "projections",
    "harness",
    "actors",
    "gateway",
    "tests",
];

/// Which project crates each crate may depend on.
fn allowed(krate: &str) -> &'static [&'static str] {
    match krate {
        "journal" => &[],
        "projections" | "harness" => &["journal"],
        "actors" => &["journal", "projections", "harness"],
        "gateway" => &["journal", "projections", "harness", "actors"],
        "tests" => &["journal", "projections", "harness", "actors", "gateway"],
        other => panic!("unknown crate {other}"),
    }
}

/// Libraries only one crate may name.
const RESERVED: [(&str, &str); 7] = [
    ("sled", "journal"),
    ("crossbeam-epoch", "journal"),
    ("bincode", "journal"),
    ("tokio-postgres", "journal"),
    ("deadpool-postgres", "journal"),
    ("actix", "actors"),
    ("axum", "gateway"),
];

fn manifest(krate: &str) -> toml::Table {
    let text = std::fs::read_to_string(root().join(krate).join("Cargo.toml")).unwrap();
    text.parse().unwrap()
}

fn dependencies(table: &toml::Table) -> Vec<(String, toml::Value)> {
    ["dependencies", "dev-dependencies", "build-dependencies"]
        .iter()
        .filter_map(|section| table.get(*section).and_then(|v| v.as_table()))
        .flat_map(|deps| deps.iter().map(|(name, spec)| (name.clone(), spec.clone())))
        .collect()
}

#[test]
fn project_crates_depend_only_in_the_allowed_direction() {
    let mut violations = Vec::new();
    for krate in CRATES {
        for (name, _) in dependencies(&manifest(krate)) {
            if let Some(target) = name.strip_prefix("turnstile-")
                && !allowed(krate).contains(&target)
            {
                violations.push(format!("{krate} depends on {target}"));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "dependency direction violated: {violations:?}"
    );
}

#[test]
fn reserved_libraries_are_named_by_their_crate_only() {
    let mut violations = Vec::new();
    for krate in CRATES {
        for (name, _) in dependencies(&manifest(krate)) {
            for (library, owner) in RESERVED {
                if (name == library || name.starts_with(&format!("{library}-"))) && krate != owner {
                    violations.push(format!("{krate} names {name}, which only {owner} may"));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{violations:?}");
}

/// The fault search's injection (`turnstile-journal`'s `faults` feature) is enabled by
/// the tests' dev-dependencies only: no build of the binary or of a library has it.
#[test]
fn fault_injection_is_enabled_by_the_tests_only() {
    let mut violations = Vec::new();
    for krate in CRATES {
        let table = manifest(krate);
        for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let Some(deps) = table.get(section).and_then(|v| v.as_table()) else {
                continue;
            };
            for (name, spec) in deps {
                let enables = spec
                    .get("features")
                    .and_then(|f| f.as_array())
                    .is_some_and(|f| f.iter().any(|f| f.as_str() == Some("faults")));
                if enables && !(krate == "tests" && section == "dev-dependencies") {
                    violations.push(format!("{krate} [{section}] {name} enables faults"));
                }
            }
        }
    }
    let root_manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    if root_manifest.contains("\"faults\"") {
        violations.push("the workspace manifest enables faults".into());
    }
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn versions_live_in_the_workspace_manifest() {
    let mut violations = Vec::new();
    for krate in CRATES {
        let table = manifest(krate);
        let package = table["package"].as_table().unwrap();
        assert_eq!(
            package["name"].as_str().unwrap(),
            format!("turnstile-{krate}"),
            "folder equals crate"
        );
        for (name, spec) in dependencies(&table) {
            let inherits = spec
                .as_table()
                .and_then(|t| t.get("workspace"))
                .and_then(|v| v.as_bool())
                == Some(true);
            if !inherits {
                violations.push(format!("{krate}: {name} does not use `workspace = true`"));
            }
        }
        let lints = table
            .get("lints")
            .and_then(|l| l.get("workspace"))
            .and_then(|v| v.as_bool());
        assert_eq!(lints, Some(true), "{krate} must inherit [workspace.lints]");
    }
    assert!(violations.is_empty(), "{violations:?}");
    let root_manifest: toml::Table = std::fs::read_to_string(root().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let bincode = &root_manifest["workspace"]["dependencies"]["bincode"];
    assert_eq!(
        bincode["version"].as_str(),
        Some("=2.0.1"),
        "bincode 3 is a tombstone: pin 2.0.1"
    );
    assert!(
        root().join("Cargo.lock").exists(),
        "Cargo.lock is committed"
    );
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn every_rust_file_opens_with_a_module_doc() {
    let mut files = Vec::new();
    for krate in CRATES {
        rust_files(&root().join(krate), &mut files);
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            !text
                .lines()
                .find(|line| !line.trim().is_empty())
                .is_some_and(|line| line.starts_with("//!"))
        })
        .map(|path| path.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a //! module doc: {missing:?}"
    );
}

/// The CLIs turnstile drives and their vendors' words: only `harness/` may name them.
const CLI_WORDS: [&str; 4] = ["claude", "codex", "anthropic", "openai"];

#[test]
fn only_the_harness_crate_knows_a_cli_dialect() {
    let mut files = Vec::new();
    for krate in ["actors", "gateway"] {
        rust_files(&root().join(krate), &mut files);
    }
    assert!(files.len() > 10, "found only {} files", files.len());
    let mut violations = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap().to_lowercase();
        for (number, line) in text.lines().enumerate() {
            for word in CLI_WORDS {
                if line.contains(word) {
                    violations.push(format!(
                        "{}:{}: names {word}",
                        path.strip_prefix(root()).unwrap().display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}

/// A crate's files as modules: `journal/src/sled/keys.rs` is `["sled", "keys"]`, a
/// `mod.rs`, `lib.rs` or `main.rs` is its folder's module.
fn modules_of(krate: &str) -> std::collections::BTreeMap<Vec<String>, PathBuf> {
    let src = root().join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(&src).unwrap().with_extension("");
            let mut module: Vec<String> = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            (module, path)
        })
        .collect()
}

/// The paths a source names from its own crate, `crate::a::b`, `super::a`, `self::a`,
/// each item of a group (`crate::{a::X, b}`) apart, resolved against `module`.
fn named_paths(text: &str, module: &[String]) -> Vec<Vec<String>> {
    // Comments say what code does not do; only code counts.
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for head in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(head) {
            if code[..at].chars().next_back().is_some_and(word) {
                continue;
            }
            let mut base: Vec<String> = match head {
                "crate::" => Vec::new(),
                "super::" => module[..module.len().saturating_sub(1)].to_vec(),
                _ => module.to_vec(),
            };
            let mut rest = &code[at + head.len()..];
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            let items: Vec<&str> = match rest.strip_prefix('{') {
                // One level of grouping: the first segment of each item is enough.
                Some(group) => group[..group.find('}').unwrap_or(group.len())]
                    .split(',')
                    .collect(),
                None => vec![rest],
            };
            for item in items {
                let mut path = base.clone();
                for segment in item.trim().split("::") {
                    let name: String = segment.chars().take_while(|c| word(*c)).collect();
                    if name.is_empty() || name == "self" {
                        break;
                    }
                    path.push(name);
                    if !segment.chars().all(word) {
                        break;
                    }
                }
                found.push(path);
            }
        }
    }
    found
}

/// Which of a crate's files each file uses, by the modules its paths name: a file's
/// own ancestors and descendants do not count (a folder's `mod.rs` and its files are
/// one module's parts).
fn file_graph(krate: &str) -> std::collections::BTreeMap<Vec<String>, Vec<Vec<String>>> {
    let modules = modules_of(krate);
    modules
        .iter()
        .map(|(module, path)| {
            let text = std::fs::read_to_string(path).unwrap();
            let mut uses: Vec<Vec<String>> = named_paths(&text, module)
                .into_iter()
                .filter_map(|path| {
                    (0..=path.len())
                        .rev()
                        .map(|len| path[..len].to_vec())
                        .find(|prefix| modules.contains_key(prefix))
                })
                .filter(|target| !target.starts_with(module) && !module.starts_with(target))
                .collect();
            uses.sort();
            uses.dedup();
            (module.clone(), uses)
        })
        .collect()
}

#[test]
fn no_circle_between_the_files_of_any_crate() {
    type Graph = std::collections::BTreeMap<Vec<String>, Vec<Vec<String>>>;
    // Depth-first search; a file met again on the current path closes a circle.
    fn visit(
        module: &Vec<String>,
        graph: &Graph,
        path: &mut Vec<Vec<String>>,
        done: &mut std::collections::BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(start) = path.iter().position(|m| m == module) {
            let mut circle = path[start..].to_vec();
            circle.push(module.clone());
            return Some(circle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.clone());
        for next in &graph[module] {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(module.clone());
        None
    }
    for krate in CRATES {
        let graph = file_graph(krate);
        assert!(
            graph.len() >= 3,
            "{krate}: found only {} files",
            graph.len()
        );
        let mut done = std::collections::BTreeSet::new();
        for module in graph.keys() {
            if let Some(circle) = visit(module, &graph, &mut Vec::new(), &mut done) {
                let names: Vec<String> = circle.iter().map(|m| m.join("/")).collect();
                panic!("import circle in {krate}/src: {}", names.join(" -> "));
            }
        }
    }
}

#[test]
fn the_file_graph_sees_a_circle_and_a_group() {
    // The check above must be able to fail: a known circle of harness's (#28, now
    // gone) written as two sources, and a grouped import.
    let outcome = named_paths(
        "use super::process::CliProcess;\nuse crate::{codex::protocol::Tokens, registry};",
        &["cli".to_owned(), "transcript".to_owned()],
    );
    let expected: Vec<Vec<String>> = [
        vec!["codex", "protocol", "Tokens"],
        vec!["registry"],
        vec!["cli", "process", "CliProcess"],
    ]
    .iter()
    .map(|path| path.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(outcome, expected);
}

#[test]
fn nothing_in_actors_names_the_runtime_facade() {
    // The facade is the top: public types belong in api.rs.
    for (module, uses) in file_graph("actors") {
        if module.first().map(String::as_str) == Some("runtime") {
            continue;
        }
        assert!(
            !uses
                .iter()
                .any(|used| used.first().map(String::as_str) == Some("runtime")),
            "{} imports the runtime facade; public types belong in api.rs",
            module.join("/")
        );
    }
}

/// agno's run-event vocabulary (its wire names and warning types, and the `"event"` key
/// of its event objects): only `gateway/` renders it.
const AGNO_WIRE_WORDS: [&str; 7] = [
    "\"RunContent\"",
    "\"RunError\"",
    "\"CustomEvent\"",
    "\"session_fallback\"",
    "\"attachments_changed\"",
    "\"retry\"",
    "\"event\":",
];

#[test]
fn only_the_gateway_knows_agnos_event_json() {
    let mut files = Vec::new();
    for krate in ["journal", "projections", "harness", "actors"] {
        rust_files(&root().join(krate).join("src"), &mut files);
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    let mut violations = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        for (number, line) in text.lines().enumerate() {
            for word in AGNO_WIRE_WORDS {
                if line.contains(word) {
                    violations.push(format!(
                        "{}:{}: {word}",
                        path.strip_prefix(root()).unwrap().display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}

/// agno's `RunMetrics` keys (those no provider's usage also uses): only `gateway/`
/// renders a run's metrics in agno's shape; the journal keeps them typed.
const AGNO_METRIC_KEYS: [&str; 9] = [
    "\"details\"",
    "\"time_to_first_token\"",
    "\"additional_metrics\"",
    "\"total_tokens\"",
    "\"cache_read_tokens\"",
    "\"cache_write_tokens\"",
    "\"reasoning_tokens\"",
    "\"duration\"",
    "\"cost\"",
];

/// The frozen reader of record format 3, whose metrics text was in agno's shape.
const FORMAT_3: &str = "journal/src/format3.rs";

#[test]
fn only_the_gateway_knows_agnos_metric_keys_28() {
    let mut files = Vec::new();
    for krate in ["journal", "projections", "harness", "actors"] {
        rust_files(&root().join(krate).join("src"), &mut files);
    }
    let mut violations = Vec::new();
    let mut format3_reads_them = false;
    for path in &files {
        let relative = path.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(path).unwrap();
        for (number, line) in text.lines().enumerate() {
            for key in AGNO_METRIC_KEYS.iter().filter(|key| line.contains(**key)) {
                if relative == FORMAT_3 {
                    format3_reads_them = true;
                } else {
                    violations.push(format!("{relative}:{}: {key}", number + 1));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
    // The check sees the keys where they are (the frozen format-3 reader, and the
    // gateway's rendering).
    assert!(
        format3_reads_them,
        "{FORMAT_3} no longer reads format 3's metrics"
    );
    let rendering = std::fs::read_to_string(root().join("gateway/src/wire/metrics.rs")).unwrap();
    assert!(AGNO_METRIC_KEYS.iter().all(|key| rendering.contains(key)));
}

/// The one place allowed `unsafe`: the allocator's collect, one call.
const UNSAFE_ALLOWED: &str = "gateway/src/allocator.rs";
/// What marks unsafe code (spelled apart, so that this file does not match itself).
const UNSAFE_MARKS: [&str; 5] = [
    concat!("unsafe", " {"),
    concat!("unsafe", " fn"),
    concat!("unsafe", " impl"),
    concat!("unsafe", " extern"),
    concat!("allow(", "unsafe_code"),
];

#[test]
fn only_the_allocators_collect_is_unsafe() {
    let mut files = Vec::new();
    for krate in CRATES {
        rust_files(&root().join(krate), &mut files);
    }
    let mut found = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(root()).unwrap().display().to_string();
        if relative.contains("/target/") {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if UNSAFE_MARKS.iter().any(|mark| code.contains(mark)) {
                found.push(format!("{relative}:{}", number + 1));
            }
        }
    }
    let elsewhere: Vec<&String> = found
        .iter()
        .filter(|at| !at.starts_with(UNSAFE_ALLOWED))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "unsafe outside {UNSAFE_ALLOWED}: {elsewhere:?}"
    );
    // `#[allow(unsafe_code)]` and the block it allows.
    assert_eq!(found.len(), 2, "{found:?}");
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(concat!("unsafe", "_code = \"deny\"")),
        "the workspace denies unsafe code"
    );
}

/// The production crates, whose rooms stay small.
const PRODUCTION: [&str; 5] = ["journal", "projections", "harness", "actors", "gateway"];

/// Production source below its unit tests (`#[cfg(test)] mod …` to the end of the file).
fn production_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let end = lines
        .windows(2)
        .position(|pair| pair[0].starts_with("#[cfg(test)]") && pair[1].starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// A file past ~600 lines usually holds two concepts (issue 28); agno's answer shapes
/// (`wire/dto.rs`, types only) may be longer.
#[test]
fn no_production_file_is_over_600_lines_28() {
    let mut files = Vec::new();
    for krate in PRODUCTION {
        rust_files(&root().join(krate).join("src"), &mut files);
    }
    let over: Vec<String> = files
        .iter()
        .filter(|path| !path.ends_with("gateway/src/wire/dto.rs"))
        .filter_map(|path| {
            let lines = production_lines(path).len();
            (lines > 600)
                .then(|| format!("{} ({lines})", path.strip_prefix(root()).unwrap().display()))
        })
        .collect();
    assert!(over.is_empty(), "production files over 600 lines: {over:?}");
}

/// The functions over 80 lines that issue 28 left, with their length then: none may
/// grow, and no other function may pass 80 lines.
const LONG_FUNCTIONS: [(&str, &str, usize); 8] = [
    ("journal/src/pg/append.rs", "append_one", 164),
    ("gateway/src/timeline.rs", "describe", 153),
    ("journal/src/sled/verify.rs", "verify", 152),
    ("gateway/src/telemetry.rs", "apply", 145),
    ("actors/src/run/mod.rs", "drive", 130),
    ("gateway/src/api/form.rs", "read", 126),
    ("gateway/src/serve.rs", "serve", 111),
    ("journal/src/structure.rs", "run_rules", 84),
];

/// Each function of a file with its length in lines, from its `fn` line to the closing
/// brace at its indentation.
fn function_lengths(lines: &[String]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = line.len() - code.len();
        let after_vis = code
            .strip_prefix("pub ")
            .or_else(|| code.strip_prefix("pub(crate) "))
            .or_else(|| code.strip_prefix("pub(super) "))
            .unwrap_or(code);
        let after_async = after_vis.strip_prefix("async ").unwrap_or(after_vis);
        let Some(rest) = after_async.strip_prefix("fn ") else {
            continue;
        };
        if line.trim_end().ends_with(';') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let closing = format!("{}}}", " ".repeat(indent));
        if let Some(end) = lines[start..].iter().position(|l| l.trim_end() == closing) {
            found.push((name, end + 1));
        }
    }
    found
}

#[test]
fn no_function_grows_past_80_lines_28() {
    let mut files = Vec::new();
    for krate in PRODUCTION {
        rust_files(&root().join(krate).join("src"), &mut files);
    }
    let mut long = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(root()).unwrap().display().to_string();
        for (name, length) in function_lengths(&production_lines(path)) {
            if length <= 80 {
                continue;
            }
            let allowed = LONG_FUNCTIONS
                .iter()
                .find(|(file, function, _)| *file == relative && *function == name)
                .map(|(_, _, then)| *then);
            if allowed.is_none_or(|then| length > then) {
                long.push(format!("{relative}: {name} ({length} lines)"));
            }
        }
    }
    assert!(long.is_empty(), "functions over 80 lines: {long:?}");
}

#[test]
fn the_function_counter_sees_a_long_function() {
    let mut lines = vec!["    pub(super) async fn long(".to_owned()];
    lines.extend((0..90).map(|_| "        step();".to_owned()));
    lines.push("    }".to_owned());
    assert_eq!(function_lengths(&lines), [("long".to_owned(), 92)]);
}

/// The routes the router serves, as (method, path with `{x}` for each parameter), read
/// from `gateway/src/api/mod.rs`.
fn served_routes() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("gateway/src/api/mod.rs")).unwrap();
    let start = text.find("pub fn router(").expect("the router");
    let end = start + text[start..].find(".fallback(").expect("its fallback");
    let mut routes = Vec::new();
    for chunk in text[start..end].split(".route(").skip(1) {
        let path = chunk.split('"').nth(1).expect("a quoted path");
        let path: String = path
            .split('/')
            .map(|segment| {
                if segment.starts_with('{') {
                    "x"
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        for method in ["get", "post", "delete", "put", "patch"] {
            let called = chunk.match_indices(&format!("{method}(")).any(|(at, _)| {
                at == 0
                    || !chunk.as_bytes()[at - 1].is_ascii_alphanumeric()
                        && chunk.as_bytes()[at - 1] != b'_'
            });
            if called {
                routes.push((method.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    routes
}

/// Authorization (issue 31): every route but `/health` and the console's files has a
/// row in the scopes table, with and without per-user isolation, so no route is served
/// to any valid token by omission.
#[test]
fn every_served_route_has_a_scope_31() {
    use turnstile_gateway::auth::scopes::requirement;
    let routes = served_routes();
    assert!(routes.len() >= 20, "the router was not read: {routes:?}");
    let open = ["/health", "/", "/ui", "/ui/", "/ui/app.js", "/ui/app.css"];
    let missing: Vec<String> = routes
        .iter()
        .filter(|(_, path)| !open.contains(&path.as_str()))
        .filter(|(method, path)| {
            let method: hyper::Method = method.parse().unwrap();
            requirement(&method, path, false).is_none()
                || requirement(&method, path, true).is_none()
        })
        .map(|(method, path)| format!("{method} {path}"))
        .collect();
    assert!(missing.is_empty(), "routes without a scope: {missing:?}");
}

/// Authorization (issue 31): no read bypasses the scope. Every handler of the routes
/// that read or drive sessions and runs takes the [`Caller`], whose owner it must
/// respect; the one exception is named here (runtime-wide counters, the admin's under
/// isolation).
#[test]
fn every_session_handler_takes_the_caller_31() {
    let exempt = ["prometheus"];
    let mut without = Vec::new();
    for file in ["runs.rs", "sessions.rs", "resume.rs", "metrics.rs"] {
        let text = std::fs::read_to_string(root().join("gateway/src/api").join(file)).unwrap();
        for chunk in text.split("async fn ").skip(1) {
            let name = chunk.split('(').next().unwrap().trim().to_owned();
            let signature = chunk.split('{').next().unwrap();
            if signature.contains("State<AppState>")
                && !signature.contains("caller: Caller")
                && !signature.contains("caller: crate::auth::Caller")
                && !exempt.contains(&name.as_str())
            {
                without.push(format!("{file}: {name}"));
            }
        }
    }
    assert!(
        without.is_empty(),
        "handlers that do not take the caller: {without:?}"
    );
}
