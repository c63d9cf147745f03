//! Remakes the console's screenshots in `docs/console/` (or the directory given, taken
//! from the repository's root): `cargo run -p turnstile-tests --example screenshots`.
//! It runs the console's own checks in headless Chromium while it takes them, so it
//! needs what the console test needs (Node, Chromium, playwright-core).

fn main() {
    if turnstile_tests::console::tools().is_none() {
        std::process::exit(1);
    }
    let shots = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/console".into());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    turnstile_tests::console::console_run(&root.join(&shots));
    println!("screenshots written to {shots}");
}
