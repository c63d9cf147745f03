//! Architecture invariants of `docs/ARCHITECTURE.md`, checked from the manifests and
//! sources so they cannot rot: the dependency direction between crates, the libraries
//! reserved to one crate, versions only in the workspace, and a `//!` doc atop every
//! Rust file.

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
const RESERVED: [(&str, &str); 4] = [
    ("sled", "journal"),
    ("bincode", "journal"),
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
