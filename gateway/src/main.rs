//! The `turnstile` binary: see `spec/cli.md`.

fn main() -> std::process::ExitCode {
    turnstile_gateway::cli::main()
}
