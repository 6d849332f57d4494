//! Rounds in lockstep: the main thread opens a round, every client runs it and reports back,
//! and only then are the daemon's gauges and memory sampled, at a moment when no client holds
//! a channel.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    /// The round open now; 0 while the clients connect.
    round: u32,
    /// Clients done with it.
    finished: usize,
    stop: bool,
}

#[derive(Default)]
pub struct Gate {
    state: Mutex<State>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Clients record their failures instead of panicking, so a poisoned lock is a bug here.
        self.state.lock().expect("gate lock")
    }

    /// For a client: waits for the round after `last`; `None` once the run is over.
    pub fn next_round(&self, last: u32) -> Option<u32> {
        let mut state = self.lock();
        loop {
            if state.stop {
                return None;
            }
            if state.round > last {
                return Some(state.round);
            }
            state = self.changed.wait(state).expect("gate lock");
        }
    }

    /// For a client: done with the open round.
    pub fn finish(&self) {
        self.lock().finished += 1;
        self.changed.notify_all();
    }

    /// Opens `round` to every client.
    pub fn open(&self, round: u32) {
        let mut state = self.lock();
        state.round = round;
        state.finished = 0;
        drop(state);
        self.changed.notify_all();
    }

    /// Ends the run: clients waiting for a round return.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_all();
    }

    /// Waits until `clients` have finished the open round, calling `tick` every `period`
    /// meanwhile; false if `timeout` ran out first.
    pub fn wait_finished(&self, clients: usize, timeout: Duration, period: Duration, mut tick: impl FnMut()) -> bool {
        let deadline = Instant::now() + timeout;
        let mut next_tick = Instant::now() + period;
        loop {
            let state = self.lock();
            if state.finished >= clients {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if now >= next_tick {
                drop(state);
                tick();
                next_tick = Instant::now() + period;
                continue;
            }
            // Woken by every client that finishes; the tick keeps its own pace.
            drop(self.changed.wait_timeout(state, next_tick - now).expect("gate lock"));
        }
    }
}
