//! Runs the fake OpenAI Responses API of the tests on loopback until Ctrl-C, printing
//! its base URL and each request's prompt: for trying the `codex` CLI by hand and for
//! the latency numbers of `docs/PERFORMANCE.md`.

fn main() {
    let fake = turnstile_tests::fake_openai::FakeOpenAi::start();
    println!("{}", fake.base_url);
    let mut seen = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let requests = fake.requests();
        for request in &requests[seen..] {
            eprintln!(
                "{} {:?} usage={:?}",
                request.path,
                request.prompt_text(),
                request.usage()
            );
        }
        seen = requests.len();
    }
}
