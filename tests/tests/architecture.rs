//! Architecture invariants of `docs/ARCHITECTURE.md`, checked from the manifests and
//! sources so they cannot rot: the dependency direction between crates, the libraries
//! reserved to one crate, versions only in the workspace, a `//!` doc atop every
//! Rust file, `unsafe` in one place only, and fault injection in the tests only.

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

/// The modules of `actors/src` a module names through `crate::`.
fn crate_imports(text: &str, modules: &[String]) -> Vec<String> {
    let mut found: Vec<String> = text
        .match_indices("crate::")
        .filter_map(|(at, _)| {
            let rest = &text[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `use crate::{a::X, b::Y}` names several.
            if name.is_empty() && rest.starts_with('{') {
                return None;
            }
            modules.contains(&name).then_some(name)
        })
        .collect();
    for (at, _) in text.match_indices("crate::{") {
        let group = &text[at + "crate::{".len()..];
        let group = &group[..group.find("};").unwrap_or(group.len())];
        for part in group.split(',') {
            let name = part
                .trim()
                .split("::")
                .next()
                .unwrap_or_default()
                .to_owned();
            if modules.contains(&name) {
                found.push(name);
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn the_actors_modules_import_each_other_without_a_circle() {
    let dir = root().join("actors/src");
    let modules: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let module = name.strip_suffix(".rs")?;
            (module != "lib").then(|| module.to_owned())
        })
        .collect();
    assert!(modules.len() >= 6, "modules: {modules:?}");
    let graph: std::collections::BTreeMap<String, Vec<String>> = modules
        .iter()
        .map(|module| {
            let text = std::fs::read_to_string(dir.join(format!("{module}.rs"))).unwrap();
            let imports = crate_imports(&text, &modules)
                .into_iter()
                .filter(|name| name != module)
                .collect();
            (module.clone(), imports)
        })
        .collect();
    // Depth-first search; a module met again on the current path closes a circle.
    fn visit(
        module: &str,
        graph: &std::collections::BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| m == module) {
            let mut circle = path[start..].to_vec();
            circle.push(module.to_owned());
            return Some(circle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in &graph[module] {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    for module in graph.keys() {
        if let Some(circle) = visit(module, &graph, &mut Vec::new(), &mut done) {
            panic!("import circle in actors/: {}", circle.join(" -> "));
        }
    }
    // The facade is the top: nothing below it names it.
    for (module, imports) in &graph {
        assert!(
            !imports.contains(&"runtime".to_owned()),
            "{module} imports the runtime facade; public types belong in api.rs"
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
