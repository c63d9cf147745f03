//! `workspace_ignore`: which paths of a workspace are neither captured nor removed, as
//! a small subset of gitignore's patterns: `*` and `?` within a path segment; a
//! trailing `/` matches directories only; a pattern with a `/` elsewhere is anchored at
//! the workspace's root and matched against the whole relative path, one without is
//! matched against each entry's name at any depth (`node_modules/` anywhere).

/// The ignore rules of one agent.
#[derive(Debug, Clone, Default)]
pub struct Ignore {
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    glob: String,
    directories_only: bool,
    anchored: bool,
}

/// The default of `workspace_ignore` (spec `workspaces.md`).
pub const DEFAULT_IGNORE: [&str; 5] = [
    "node_modules/",
    "target/",
    ".venv/",
    "__pycache__/",
    ".turnstile/uploads/",
];

impl Ignore {
    /// The rules of these patterns; an empty one is refused, naming it.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Ignore, String> {
        let patterns = patterns
            .iter()
            .map(|pattern| {
                let text = pattern.as_ref().trim();
                let directories_only = text.ends_with('/');
                let glob = text.trim_end_matches('/').trim_start_matches('/');
                if glob.is_empty() {
                    return Err(format!("workspace_ignore: {text:?} matches nothing"));
                }
                Ok(Pattern {
                    anchored: glob.contains('/') || text.starts_with('/'),
                    glob: glob.to_owned(),
                    directories_only,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Ignore { patterns })
    }

    /// Whether `path` (relative, `/`-separated) is ignored; `is_dir` for a directory.
    pub fn ignored(&self, path: &str, is_dir: bool) -> bool {
        let name = path.rsplit('/').next().unwrap_or(path);
        self.patterns.iter().any(|pattern| {
            (is_dir || !pattern.directories_only)
                && if pattern.anchored {
                    matches(&pattern.glob, path)
                } else {
                    matches(&pattern.glob, name)
                }
        })
    }
}

/// `glob` against `text`: `*` any run and `?` any one character but `/`.
fn matches(glob: &str, text: &str) -> bool {
    let (glob, text): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    // Iterative matching with one backtrack point for the last `*`.
    let (mut g, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if g < glob.len() && (glob[g] == text[t] || glob[g] == '?' && text[t] != '/') {
            g += 1;
            t += 1;
        } else if g < glob.len() && glob[g] == '*' {
            star = Some((g, t));
            g += 1;
        } else if let Some((star_g, star_t)) = star
            && text[star_t] != '/'
        {
            g = star_g + 1;
            t = star_t + 1;
            star = Some((star_g, star_t + 1));
        } else {
            return false;
        }
    }
    glob[g..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_rules_and_globs() {
        let ignore = Ignore::new(&DEFAULT_IGNORE).unwrap();
        assert!(ignore.ignored("node_modules", true));
        assert!(ignore.ignored("web/node_modules", true));
        assert!(
            !ignore.ignored("node_modules", false),
            "a file of that name is kept"
        );
        assert!(ignore.ignored(".turnstile/uploads", true));
        assert!(
            !ignore.ignored("x/.turnstile/uploads", true),
            "anchored at the root"
        );
        assert!(!ignore.ignored("src/main.rs", false));
        let globs = Ignore::new(&["*.log", "build/*.o", "?.tmp"]).unwrap();
        assert!(globs.ignored("a/b/server.log", false));
        assert!(globs.ignored("build/x.o", false));
        assert!(!globs.ignored("build/sub/x.o", false), "* stops at /");
        assert!(globs.ignored("z.tmp", false));
        assert!(!globs.ignored("zz.tmp", false));
        assert!(Ignore::new(&["/"]).is_err());
    }
}
