//! Runs the fake Anthropic Messages API of the tests on loopback until Ctrl-C, printing
//! its address and each request's prompt: for trying the `claude` CLI by hand and for
//! the latency numbers of `docs/PERFORMANCE.md`.

fn main() {
    let fake = turnstile_tests::fake_anthropic::FakeAnthropic::start();
    println!("{}", fake.base_url);
    let mut seen = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let requests = fake.requests();
        for request in &requests[seen..] {
            eprintln!("{} {}", request.path, request.body);
        }
        seen = requests.len();
    }
}
