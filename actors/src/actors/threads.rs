//! How weir's own threads are scheduled: as batch work.
//!
//! The pipeline's threads (the reconciler shards, the sink actors' arbiter
//! and the ledger's thread) do throughput work handed to them by the
//! components on the user's runtime: a component sends its declarations
//! to a shard and its actions to a sink, and goes on with the next one.
//! Under Linux's default policy a thread woken that way preempts the one
//! that woke it whenever it has had less CPU time, which is most of the
//! time for a thread that sleeps between messages: each hand-off then
//! costs two context switches, and the runtime's worker loses its cache.
//! With many small components (a file, a row, a message each), sleeping,
//! waking and switching threads took a fifth of the CPU time of a first
//! run (`benches/PERFORMANCE.md`).
//!
//! So these threads run under `SCHED_BATCH`: a woken one never preempts a
//! running thread; it runs on an idle core at once, or when the running
//! thread's time slice ends or it sleeps. Their share of the CPU is the
//! same (their nice value is untouched); only wakeups stop preempting.
//! The user's runtime and its threads keep their own policy.
//!
//! Where the policy cannot be set (another system, a sandbox refusing
//! the call), the threads run as they are: it changes speed, never
//! behaviour.

/// Schedules the calling thread as batch work (see the module docs).
pub(crate) fn run_as_batch_work() {
    #[cfg(target_os = "linux")]
    if scheduler::set_self_policy(scheduler::Policy::Batch, 0).is_err() {
        tracing::debug!(
            thread = std::thread::current().name().unwrap_or("unnamed"),
            "cannot schedule weir's thread as batch work; it keeps the default policy"
        );
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::run_as_batch_work;

    #[test]
    fn a_thread_run_as_batch_work_has_the_batch_policy_and_others_keep_theirs() -> Result<(), String>
    {
        let policy = || {
            scheduler::get_self_policy()
                .map(|p| std::mem::discriminant(&p))
                .map_err(|()| "no policy".to_string())
        };
        let before = policy()?;
        let batch = std::thread::spawn(move || {
            run_as_batch_work();
            policy()
        })
        .join()
        .map_err(|_| "the thread panicked")??;
        assert_eq!(batch, std::mem::discriminant(&scheduler::Policy::Batch));
        // The policy is the calling thread's, not the process's.
        assert_eq!(policy()?, before);
        Ok(())
    }
}
