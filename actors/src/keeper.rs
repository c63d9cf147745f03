//! The keeper: one thread on which session actors make their long-lived writes (the
//! stored read models in sled, the directory's entry), waiting for each.
//!
//! Why a thread of its own: an allocator keeps memory per thread, in pages of one size
//! class. A session actor's own memory lives on its arbiter's thread and is freed when
//! it passivates; memory that outlives it (sled's copy of a stored form, the directory's
//! entry) allocated on the same thread would share its pages and keep them from being
//! returned. Made here, it does not: 100,000 sessions passivated together left 2.7-3.2
//! KiB of RSS each with these writes on the arbiters, 2.1-2.5 KiB with them here
//! (`docs/PERFORMANCE.md`, "Memory per session").
//! The actor waits for the job, so a read after a turn sees its writes, as before.

use std::sync::Mutex;
use std::sync::mpsc::{Sender, sync_channel};

type Job = Box<dyn FnOnce() + Send>;

/// The keeper thread's job queue.
pub(crate) struct Keeper {
    jobs: Mutex<Option<Sender<Job>>>,
}

impl Keeper {
    /// Starts the thread; without one (it could not be spawned) jobs run in place.
    pub(crate) fn start() -> Keeper {
        let (sender, receiver) = std::sync::mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("turnstile-keeper".into())
            .spawn(move || {
                while let Ok(job) = receiver.recv() {
                    job();
                }
            });
        if let Err(error) = &spawned {
            tracing::warn!(%error, "keeper thread not started: stored forms are written in place");
        }
        Keeper {
            jobs: Mutex::new(spawned.ok().map(|_| sender)),
        }
    }

    /// The job queue's sender, unless the thread is gone.
    fn sender(&self) -> Option<Sender<Job>> {
        self.jobs.lock().ok().and_then(|jobs| jobs.clone())
    }

    /// Queues `job` on the keeper thread without waiting (nothing if the thread is gone).
    pub(crate) fn send(&self, job: impl FnOnce() + Send + 'static) {
        if let Some(sender) = self.sender() {
            let _ = sender.send(Box::new(job));
        }
    }

    /// Runs `job` on the keeper thread and waits until it has run (in place if the
    /// thread is gone).
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) {
        let Some(sender) = self.sender() else {
            return job();
        };
        let (done, finished) = sync_channel::<()>(1);
        let sent = sender.send(Box::new(move || {
            job();
            let _ = done.send(());
        }));
        match sent {
            Ok(()) => {
                if finished.recv().is_err() {
                    tracing::error!("a keeper job stopped before its end");
                }
            }
            // The thread is gone: the job runs here.
            Err(returned) => (returned.0)(),
        }
    }
}
