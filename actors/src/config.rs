//! Plain-data configuration: batching and retries.

use std::time::Duration;

/// The default most actions per sink call.
pub const DEFAULT_MAX_ACTIONS: usize = 4096;
/// The default time a sink waits for more actions before a call, when other
/// components are still producing some.
pub const DEFAULT_LINGER: Duration = Duration::from_millis(100);
/// The default number of attempts of a failing sink call for one component.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// The default delay before the first retry.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(50);
/// The default longest delay between retries.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The default limit on one sink call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// The default most components running at once.
pub const DEFAULT_MAX_INFLIGHT_COMPONENTS: usize = 4096;
/// The default number of runs in a row a component fails before it is
/// reported as quarantined.
pub const DEFAULT_QUARANTINE_AFTER: u32 = 3;
/// The default number of declarations a running component sends to the
/// reconcilers at once.
pub const DEFAULT_RECONCILE_CHUNK: usize = 4096;

/// How actions are gathered into sink calls.
///
/// A sink is called when it has `max_actions` actions, when `linger` has
/// passed since the first pending one, or at once when no component is still
/// running or reconciling (nothing more can come).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPolicy {
    /// The most actions in one sink call.
    pub max_actions: usize,
    /// How long pending actions wait for more.
    pub linger: Duration,
}

impl Default for BatchPolicy {
    fn default() -> Self {
        Self {
            max_actions: DEFAULT_MAX_ACTIONS,
            linger: DEFAULT_LINGER,
        }
    }
}

/// How failed sink calls are retried.
///
/// A failed call carrying several components' actions is split in halves
/// along component boundaries and each half is tried again at once; a call
/// carrying one component's actions is retried after an exponential backoff
/// with jitter, up to `max_attempts` calls in all, unless the error is
/// permanent ([`Error::is_retriable`](crate::Error::is_retriable) is false):
/// then it is made once. While a component waits for its backoff, other
/// components' calls to the same sink go on; only calls on the same keys
/// wait, so that one key's actions are applied in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls of one component's actions before it fails (at least 1).
    pub max_attempts: u32,
    /// The delay before the first retry.
    pub initial_backoff: Duration,
    /// The longest delay between retries.
    pub max_backoff: Duration,
    /// A call that takes longer is cancelled and fails (retriably); `None`
    /// waits forever. It is reported failed, and its keys called again,
    /// only once it has stopped: its future is dropped at its next
    /// `.await`, but code blocking inside it holds them until it returns. A
    /// sink that hands work to other threads must, likewise, not let its
    /// future end before that work (weir's directory sinks wait for their
    /// blocking file-system work even when their future is dropped).
    pub call_timeout: Option<Duration>,
}

/// `first` doubled `doublings` times (at most 20), and capped at `max`:
/// the delay of an exponential backoff, before any jitter.
pub(crate) fn doubled(first: Duration, max: Duration, doublings: u32) -> Duration {
    first.saturating_mul(1u32 << doublings.min(20)).min(max)
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            call_timeout: Some(DEFAULT_CALL_TIMEOUT),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_retry_policy_survives_two_consecutive_failures() {
        assert!(RetryPolicy::default().max_attempts >= 3);
    }

    #[test]
    fn a_doubled_delay_doubles_from_the_first_and_stops_at_the_cap() {
        let ms = Duration::from_millis;
        let delays: Vec<_> = (0..5).map(|n| doubled(ms(50), ms(500), n)).collect();
        assert_eq!(delays, [ms(50), ms(100), ms(200), ms(400), ms(500)]);
        assert_eq!(doubled(ms(50), Duration::MAX, 40), ms(50) * (1 << 20));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(400),
            call_timeout: None,
        };
        for _ in 0..50 {
            let first = crate::actors::sink::backoff(&p, 1);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let late = crate::actors::sink::backoff(&p, 8);
            assert!(late >= Duration::from_millis(200) && late <= Duration::from_millis(400));
        }
    }
}
