//! What a model's timer task sleeps on until its policy's next time, and the `direct` sequence
//! strategy on its queue delay. tokio's timers count whole milliseconds and round a deadline up
//! to the next one: a 1 ms `max_queue_delay` was waited 1-2 ms, and a 100 µs one just as long.
//! A policy whose waits are to be kept exactly
//! ([`BatchPolicy::exact_waits`](super::policy::BatchPolicy::exact_waits): each of sheaf's own)
//! and the sequence batcher's delay get, on Linux, a timerfd in tokio's reactor, which ends a
//! wait within microseconds of its time. Other policies, other systems, and a timer for which no
//! timerfd can be made use tokio's timer.

use tokio::time::Instant;

/// One model's timer, armed again for each wait.
pub(crate) struct Timer {
    #[cfg(target_os = "linux")]
    fd: Option<tokio_timerfd::Delay>,
}

impl Timer {
    /// A timer that keeps its times to the microsecond where it can when `exact`.
    pub(crate) fn new(exact: bool) -> Timer {
        #[cfg(not(target_os = "linux"))]
        let _ = exact;
        Timer {
            #[cfg(target_os = "linux")]
            fd: match exact.then(|| tokio_timerfd::Delay::new(std::time::Instant::now())) {
                None => None,
                Some(Ok(delay)) => Some(delay),
                Some(Err(e)) => {
                    tracing::warn!(
                        error = %e,
                        "no timerfd for a batching timer; delays are waited in whole milliseconds"
                    );
                    None
                }
            },
        }
    }

    /// Sleeps until `at`, or forever when there is nothing to wake for.
    pub(crate) async fn until(&mut self, at: Option<Instant>) {
        let Some(at) = at else {
            return std::future::pending().await;
        };
        #[cfg(target_os = "linux")]
        if let Some(delay) = &mut self.fd {
            delay.reset(at.into_std());
            if delay.await.is_ok() {
                return;
            }
            self.fd = None;
        }
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Each wait ends at or after its time, on the timerfd where there is one, and a wait
    /// abandoned for another (the task woke for something else) does not hold back the next:
    /// the timer is armed again for the new time. How close to its time a wait ends is measured
    /// by the stage statistics, not here.
    #[tokio::test]
    async fn wakes_at_its_time_and_again_after_an_abandoned_wait() {
        let mut timer = Timer::new(true);
        #[cfg(target_os = "linux")]
        assert!(timer.fd.is_some(), "no timerfd on Linux");
        assert!(!timer_has_fd(&Timer::new(false)));
        for _ in 0..20 {
            let at = Instant::now() + Duration::from_micros(200);
            timer.until(Some(at)).await;
            assert!(Instant::now() >= at, "woke before the time asked");
        }
        // Past times end at once.
        timer.until(Some(Instant::now())).await;
        // A far wait abandoned, then a near one.
        tokio::select! {
            () = timer.until(Some(Instant::now() + Duration::from_secs(600))) => {
                panic!("a ten-minute wait ended")
            }
            () = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
        let at = Instant::now() + Duration::from_micros(300);
        let ended = tokio::time::timeout(Duration::from_secs(60), timer.until(Some(at))).await;
        assert!(ended.is_ok(), "the wait after an abandoned one never ended");
        assert!(Instant::now() >= at);
    }

    fn timer_has_fd(timer: &Timer) -> bool {
        #[cfg(target_os = "linux")]
        return timer.fd.is_some();
        #[cfg(not(target_os = "linux"))]
        false
    }
}
