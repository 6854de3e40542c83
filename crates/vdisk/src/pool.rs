//! A fixed pool of I/O threads for the strips of a stripe.
//!
//! A stripe operation issues up to `k + m` drive I/Os that should run at the same time.
//! Spawning a thread per I/O costs more than a small NVMe read, so a process-wide pool of
//! [`POOL_THREADS`] threads (spawned on first use) runs them instead. [`run_all`] hands the
//! jobs to the pool, runs the first on the calling thread, and returns only after every job
//! finished, which is what makes lending borrowed data to the pool threads sound.
//!
//! The pool threads only ever run single I/O jobs, which never wait for other jobs; a
//! `run_all` issued from a pool thread runs its jobs inline, so the pool cannot deadlock
//! on itself.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Threads of the pool: enough for the strips of several stripes in flight at once. They
/// spend their time blocked in the kernel, so the count is not tied to CPU cores.
pub const POOL_THREADS: usize = 48;

type Task = Box<dyn FnOnce() + Send + 'static>;

struct Pool {
    tx: Mutex<Sender<Task>>,
}

thread_local! {
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = channel::<Task>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..POOL_THREADS {
            let rx: Arc<Mutex<Receiver<Task>>> = rx.clone();
            std::thread::Builder::new()
                .name(format!("vdisk-io-{i}"))
                .spawn(move || {
                    IN_POOL.with(|f| f.set(true));
                    loop {
                        let task = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        match task {
                            Ok(task) => task(),
                            Err(_) => return,
                        }
                    }
                })
                .expect("spawn vdisk I/O thread");
        }
        Pool { tx: Mutex::new(tx) }
    })
}

/// Counts outstanding jobs; shared by `Arc` so a finishing job never touches freed memory.
struct Latch {
    left: Mutex<usize>,
    done: Condvar,
}

/// A job of [`run_all`].
pub type Job<'a, T> = Box<dyn FnOnce() -> T + Send + 'a>;

type Outcome<T> = Mutex<Option<Result<T, Box<dyn Any + Send>>>>;

/// Runs `jobs` in parallel (the first on the calling thread) and returns their results in
/// order. A panic in a job is re-raised here once every job has finished.
pub fn run_all<'a, T: Send + 'a>(jobs: Vec<Job<'a, T>>) -> Vec<T> {
    if jobs.len() <= 1 || IN_POOL.with(Cell::get) {
        return jobs.into_iter().map(|j| j()).collect();
    }
    let outcomes: Vec<Outcome<T>> = (0..jobs.len()).map(|_| Mutex::new(None)).collect();
    let latch = Arc::new(Latch {
        left: Mutex::new(jobs.len() - 1),
        done: Condvar::new(),
    });
    let mut jobs = jobs.into_iter();
    let first = jobs.next().expect("at least two jobs");
    let through = crate::pdisk::WriteThrough::on();
    {
        let tx = pool().tx.lock().expect("pool sender");
        for (job, outcome) in jobs.zip(&outcomes[1..]) {
            let latch = latch.clone();
            let task = move || {
                let _through = crate::pdisk::WriteThrough::set(through);
                let r = catch_unwind(AssertUnwindSafe(job));
                *outcome.lock().expect("outcome lock") = Some(r);
                let mut left = latch.left.lock().expect("latch lock");
                *left -= 1;
                if *left == 0 {
                    latch.done.notify_all();
                }
            };
            let task: Box<dyn FnOnce() + Send + '_> = Box::new(task);
            // SAFETY: the task borrows `outcomes` and whatever the job borrows, all of
            // which outlive this call: we wait below until every task has run to
            // completion (the latch reaches zero) before returning or unwinding, and a
            // task no longer touches borrowed data once it has counted down.
            let task: Task =
                unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Task>(task) };
            tx.send(task).expect("pool threads alive");
        }
    }
    let first_result = catch_unwind(AssertUnwindSafe(first));
    let mut left = latch.left.lock().expect("latch lock");
    while *left > 0 {
        left = latch.done.wait(left).expect("latch wait");
    }
    drop(left);
    let mut results = Vec::with_capacity(outcomes.len());
    let mut panic = None;
    match first_result {
        Ok(r) => results.push(r),
        Err(p) => panic = Some(p),
    }
    for o in outcomes.into_iter().skip(1) {
        match o.into_inner().expect("outcome lock").expect("job ran") {
            Ok(r) => results.push(r),
            Err(p) => panic = panic.or(Some(p)),
        }
    }
    if let Some(p) = panic {
        resume_unwind(p);
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_in_order_and_borrows_work() {
        let data: Vec<u64> = (0..16).collect();
        let jobs: Vec<Job<'_, u64>> = data
            .iter()
            .map(|x| Box::new(move || x * 2) as Job<'_, u64>)
            .collect();
        assert_eq!(run_all(jobs), (0..16).map(|x| x * 2).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_job_is_reraised_after_all_finish() {
        let r = std::panic::catch_unwind(|| {
            let jobs: Vec<Job<'_, u32>> = (0..4u32)
                .map(|i| {
                    Box::new(move || {
                        assert_ne!(i, 2, "job 2 fails");
                        i
                    }) as Job<'_, u32>
                })
                .collect();
            run_all(jobs)
        });
        assert!(r.is_err());
    }
}
