//! The `turnstile` binary: see `spec/cli.md`.

// The journal's committer and the run tasks allocate per event; mimalloc measured
// faster than the system allocator for that (docs/PERFORMANCE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    turnstile_gateway::allocator::ensure_options();
    turnstile_gateway::cli::main()
}
